//! The daemon: the node's shared state, its background tasks (drain watcher, prober, rejoin
//! tracker), a listener per bound socket ([`listener::run`]), and graceful shutdown.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::drain::audit;
use crate::drain::file::DrainFile;
use crate::drain::record::DrainState;
use crate::drain::watch::{Drains, Watcher};
use crate::health::decision::{Decision, Rules};
use crate::health::weight::{Rejoin, Tracker};
use crate::puppet::client::ProbeTarget;
use crate::puppet::probe::{self, Prober};
use crate::puppet::report::ProbeReport;
use crate::puppet::{code, expiry};
use crate::reading;
use crate::responder::heartbeat::{Beat, Progress};
use crate::responder::listener::{self, Guard, closed};
use crate::responder::node::{Feeds, Node};
use crate::responder::pollers::Via;
use crate::responder::verdict_log::VerdictLog;
use crate::responder::{key_reload, puppet_files, ramp_record};
use crate::settings::lb_proof::LbProof;
use crate::settings::{Daemon, Settings};

/// The bound listeners: HTTP checks, and HAProxy agent checks.
pub struct Listeners {
    /// `--listen`, or systemd's sockets.
    pub http: Vec<std::net::TcpListener>,
    /// `--agent-listen`: bound by the daemon itself, also under socket activation.
    pub agent: Vec<std::net::TcpListener>,
}

/// Runs the daemon (`daemon`: its own settings among `settings`) on already-bound listeners
/// until `shutdown` resolves. `ready` is called once every listener accepts (the systemd
/// notification goes there) with what the watchdog's pings stand for; `reload` (SIGHUP)
/// re-reads the certificates, the drain record and the key file.
pub async fn serve(
    settings: &Settings,
    daemon: &Daemon,
    proof: LbProof,
    listeners: Listeners,
    reload: watch::Receiver<()>,
    ready: impl FnOnce(Progress),
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let interval = daemon.interval;
    let timeout = settings.given.puppet.timeout;
    let (stop, stopped) = watch::channel(());
    let mut tasks = Tasks {
        set: JoinSet::new(),
        stopped: stopped.clone(),
    };
    let (publish, latest) = watch::channel(None);
    let drain_file = DrainFile::new(&settings.given.state_dir);
    let (watcher, publish_drain, drains) = first_look(&drain_file).await;
    let rules = Rules {
        // A probe lands at least every interval + timeout; allow one missed round.
        stale_after: 2 * (interval + timeout),
        drained_status: daemon.drained.drained_status,
        slow_start: daemon.slow_start,
        agent_check: !daemon.agent_listen.is_empty(),
    };
    let (publish_rejoin, rejoin) = watch::channel(Rejoin::Steady);
    log_proof(daemon, &proof);
    let audited = drains.clone();
    let feeds = Feeds {
        drain: drains,
        latest,
        rejoin,
    };
    // Where Puppet Server listens, followed when its own files say it (puppet_files).
    let (moves, address) = watch::channel(settings.puppet_addr.value);
    let puppet = Some(address.clone());
    let node = Arc::new(Node::new(feeds, rules, proof, &drain_file, puppet, true));
    let beats = listen(&mut tasks, listeners, &node, daemon)?;
    let mut target = ProbeTarget::of(settings);
    target.addr = address;
    let prober = Prober::new(target);
    let drain_path = watcher.file().path().display().to_string();
    tracing::info!(
        endpoint = %prober.endpoint(),
        puppet_addr = %settings.puppet_addr.value,
        interval_ms = interval.as_millis() as u64,
        timeout_ms = timeout.as_millis() as u64,
        drain_file = %drain_path,
        "probing Puppet Server"
    );
    let directory = watcher.directory();
    // What changes on disk while the daemon runs: the load balancers' key file, read again at
    // each reload, and Puppet's own files.
    let (keyed, rereads, owned) = (Arc::clone(&node), reload.clone(), daemon.clone());
    tasks.spawn(|stop| key_reload::follow(keyed, owned, rereads, stop));
    let (changed, reports) = (puppet_files::changes(settings), node.feeds.latest.clone());
    let (puppet, rereads) = (settings.clone(), reload.clone());
    tasks.spawn(|stop| puppet_files::follow(puppet, moves, reports, rereads, changed, stop));
    let reread = reload.clone();
    tasks.spawn(|stop| crate::drain::watch::run(watcher, publish_drain, reread, stop));
    if let Some(metrics) = &node.metrics {
        let counts = Arc::clone(&metrics.drain_events);
        tasks.spawn(|stop| audit::run(drain_file, audited, directory, counts, stop));
        read(&mut tasks, settings, daemon, &node, &prober);
    }
    let tracked = Arc::clone(&node);
    let state_dir = settings.given.state_dir.clone();
    tasks.spawn(|stop| track_rejoin(tracked, publish_rejoin, state_dir, stop));
    // What the prober's every report goes through: the metrics count it.
    let counted = Arc::clone(&node);
    let observed = move |report: &ProbeReport| {
        if let Some(metrics) = &counted.metrics {
            metrics.probed(report);
        }
    };
    let progress = Progress {
        listeners: beats,
        latest: node.feeds.latest.clone(),
        since: Instant::now(),
        probe_bound: 2 * rules.stale_after,
    };
    // A test seam (docs/testing.md): a prober that wedges after its first probe, as a bug
    // would leave it, for the watchdog's tests.
    let interval = std::env::var_os("TEST_PMCHECK_WEDGE_PROBER")
        .map_or(interval, |_| Duration::from_secs(365 * 86_400));
    tasks.spawn(|stop| probe::run(prober, interval, publish, reload, observed, stop));
    ready(progress);
    shutdown.await;
    tracing::info!("shutting down");
    drop(stop);
    while tasks.set.join_next().await.is_some() {}
    Ok(())
}

