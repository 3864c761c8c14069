//! The daemon: listeners, the prober task and graceful shutdown.

use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use ipnet::IpNet;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::health::decision::{Decision, Rules};
use crate::health::drain::DrainState;
use crate::health::drain_file::DrainFile;
use crate::health::drain_watch::{self, Watcher};
use crate::health::verdict::Verdict;
use crate::health::weight::{Rejoin, Tracker};
use crate::puppet::probe::{self, ProbeOutcome, ProbeReport, ProbeTarget, Prober};
use crate::responder::agent;
use crate::responder::connections::{Connections, Limits, Throttle};
use crate::responder::deadline::WriteDeadline;
use crate::responder::http::operator_view;
use crate::responder::node::{Feeds, Node};
use crate::settings::Settings;
use crate::settings::allow::permits;
use crate::settings::duration::format_duration;

/// How long a client may take to send its request head, or stay idle between two requests.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an answer may wait for the client to read it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Past this age a kept-alive connection is closed after its current request: a client that
/// reads a byte now and then cannot hold a descriptor for ever.
const MAX_CONNECTION_AGE: Duration = Duration::from_secs(60);
/// How long shutdown waits for polls in flight.
const DRAIN_CONNECTIONS: Duration = Duration::from_secs(2);

/// The bound listeners: HTTP checks, and HAProxy agent checks.
pub struct Listeners {
    /// `--listen`, or systemd's sockets.
    pub http: Vec<std::net::TcpListener>,
    /// `--agent-listen`: bound by the daemon itself, also under socket activation.
    pub agent: Vec<std::net::TcpListener>,
}

/// What a listener answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// HTTP health checks (`option httpchk`, curl, `pmcheck status`).
    Http,
    /// HAProxy's agent check: one line, then close.
    Agent,
}