/// Resolves when the daemon stops: what every background task is handed.
pub(crate) type Stop = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The daemon's tasks, each of one shape: given [`Stop`], it runs until that resolves.
struct Tasks {
    set: JoinSet<()>,
    stopped: watch::Receiver<()>,
}

impl Tasks {
    /// Starts the task `start` makes with the daemon's stop.
    fn spawn<F>(&mut self, start: impl FnOnce(Stop) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.set
            .spawn(start(Box::pin(closed(self.stopped.clone()))));
    }
}

/// Says how load balancers prove their polls, or that nothing can.
fn log_proof(daemon: &Daemon, proof: &LbProof) {
    if let Some(file) = &daemon.lb_key_file {
        // A file that cannot be used was said already, and proves nothing.
        if proof.answer().is_some_and(|a| a.problem.is_some()) {
            return;
        }
        tracing::info!(
            lb_key_file = %file.display(),
            "load balancers prove their polls with a key"
        );
    } else if !daemon.lb_address.is_empty() {
        let nets: Vec<_> = (daemon.lb_address.iter())
            .map(ToString::to_string)
            .collect();
        tracing::info!(
            lb_address = %nets.join(","),
            "polls from these addresses count as a load balancer's (--lb-address; --lb-key-file is stronger)"
        );
    } else {
        tracing::warn!(
            "no --lb-key-file nor --lb-address: no poll counts as a load balancer's word, so --wait and cycle wait out HAProxy's checks by time and the last-server guard is off"
        );
    }
}

/// A listener per bound socket ([`listener::run`]), all behind one guard (`--allow`, the
/// connection limits); each one's address and beat.
fn listen(
    tasks: &mut Tasks,
    listeners: Listeners,
    node: &Arc<Node>,
    daemon: &Daemon,
) -> io::Result<Vec<(String, Arc<Beat>)>> {
    let mut beats = Vec::new();
    let limits = daemon.limits().fit_descriptors();
    let guard = Arc::new(Guard::new(daemon.allow.clone(), limits));
    let kinds = (listeners.http.into_iter().map(|l| (Via::Http, l)))
        .chain(listeners.agent.into_iter().map(|l| (Via::Agent, l)));
    for (kind, listener) in kinds {
        let listener = TcpListener::from_std(listener)?;
        let address = listener.local_addr()?;
        match kind {
            Via::Http => tracing::info!(%address, via = "http", "listening"),
            Via::Agent => tracing::info!(%address, via = "agent", "answering HAProxy agent checks"),
        }
        let beat = Beat::new();
        beats.push((address.to_string(), Arc::clone(&beat)));
        let (node, guard, stopped) = (Arc::clone(node), Arc::clone(&guard), tasks.stopped.clone());
        // It stops itself, and gives the polls in flight a moment.
        tasks.spawn(|_| listener::run(kind, listener, node, guard, stopped, beat));
    }
    if !guard.allow.is_empty() {
        let nets: Vec<_> = guard.allow.iter().map(ToString::to_string).collect();
        tracing::info!(allow = %nets.join(","), "accepting polls only from these networks");
    }
    tracing::debug!(
        total = limits.total,
        per_source = limits.per_source,
        "connection limits"
    );
    Ok(beats)
}

/// The slow readers: the certificates' dates, and the deploy records with file sync (asked
/// with the prober's client).
fn read(tasks: &mut Tasks, settings: &Settings, daemon: &Daemon, node: &Node, prober: &Prober) {
    let files = expiry::Files {
        hostcert: settings.hostcert.value.clone(),
        localcacert: settings.localcacert.value.clone(),
        hostcrl: settings.hostcrl.value.clone(),
        last: Arc::default(),
    };
    let expiries = Arc::clone(&node.readings.expiries);
    let read_files = async move || {
        let files = files.clone();
        reading::off_workers(move || files.read_if_changed()).await
    };
    tasks.spawn(|stop| reading::refresh(expiry::REFRESH, read_files, expiries, stop));
    let environments = code::Environments {
        environmentpath: settings.environmentpath.value.clone(),
        names: daemon.code_environment.clone(),
    };
    let mut code = code::Reader::new(environments, prober.client());
    let latest = Arc::clone(&node.readings.code);
    tasks.spawn(|stop| {
        reading::refresh(code::REFRESH, async move || code.read().await, latest, stop)
    });
}

/// Prepares the state directory and looks at the drain record once, before the first answer:
/// a drained node never answers from a default.
async fn first_look(drain_file: &DrainFile) -> (Watcher, watch::Sender<Arc<DrainState>>, Drains) {
    // On the blocking pool with the drain record's deadline: the state directory may sit on a
    // hung file system, and then the first look says so (503 UNKNOWN) instead of start-up waiting.
    let dir = drain_file.clone();
    let prepared = tokio::task::spawn_blocking(move || prepare_state_dir(&dir));
    let _ = tokio::time::timeout(crate::drain::watch::DEADLINE, prepared).await;
    let (publish, drains) = watch::channel(Arc::new(DrainState::NotDrained));
    let mut watcher = Watcher::new(drain_file.clone());
    if let Some(state) = watcher.look(true).await {
        publish.send_replace(Arc::new(state));
    }
    (watcher, publish, drains)
}

/// Creates a missing state directory when it may (a first `cargo build && pmcheck serve` has
/// no package to do it), and warns about one anybody may write: anybody could drain or undrain.
fn prepare_state_dir(file: &DrainFile) {
    let dir = file.dir();
    if !dir.exists() {
        match file.create_dir() {
            Ok(()) => {
                tracing::info!(state_dir = %dir.display(), "created the state directory")
            }
            Err(e) => tracing::warn!(
                state_dir = %dir.display(),
                error = %e,
                "cannot create the state directory; answering 503 until it exists"
            ),
        }
    }
    if let Some(warning) = crate::settings::state_dir_warning(dir) {
        tracing::warn!(state_dir = %dir.display(), %warning, "an unsafe state directory");
    }
}