/// Runs the daemon on already-bound listeners until `shutdown` resolves. `ready` is called once
/// every listener accepts (the systemd notification goes there); `reload` (SIGHUP) re-reads the
/// certificates and the drain record.
pub async fn serve(
    settings: &Settings,
    listeners: Listeners,
    reload: watch::Receiver<()>,
    ready: impl FnOnce(),
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let Some(daemon) = &settings.daemon else {
        return Err(io::Error::other(
            "pmcheck bug: the daemon was started without its settings",
        ));
    };
    let interval = daemon.interval.value;
    let timeout = settings.timeout.value;
    let (stop, stopped) = watch::channel(());
    let (publish, latest) = watch::channel(None);
    let drain_file = DrainFile::new(&settings.state_dir.value);
    // On the blocking pool with the drain record's deadline: the state directory may sit on a
    // hung file system, and then the first look says so (503 UNKNOWN) instead of start-up waiting.
    let dir = drain_file.clone();
    let prepared = tokio::task::spawn_blocking(move || prepare_state_dir(&dir));
    let _ = tokio::time::timeout(drain_watch::DEADLINE, prepared).await;
    let (publish_drain, drains) = watch::channel(Arc::new(DrainState::NotDrained));
    // The first look before the first answer: a drained node never answers from a default.
    let mut watcher = Watcher::new(drain_file.clone());
    let first = watcher.look(true).await;
    let drain_path = watcher.file().path().display().to_string();
    if let Some(state) = first {
        publish_drain.send_replace(Arc::new(state));
    }
    let rules = Rules {
        // A probe lands at least every interval + timeout; allow one missed round.
        stale_after: 2 * (interval + timeout),
        drained_status: daemon.drained_status.value,
        slow_start: daemon.slow_start.value,
    };
    let (publish_rejoin, rejoin) = watch::channel(Rejoin::Steady);
    let health = Arc::new(Node::new(
        Feeds {
            drain: drains,
            latest,
            rejoin,
        },
        rules,
        &drain_file,
        Some(settings.puppet_addr.value),
        true,
    ));

    let limits = Limits {
        total: daemon.max_connections.value as usize,
        per_source: daemon
            .max_connections_per_source
            .value
            .min(daemon.max_connections.value) as usize,
    }
    .fit_descriptors();
    let connections = Connections::new(limits);
    let guard = Arc::new(Guard {
        allow: daemon.allow.value.clone(),
        connections,
        refused: Mutex::new(Throttle::new(Duration::from_secs(10))),
        failed: Mutex::new(Throttle::new(Duration::from_secs(10))),
    });
    let mut tasks = JoinSet::new();
    let kinds = (listeners.http.into_iter().map(|l| (Kind::Http, l)))
        .chain(listeners.agent.into_iter().map(|l| (Kind::Agent, l)));
    for (kind, listener) in kinds {
        let listener = TcpListener::from_std(listener)?;
        match kind {
            Kind::Http => tracing::info!("listening on {}", listener.local_addr()?),
            Kind::Agent => tracing::info!(
                "answering HAProxy agent checks on {}",
                listener.local_addr()?
            ),
        }
        tasks.spawn(accept(
            kind,
            listener,
            Arc::clone(&health),
            Arc::clone(&guard),
            stopped.clone(),
        ));
    }
    if !guard.allow.is_empty() {
        let nets: Vec<_> = guard.allow.iter().map(ToString::to_string).collect();
        tracing::info!("accepting polls only from {}", nets.join(", "));
    }
    tracing::debug!(
        "at most {} connections, {} per source",
        limits.total,
        limits.per_source
    );
    let prober = Prober::new(ProbeTarget::of(settings));
    tracing::info!(
        "probing {} at {} every {} (timeout {}); drain record {drain_path}",
        prober.endpoint(),
        settings.puppet_addr.value,
        format_duration(interval),
        format_duration(timeout),
    );
    tasks.spawn(drain_watch::run(
        watcher,
        publish_drain,
        reload.clone(),
        until_stopped(stopped.clone()),
    ));
    tasks.spawn(track_rejoin(
        Arc::clone(&health),
        publish_rejoin,
        until_stopped(stopped.clone()),
    ));
    tasks.spawn(probe::run(
        prober,
        interval,
        publish,
        reload,
        observe(Arc::clone(&health)),
        until_stopped(stopped.clone()),
    ));
    ready();
    shutdown.await;
    tracing::info!("shutting down");
    drop(stop);
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Creates a missing state directory when it may (a first `cargo build && pmcheck serve` has
/// no package to do it), and warns about one anybody may write: anybody could drain or undrain.
fn prepare_state_dir(file: &DrainFile) {
    let dir = file.dir();
    if !dir.exists() {
        match file.create_dir() {
            Ok(()) => tracing::info!("created the state directory {}", dir.display()),
            Err(e) => tracing::warn!(
                "cannot create the state directory {}: {e}; answering 503 until it exists",
                dir.display()
            ),
        }
    }
    if let Some(warning) = crate::settings::state_dir_warning(dir) {
        tracing::warn!("{warning}");
    }
}

/// Resolves when the stop sender is dropped.
async fn until_stopped(mut stopped: watch::Receiver<()>) {
    while stopped.changed().await.is_ok() {}
}

/// Who may connect, and how many at once.
struct Guard {
    allow: Vec<IpNet>,
    connections: Arc<Connections>,
    refused: Mutex<Throttle>,
    failed: Mutex<Throttle>,
}

impl Guard {
    fn note(throttle: &Mutex<Throttle>) -> Option<u64> {
        throttle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .hit(Instant::now())
    }
}

/// Follows the verdict (on every probe, drain change, and once a second for reports going
/// stale) so the weight knows when the node came back, and logs each change of it: also the
/// UNKNOWN of a probe report gone stale, which no probe report announces.
async fn track_rejoin(
    health: Arc<Node>,
    publish: watch::Sender<Rejoin>,
    shutdown: impl Future<Output = ()>,
) {
    let mut tracker = Tracker::new(health.rules.slow_start);
    let mut log = VerdictLog::default();
    let mut drains = health.drain.clone();
    let mut latest = health.latest.clone();
    tokio::pin!(shutdown);
    loop {
        let now = Instant::now();
        let drain = Arc::clone(&drains.borrow_and_update());
        let probe = latest.borrow_and_update().clone();
        let decision =
            Decision::decide(&drain, probe.as_deref(), Rejoin::Steady, now, &health.rules);
        log.note(&decision);
        let state = tracker.observe(decision.verdict, now);
        publish.send_if_modified(|current| {
            let changed = *current != state;
            *current = state;
            changed
        });
        tokio::select! {
            Ok(()) = drains.changed() => {}
            Ok(()) = latest.changed() => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = &mut shutdown => return,
        }
    }
}

/// Accepts polls until stopped, then gives those in flight a moment to finish.
async fn accept(
    kind: Kind,
    listener: TcpListener,
    health: Arc<Node>,
    guard: Arc<Guard>,
    stopped: watch::Receiver<()>,
) {
    let http = http();
    let mut connections = JoinSet::new();
    let stop = until_stopped(stopped.clone());
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    if let Some(n) = Guard::note(&guard.failed) {
                        tracing::warn!("accept failed {n} time(s) in the last 10s: {e}");
                    }
                    // Out of descriptors: shed connections are closing, give them a moment
                    // (not the 50 ms of other errors: a load balancer's check is waiting).
                    let pause = if out_of_descriptors(&e) { 1 } else { 50 };
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    continue;
                }
            },
            () = &mut stop => break,
            Some(_) = connections.join_next() => continue,
        };
        if !permits(&guard.allow, peer.ip()) {
            // Closed before a byte is read.
            drop(stream);
            if let Some(n) = Guard::note(&guard.refused) {
                tracing::warn!(
                    "refused {n} connection(s) in the last 10s from outside --allow (the latest from {})",
                    peer.ip()
                );
            }
            continue;
        }
        let ticket = guard.connections.admit(peer.ip());
        if kind == Kind::Agent {
            let line = health.agent_line(peer.ip());
            connections.spawn(async move {
                let mut ticket = ticket;
                tokio::select! {
                    () = agent::answer(stream, line) => {}
                    _ = &mut ticket.shed => {}
                }
            });
            continue;
        }
        let _ = stream.set_nodelay(true);
        let stream = WriteDeadline::new(stream, WRITE_TIMEOUT);
        let connection = http.serve_connection(
            TokioIo::new(stream),
            answers(Arc::clone(&health), peer.ip()),
        );
        let stop = until_stopped(stopped.clone());
        connections.spawn(async move {
            let mut ticket = ticket;
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                // Shed to make room: close at once.
                _ = &mut ticket.shed => return,
                () = tokio::time::sleep(MAX_CONNECTION_AGE) => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
                () = stop => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            // HAProxy closes checks with a RST: routine, not worth more than debug.
            if let Err(e) = result {
                tracing::debug!("poll from {peer}: {e}");
            }
        });
    }
    let _ = tokio::time::timeout(DRAIN_CONNECTIONS, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

/// EMFILE or ENFILE: the process or the system has no descriptor left.
fn out_of_descriptors(e: &io::Error) -> bool {
    use nix::errno::Errno;
    matches!(e.raw_os_error(), Some(code) if code == Errno::EMFILE as i32 || code == Errno::ENFILE as i32)
}

/// The HTTP/1 settings every poll is served with.
fn http() -> hyper::server::conn::http1::Builder {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        // Also the idle limit between requests on a kept-alive connection.
        .header_read_timeout(HEADER_READ_TIMEOUT)
        // hyper's smallest: a poll is a few dozen bytes.
        .max_buf_size(8 * 1024);
    http
}

/// What a poll gets back.
type Answer = hyper::Response<http_body_util::Full<bytes::Bytes>>;

/// The service that answers each request of a connection from `peer`.
fn answers(
    health: Arc<Node>,
    peer: std::net::IpAddr,
) -> impl hyper::service::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = Answer,
    Error = std::convert::Infallible,
    Future = Reply,
> {
    service_fn(move |request| {
        if !operator_view(&request, peer) {
            return Reply::Now(Some(health.answer(&request, peer)));
        }
        // The operator's view reads the agent connections first, off the async workers.
        let health = Arc::clone(&health);
        Reply::Later(Box::pin(async move {
            health.agents.refresh().await;
            health.answer(&request, peer)
        }))
    })
}

/// A poll's answer: at once, allocating nothing more (every load balancer's poll), or after
/// the operator's view has read the agent connections.
enum Reply {
    Now(Option<Answer>),
    Later(std::pin::Pin<Box<dyn Future<Output = Answer> + Send>>),
}

impl Future for Reply {
    type Output = Result<Answer, std::convert::Infallible>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.get_mut() {
            Reply::Now(answer) => std::task::Poll::Ready(Ok(answer.take().unwrap_or_else(|| {
                // Polled again after it was ready: hyper never does.
                let mut gone = Answer::default();
                *gone.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
                gone
            }))),
            Reply::Later(later) => later.as_mut().poll(cx).map(Ok),
        }
    }
}