/// Follows the verdict (on every probe, drain change, and when the latest report goes stale or
/// a ramp ends) so the weight knows when the node came back, and logs each change of it: also
/// the UNKNOWN of a probe report gone stale, which no probe report announces.
async fn track_rejoin(
    health: Arc<Node>,
    publish: watch::Sender<Rejoin>,
    state_dir: PathBuf,
    shutdown: impl Future<Output = ()>,
) {
    let over = health.rules.slow_start;
    let dir = state_dir.clone();
    let resumed =
        tokio::task::spawn_blocking(move || ramp_record::under_way(&dir, over, SystemTime::now()));
    let mut tracker = match resumed.await.ok().flatten() {
        Some(elapsed) => {
            tracing::info!(
                began_ms_ago = crate::text::ms(elapsed),
                began_ago = %crate::text::seconds(elapsed),
                "resuming the slow start a previous pmcheck began"
            );
            Tracker::resuming(over, elapsed, Instant::now())
        }
        None => Tracker::new(over),
    };
    let mut ramping = None;
    let mut log = VerdictLog::default();
    let mut drains = health.feeds.drain.clone();
    let mut latest = health.feeds.latest.clone();
    tokio::pin!(shutdown);
    loop {
        let moment = crate::responder::node::now();
        let now = moment.at;
        let drain = Arc::clone(&drains.borrow_and_update());
        let probe = latest.borrow_and_update().clone();
        let decision = Decision::decide(
            &drain,
            probe.as_deref(),
            Rejoin::Steady,
            moment,
            &health.rules,
        );
        let _ = log.note(&decision);
        let state = tracker.observe(decision.verdict, now);
        // Kept at each start and end of a ramp, and once at start-up: a record a daemon left
        // goes once this one finds the node steady or out.
        let ramps = matches!(state, Rejoin::Since(_));
        if ramping != Some(ramps) {
            let began = match state {
                Rejoin::Since(t) => SystemTime::now().checked_sub(now.saturating_duration_since(t)),
                Rejoin::Steady | Rejoin::Out => None,
            };
            ramp_record::keep(state_dir.clone(), began).await;
            ramping = Some(ramps);
        }
        publish.send_if_modified(|current| std::mem::replace(current, state) != state);
        let rest = next_change(probe.as_deref(), state, now, &health.rules);
        tokio::select! {
            Ok(()) = drains.changed() => {}
            Ok(()) = latest.changed() => {}
            () = tokio::time::sleep(rest) => {}
            () = &mut shutdown => return,
        }
    }
}

/// How long until the verdict can change with nothing new to read: the latest report goes
/// stale, or a ramp ends. A day when neither can happen (a timer, not a busy loop).
fn next_change(
    probe: Option<&ProbeReport>,
    state: Rejoin,
    now: Instant,
    rules: &Rules,
) -> Duration {
    const IDLE: Duration = Duration::from_secs(86_400);
    // Just past the instant: the rules compare with `>`.
    const PAST: Duration = Duration::from_millis(1);
    let stale = probe.and_then(|p| p.finished.checked_add(rules.stale_after));
    let ramped = match state {
        Rejoin::Since(back) => back.checked_add(rules.slow_start),
        _ => None,
    };
    (stale.into_iter().chain(ramped))
        // A report already stale changes nothing more until the next one.
        .filter(|&at| at > now)
        .map(|at| at - now + PAST)
        .min()
        .unwrap_or(IDLE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::puppet::report::ProbeOutcome;

    /// The verdict's tracker wakes only when the verdict can change by time alone.
    #[test]
    fn the_tracker_wakes_when_a_report_goes_stale_or_a_ramp_ends_and_not_before() {
        let rules = Rules {
            stale_after: Duration::from_secs(5),
            slow_start: Duration::from_secs(60),
            ..Rules::ONCE
        };
        let now = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(
            next_change(None, Rejoin::Steady, now, &rules).as_secs(),
            86_400
        );
        let mut report = ProbeReport::new(ProbeOutcome::Healthy(None), ms(3), None);
        report.finished = now;
        let probe = Some(&report);
        assert_eq!(next_change(probe, Rejoin::Steady, now, &rules), ms(5_001));
        let back = now - Duration::from_secs(58);
        assert_eq!(
            next_change(probe, Rejoin::Since(back), now, &rules),
            ms(2_001)
        );
        let later = now + Duration::from_secs(9);
        assert_eq!(
            next_change(probe, Rejoin::Steady, later, &rules).as_secs(),
            86_400,
            "a report already stale: nothing more to wait for"
        );
    }
}