/// What the prober's every report goes through: the metrics count it.
fn observe(health: Arc<Node>) -> impl FnMut(&ProbeReport) {
    move |report| {
        if let Some(metrics) = &health.metrics {
            metrics.probed(report);
        }
    }
}

/// Logs one line whenever the verdict changes, not one per poll: a new verdict, a new cause
/// of a 503, or an OK node turning busy, warming or warm (not every change of the pool's
/// numbers, which move with every compile).
#[derive(Debug, Default)]
struct VerdictLog {
    last: Option<(Verdict, String)>,
}

impl VerdictLog {
    fn note(&mut self, decision: &Decision<'_>) {
        let key = match (decision.verdict, decision.probe.map(|p| &p.outcome)) {
            (Verdict::Ok, Some(ProbeOutcome::Healthy(Some(load)))) => format!("{load:?}"),
            _ => decision.reason.to_string(),
        };
        if (self.last.as_ref()).is_some_and(|(v, k)| *v == decision.verdict && *k == key) {
            return;
        }
        // Until the first probe has finished there is nothing to say.
        if decision.probe.is_none() {
            return;
        }
        let verdict = decision.verdict.as_str();
        if decision.verdict == Verdict::Ok {
            tracing::info!("verdict {verdict}: {}", decision.reason);
        } else {
            tracing::warn!("verdict {verdict}: {}", decision.reason);
        }
        self.last = Some((decision.verdict, key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::drain::{Drain, DrainState};
    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A drained node with a healthy Puppet Server: the one case where a 200 would be a lie
    /// that still looks plausible.
    fn drained() -> (Arc<Node>, impl Sized) {
        let report = ProbeReport::new(
            crate::puppet::probe::ProbeOutcome::Healthy(None),
            Duration::from_millis(1),
            None,
        );
        let (p, latest) = watch::channel(Some(Arc::new(report)));
        let state = DrainState::Drained(Drain::parse(b"{}"));
        let (d, drain) = watch::channel(Arc::new(state));
        let (r, rejoin) = watch::channel(Rejoin::Steady);
        let health = Node::new(
            Feeds {
                drain,
                latest,
                rejoin,
            },
            Rules {
                stale_after: Duration::from_secs(3600),
                ..Rules::ONCE
            },
            &DrainFile::new(std::path::Path::new("/var/lib/pmcheck")),
            None,
            true,
        );
        (Arc::new(health), (p, d, r))
    }

    /// Feeds `input` to one connection, closes the client's sending side, and returns what
    /// pmcheck wrote back.
    async fn exchange(health: &Arc<Node>, input: &[u8]) -> Vec<u8> {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let connection = http().serve_connection(
            TokioIo::new(server),
            answers(Arc::clone(health), std::net::Ipv4Addr::LOCALHOST.into()),
        );
        let served = tokio::spawn(connection);
        let _ = client.write_all(input).await;
        let _ = client.shutdown().await;
        let mut output = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut output));
        assert!(read.await.is_ok(), "pmcheck neither answered nor closed");
        let _ = served.await;
        output
    }

    fn requests() -> impl Strategy<Value = Vec<u8>> {
        let method = "(GET|HEAD|OPTIONS|POST|PRI|[A-Z]{1,8})";
        let version = "(HTTP/1\\.0|HTTP/1\\.1|HTTP/2\\.0|.{0,10})";
        let header = ("[ -~]{0,20}", "[ -~\\x80-\\xff]{0,40}");
        let shaped = (
            method,
            "[ -~]{0,30}",
            version,
            proptest::collection::vec(header, 0..6),
            any::<bool>(),
        )
            .prop_map(|(m, uri, v, headers, end)| {
                let mut text = format!("{m} {uri} {v}\r\n");
                for (name, value) in headers {
                    text.push_str(&format!("{name}: {value}\r\n"));
                }
                if end {
                    text.push_str("\r\n");
                }
                text.into_bytes()
            });
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..512),
            shaped.clone(),
            proptest::collection::vec(shaped, 1..4).prop_map(|r| r.concat()),
        ]
    }

    #[tokio::test]
    async fn the_exchange_sees_real_answers() {
        let (health, _keep) = drained();
        let output = exchange(&health, b"OPTIONS / HTTP/1.0\r\n\r\nGET / HTTP/1.1\r\n\r\n").await;
        let text = String::from_utf8_lossy(&output);
        assert!(text.starts_with("HTTP/1.0 503 Drained: "), "{text}");
        assert_eq!(
            text.matches(" 503 Drained: ").count(),
            1,
            "HTTP/1.0 closes after one: {text}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1500))]
        /// Any request bytes get an answer or a close: never a panic, never a 200 while drained.
        #[test]
        fn any_bytes_get_an_answer_or_a_close_and_never_200_while_drained(input in requests()) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let output = rt.block_on(async {
                let (health, _keep) = drained();
                exchange(&health, &input).await
            });
            let text = String::from_utf8_lossy(&output);
            prop_assert!(output.is_empty() || text.starts_with("HTTP/1."), "{text:?}");
            for status_line in text.split("\r\n").filter(|l| l.starts_with("HTTP/1.")) {
                let code = status_line.split(' ').nth(1).unwrap_or("");
                prop_assert_ne!(code, "200", "{}", text);
            }
        }
    }
}
