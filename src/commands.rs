//! The subcommands: the one place that turns clap's structs into settings and errors into
//! exit codes.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant, SystemTime};

use clap::ArgMatches;
use clap::parser::ValueSource;
use thiserror::Error;

use crate::cli::{Cli, Command, CycleArgs, DrainArgs, Generate, StatusArgs, UndrainArgs, WaitArgs};
use crate::exit::Exit;
use crate::health::decision::{Decision, Rules};
use crate::health::drain::DrainRecord;
use crate::health::drain_file::{Change, DrainError, DrainFile};
use crate::health::holders::{Holder, Kind};
use crate::health::verdict::Verdict;
use crate::health::weight::Rejoin;
use crate::operator::assessment::{Goal, Wait};
use crate::operator::cycle::{self, Cycle, CycleError};
use crate::operator::wait::{self, LastServer, WaitError};
use crate::operator::{daemon, manual, status};
use crate::puppet::probe::{ProbeOutcome, ProbeTarget, Prober};
use crate::responder::bind::{self, ListenError};
use crate::responder::{inetd, server, signals, systemd};
use crate::settings::{Daemon, Given, Host, Setting, Settings, SettingsError, Source};
use crate::text::seconds;

/// Why a command failed; each becomes its exit code in [`Error::exit`].
#[derive(Debug, Error)]
pub enum Error {
    /// The settings cannot be resolved.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// A listen address cannot be bound.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// The drain record cannot be written or removed.
    #[error(transparent)]
    Drain(#[from] DrainError),
    /// The daemon cannot be asked.
    #[error(transparent)]
    Status(#[from] daemon::StatusError),
    /// systemd's sockets are unusable.
    #[error(transparent)]
    Systemd(#[from] systemd::SystemdError),
    /// `--wait` did not see its goal reached.
    #[error(transparent)]
    Wait(#[from] WaitError),
    /// `cycle` stopped before the end.
    #[error(transparent)]
    Cycle(#[from] CycleError),
    /// A load balancer says this node is the last server taking traffic.
    #[error(transparent)]
    LastServer(#[from] LastServer),
    /// `undrain` without `--force` while running cycles hold the node.
    #[error(
        "refused: the node is held drained by {0}, which undrains it when done (if nobody else holds it); `pmcheck undrain --force` undrains now, and the cycle then leaves the node as it finds it"
    )]
    Held(String),
    /// Any other system error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// How the command ends.
    pub fn exit(&self) -> Exit {
        match self {
            Error::Settings(_) => Exit::Config,
            Error::Listen(e) => e.exit(),
            Error::Drain(_) => Exit::CantCreate,
            Error::Status(_) => Exit::Warning,
            Error::Systemd(_) | Error::Io(_) => Exit::OsErr,
            Error::Wait(e) => wait_exit(e),
            Error::LastServer(_) | Error::Held(_) => Exit::Refused,
            Error::Cycle(e) => match e {
                CycleError::NoDaemon(e) => wait_exit(e),
                CycleError::Drain(_) => Exit::CantCreate,
                CycleError::LastServer(_) => Exit::Refused,
                e if e.not_healthy() => Exit::Critical,
                CycleError::Wait { source, .. } => wait_exit(source),
                CycleError::Command { .. } | CycleError::Released { .. } => Exit::Warning,
                CycleError::Interrupted { .. } => Exit::Interrupted,
            },
        }
    }
}

fn wait_exit(e: &WaitError) -> Exit {
    match e {
        WaitError::OtherFile { .. } => Exit::Config,
        WaitError::NoDaemon(_) => Exit::Unavailable,
        WaitError::TimedOut { .. } => Exit::TempFail,
        WaitError::Interrupted { .. } => Exit::Interrupted,
    }
}

/// Runs the parsed command line; `matches` tells where each value came from.
pub fn run(cli: Cli, matches: &ArgMatches) -> Exit {
    let quiet = matches!(cli.command, Command::Inetd(_)) && inetd::stderr_is_the_connection();
    if !quiet {
        init_logging();
    }
    let given = || Provenance::of(matches).given();
    let result = match cli.command {
        Command::Serve(_) => serve(&given()),
        Command::Inetd(args) => {
            let given = given();
            let target = Settings::resolve(&given, &Host::REAL).map(|s| ProbeTarget::of(&s));
            let answered = inetd::answer_one(
                &args.state.state_dir,
                target,
                given.timeout.value,
                args.read_timeout,
                args.drained.drained_status,
            );
            run_single_threaded(answered)
                .and_then(|r| r)
                .map(|()| Exit::Ok)
                .map_err(Error::from)
        }
        Command::Check(_) => return check(&given()),
        Command::Config(_) => Settings::resolve(&given(), &Host::REAL)
            .map(|s| {
                print!("{s}");
                Exit::Ok
            })
            .map_err(Error::from),
        Command::Drain(args) => drain(args),
        Command::Undrain(args) => undrain(args),
        Command::Cycle(args) => cycle_command(args),
        Command::Status(args) => status_command(args),
        Command::Generate(args) => generate(args.what),
    };
    result.unwrap_or_else(|e| {
        // Under xinetd stderr is the connection: no stray text there.
        if !quiet {
            eprintln!("pmcheck: {e}");
        }
        e.exit()
    })
}

/// Where clap found each value of a subcommand: on the command line, in the environment variable
/// its definition names, or its default. The only place that turns clap's matches into
/// [`Given`] settings, so an option's name, variable and default are each written once.
struct Provenance<'a> {
    matches: &'a ArgMatches,
    command: clap::Command,
}

impl<'a> Provenance<'a> {
    /// The subcommand's matches and definition.
    fn of(matches: &'a ArgMatches) -> Self {
        let cli = <Cli as clap::CommandFactory>::command();
        match matches.subcommand() {
            Some((name, sub)) => Self {
                command: cli.find_subcommand(name).cloned().unwrap_or(cli),
                matches: sub,
            },
            None => Self {
                matches,
                command: cli,
            },
        }
    }

    fn given(&self) -> Given {
        Given {
            puppet_conf: self.get("puppet_conf"),
            certname: self.get("certname"),
            hostcert: self.get("hostcert"),
            hostprivkey: self.get("hostprivkey"),
            localcacert: self.get("localcacert"),
            puppet_addr: self.get("puppet_addr"),
            status_path: self.must("status_path"),
            timeout: self.must("timeout"),
            state_dir: self.must("state_dir"),
            daemon: self.daemon(),
        }
    }

    /// The daemon's own settings, when the subcommand takes them (`serve`, `config`).
    fn daemon(&self) -> Option<Daemon> {
        let takes = |id: &str| self.command.get_arguments().any(|a| a.get_id() == id);
        takes("interval").then(|| Daemon {
            listen: self.many("listen"),
            agent_listen: self.many("agent_listen"),
            allow: self.many("allow"),
            interval: self.must("interval"),
            max_connections: self.must("max_connections"),
            max_connections_per_source: self.must("max_connections_per_source"),
            slow_start: self.must("slow_start"),
            drained_status: self.must("drained_status"),
        })
    }

    /// A repeatable option's values (none when nobody gave any) and where they came from.
    fn many<T: Clone + Send + Sync + 'static>(&self, id: &str) -> Setting<Vec<T>> {
        let value = match self.matches.try_get_many::<T>(id) {
            Ok(values) => values.map(|v| v.cloned().collect()).unwrap_or_default(),
            Err(e) => panic!("pmcheck bug: the settings read option `{id}`: {e}"),
        };
        Setting {
            value,
            source: self.source(id),
        }
    }

    /// The value of the option `id` and where it came from; `None` when nobody gave it.
    ///
    /// An `id` that clap does not define is a bug in pmcheck, not in the input: it panics, and
    /// the tests that give every option (`config_says_where_every_option_came_from`) catch it.
    fn get<T: Clone + Send + Sync + 'static>(&self, id: &str) -> Option<Setting<T>> {
        let value = match self.matches.try_get_one::<T>(id) {
            Ok(value) => value.cloned()?,
            Err(e) => panic!("pmcheck bug: the settings read option `{id}`: {e}"),
        };
        let source = self.source(id);
        Some(Setting { value, source })
    }

    /// Where the value of option `id` came from.
    fn source(&self, id: &str) -> Source {
        match self.matches.value_source(id) {
            Some(ValueSource::EnvVariable) => Source::Env(self.env(id)),
            Some(ValueSource::DefaultValue) | None => Source::Default("built in".into()),
            Some(_) => Source::Flag,
        }
    }

    /// An option with a default, which therefore always has a value.
    fn must<T: Clone + Send + Sync + 'static>(&self, id: &str) -> Setting<T> {
        self.get(id)
            .unwrap_or_else(|| panic!("pmcheck bug: option `{id}` has no default value"))
    }

    /// The environment variable of option `id`, as its definition names it.
    fn env(&self, id: &str) -> String {
        self.command
            .get_arguments()
            .find(|arg| arg.get_id() == id)
            .and_then(|arg| arg.get_env())
            .map(|var| var.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    // Under systemd the journal stamps every line already.
    let _ = if std::env::var_os("JOURNAL_STREAM").is_some() {
        builder.without_time().try_init()
    } else {
        builder.try_init()
    };
}

fn runtime(multi_thread: bool) -> std::io::Result<tokio::runtime::Runtime> {
    if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
}

/// Runs a short command on one thread, and does not wait for a blocking task left behind (the
/// stdin reader of `inetd`, which only returns when the client sends more).
fn run_single_threaded<F: std::future::Future>(future: F) -> std::io::Result<F::Output> {
    let rt = runtime(false)?;
    let output = rt.block_on(future);
    rt.shutdown_timeout(Duration::from_millis(100));
    Ok(output)
}

fn serve(given: &Given) -> Result<Exit, Error> {
    let settings = Settings::resolve(given, &Host::REAL)?;
    let Some(daemon) = &settings.daemon else {
        unreachable!("`serve` takes the daemon's options, so its settings have them");
    };
    // Before any thread exists: taking systemd's sockets clears LISTEN_FDS from the environment.
    let listeners = match systemd::listeners()? {
        Some(inherited) => {
            if !daemon.listen.value.is_empty() {
                tracing::warn!(
                    "ignoring --listen/PMCHECK_LISTEN: systemd passed the listening sockets (change ListenStream= in pmcheck.socket instead)"
                );
            }
            inherited
        }
        None => bind::bind(&daemon.listen.value)?,
    };
    let listeners = server::Listeners {
        http: listeners,
        agent: bind::bind_each(&daemon.agent_listen.value)?,
    };
    let notifier = systemd::Notifier::from_env();
    let rt = runtime(true)?;
    rt.block_on(async {
        let (reload, reloads) = tokio::sync::watch::channel(());
        let stopped = signals::until_stopped(reload)?;
        let ready = || {
            if let Some(n) = &notifier {
                n.notify("READY=1\nSTATUS=answering polls");
                if let Some(watchdog) = n.watchdog_task() {
                    tokio::spawn(watchdog);
                }
            }
        };
        server::serve(&settings, listeners, reloads, ready, async {
            stopped.await;
            if let Some(n) = &notifier {
                n.notify("STOPPING=1");
            }
        })
        .await
    })?;
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(Exit::Ok)
}

/// A monitoring-plugin line and exit code: 0 OK, 1 WARNING (drained, Puppet healthy),
/// 2 CRITICAL (Puppet unhealthy), 3 UNKNOWN (bad settings, unreadable drain state).
fn check(given: &Given) -> Exit {
    let settings = match Settings::resolve(given, &Host::REAL) {
        Ok(s) => s,
        Err(e) => {
            println!("PMCHECK UNKNOWN - {e}");
            return Exit::Unknown;
        }
    };
    let report = match run_single_threaded(async {
        Prober::new(ProbeTarget::of(&settings)).probe().await
    }) {
        Ok(report) => report,
        Err(e) => {
            println!("PMCHECK UNKNOWN - cannot start the probe: {e}");
            return Exit::Unknown;
        }
    };
    let drain = DrainFile::new(&settings.state_dir.value).state(SystemTime::now());
    let decision = Decision::decide(
        &drain,
        Some(&report),
        Rejoin::Steady,
        Instant::now(),
        &Rules::ONCE,
    );
    let (label, code) = match (decision.verdict, &report.outcome) {
        (Verdict::Unknown | Verdict::Starting, _) | (_, ProbeOutcome::CannotTell(_)) => {
            ("UNKNOWN", Exit::Unknown)
        }
        (_, ProbeOutcome::Unhealthy(_) | ProbeOutcome::NotReady(_)) => ("CRITICAL", Exit::Critical),
        (Verdict::Drained, _) => ("WARNING", Exit::Warning),
        _ => ("OK", Exit::Ok),
    };
    let mut perfdata = format!("time={:.3}s;;;0", report.latency.as_secs_f64());
    if let Some(pool) = &report.pool {
        perfdata.push(' ');
        perfdata.push_str(&pool_perfdata(pool, decision.weight));
    }
    println!("PMCHECK {label} - {} | {perfdata}", decision.reason);
    code
}

/// The pool as monitoring-plugin performance data: gauges with their bounds, counters as `c`.
fn pool_perfdata(pool: &crate::puppet::pool::Pool, weight: u8) -> String {
    let size = pool.size;
    format!(
        "jrubies_free={};;;0;{size} jrubies_borrowed={};;;0;{size} jrubies_waiting={};;;0 \
         average_wait={}ms;;;0 average_borrow={}ms;;;0 queue_limit_hits={}c borrow_timeouts={}c \
         weight={weight}%;;;0;100",
        pool.free,
        pool.borrowed,
        pool.waiting,
        pool.average_wait_ms,
        pool.average_borrow_ms,
        pool.queue_limit_hits,
        pool.borrow_timeouts,
    )
}

fn drain(args: DrainArgs) -> Result<Exit, Error> {
    let how = wait_settings(&args.waiting, &args.state);
    let forced = run_single_threaded(wait::guard_last_server(&how, args.force))??;
    let file = DrainFile::new(&args.state.state_dir);
    let mine = Holder::drain(args.reason, args.for_, SystemTime::now());
    let (previous, others) = file.update(|current| {
        let now = SystemTime::now();
        let mut held: Vec<Holder> = (current.as_ref())
            .and_then(|d| d.record.as_ref())
            .map(DrainRecord::holders)
            .unwrap_or_default();
        held.retain(|h| h.kind != Kind::Drain && !h.expired_at(now));
        let others = held.clone();
        held.push(mine.clone());
        match DrainRecord::held_by(held, forced) {
            Some(record) => (Change::Write(record), (current, others)),
            None => (Change::Keep, (current, others)),
        }
    })?;
    let mut out = std::io::stdout().lock();
    if let Some(previous) = previous.filter(|p| {
        p.record
            .as_ref()
            .is_none_or(|r| r.holders().iter().any(|h| h.kind == Kind::Drain))
    }) {
        writeln!(out, "replaced the previous drain: {}", previous.describe())?;
    }
    let until = mine
        .until
        .as_deref()
        .map(|u| format!(" until {u}"))
        .unwrap_or_default();
    writeln!(
        out,
        "drained: {} (by {} since {}{until}); wrote {}",
        mine.what,
        mine.by,
        mine.since,
        file.path().display()
    )?;
    for other in &others {
        writeln!(out, "also held by {}", other.describe())?;
    }
    drop(out);
    if !args.wait {
        match run_single_threaded(daemon::daemon_answer(&how, true))? {
            Ok(said) => println!(
                "{said}\nHAProxy takes the node out at its next check with disable-on-404 or the agent check, else after its `fall` failed checks. `pmcheck undrain` puts it back; `pmcheck drain --wait` tells when it is safe to stop Puppet Server."
            ),
            Err(warning) => eprintln!("pmcheck: warning: {warning}"),
        }
        return Ok(Exit::Ok);
    }
    let done = wait_for(Goal::Drained, &how).map_err(|e| annotate(e, "the node stays drained"))?;
    println!(
        "safe to stop Puppet Server after {}: {}",
        seconds(done.waited),
        done.summary
    );
    for warning in &done.warnings {
        eprintln!("pmcheck: warning: {warning}");
    }
    Ok(Exit::Ok)
}

/// How the waits ask the daemon about the drain record in `state`, from the command line.
fn wait_settings(args: &WaitArgs, state: &crate::cli::StateArgs) -> Wait {
    let (max_wait, deprecated) = args.max_wait();
    if deprecated {
        eprintln!(
            "pmcheck: warning: --timeout (PMCHECK_WAIT_TIMEOUT) of drain, undrain and cycle is deprecated: write --max-wait (PMCHECK_MAX_WAIT); --timeout is the probe's deadline elsewhere"
        );
    }
    Wait {
        url: args.url.clone(),
        max_wait,
        polls: args.polls,
        lb_interval: args.lb_interval,
        drain_file: Some(DrainFile::new(&state.state_dir).resolved()),
    }
}

/// Runs one wait on its own runtime; a signal ends the process as usual.
fn wait_for(goal: Goal, how: &Wait) -> Result<wait::Done, Error> {
    Ok(run_single_threaded(wait::wait(
        goal,
        how,
        std::future::pending(),
    ))??)
}

/// A timed-out wait's error, with what became of the node (the line before said what was
/// written, so a daemon that cannot be reached needs no more).
fn annotate(e: Error, left: &str) -> Error {
    match e {
        Error::Wait(WaitError::TimedOut { waited, pending }) => Error::Wait(WaitError::TimedOut {
            waited,
            pending: format!("{pending} ({left})"),
        }),
        other => other,
    }
}

fn undrain(args: UndrainArgs) -> Result<Exit, Error> {
    let state = args.state;
    let file = DrainFile::new(&state.state_dir);
    let force = args.force;
    let outcome = file.update(|current| {
        let Some(drain) = current else {
            return (Change::Keep, Undrain::NotDrained);
        };
        let held = drain
            .record
            .as_ref()
            .map(DrainRecord::holders)
            .unwrap_or_default();
        let running: Vec<Holder> = held.iter().filter(|h| h.running()).cloned().collect();
        if !running.is_empty() && !force {
            return (Change::Keep, Undrain::Held(running));
        }
        (Change::Remove, Undrain::Removed(drain, held))
    })?;
    match outcome {
        Undrain::NotDrained => println!(
            "not drained: there is no {}; nothing to do",
            file.path().display()
        ),
        Undrain::Held(running) => {
            let held: Vec<String> = running.iter().map(Holder::describe).collect();
            return Err(Error::Held(held.join(", ")));
        }
        Undrain::Removed(previous, held) => {
            println!(
                "undrained: removed {} (was: {})",
                file.path().display(),
                previous.describe()
            );
            for h in held.iter().filter(|h| h.kind != Kind::Drain) {
                println!("let go of {}", h.describe());
            }
        }
    }
    let how = wait_settings(&args.waiting, &state);
    if !args.wait {
        match run_single_threaded(daemon::daemon_answer(&how, false))? {
            Ok(said) => println!("{said}"),
            Err(warning) => eprintln!("pmcheck: warning: {warning}"),
        }
    } else {
        let done =
            wait_for(Goal::Undrained, &how).map_err(|e| annotate(e, "the node is undrained"))?;
        println!(
            "back in rotation after {}: {}",
            seconds(done.waited),
            done.summary
        );
    }
    Ok(Exit::Ok)
}

/// What `undrain` found.
enum Undrain {
    /// No record.
    NotDrained,
    /// Running cycles hold the node, and no `--force`.
    Held(Vec<Holder>),
    /// The record was removed: what it was, and who held it.
    Removed(crate::health::drain::Drain, Vec<Holder>),
}

fn cycle_command(args: CycleArgs) -> Result<Exit, Error> {
    let command = cycle::shown(&args.command);
    let reason = args.reason.unwrap_or_else(|| {
        let text = format!("pmcheck cycle: {}", command.trim_matches('`'));
        let text: String = text
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        text.chars()
            .take(crate::health::drain::REASON_LIMIT)
            .collect()
    });
    let cycle = Cycle {
        reason,
        wait: wait_settings(&args.waiting, &args.state),
        force: args.force,
        kill_after: args.kill_after,
        command: args.command,
    };
    run_single_threaded(cycle::run(&cycle, &args.state.state_dir))??;
    Ok(Exit::Ok)
}

fn status_command(args: StatusArgs) -> Result<Exit, Error> {
    let reply = run_single_threaded(daemon::ask(&args.url))??;
    if args.json {
        print!("{}", reply.body);
    } else {
        print!("{}", status::describe(&reply));
    }
    Ok(if reply.status == 200 {
        Exit::Ok
    } else {
        Exit::Warning
    })
}

fn generate(what: Generate) -> Result<Exit, Error> {
    let mut out = std::io::stdout().lock();
    match what {
        Generate::Man => manual::man(&mut out)?,
        Generate::Completions { shell } => manual::completions(shell, &mut out),
    }
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    /// A valid value for each of `config`'s options; a new option must get one here.
    fn sample(long: &str, dir: &std::path::Path) -> String {
        let file = |name: &str| dir.join(name).display().to_string();
        match long {
            "puppet-conf" => file("puppet.conf"),
            "certname" => "node1.example.com".into(),
            "hostcert" | "hostprivkey" | "localcacert" => file(&format!("{long}.pem")),
            "puppet-addr" => "127.0.0.1:8141".into(),
            "status-path" => "/status/v1/simple/master".into(),
            "timeout" => "2s".into(),
            "state-dir" => file("state"),
            "listen" => "127.0.0.1:9300".into(),
            "agent-listen" => "127.0.0.1:9301".into(),
            "allow" => "10.0.0.0/8".into(),
            "interval" => "3s".into(),
            "max-connections" => "100".into(),
            "max-connections-per-source" => "10".into(),
            "slow-start" => "30s".into(),
            "drained-status" => "404".into(),
            other => panic!("no sample value for --{other}: add one to this test"),
        }
    }

    /// `config` must say "command line" for every option given there: an option renamed in clap
    /// but not in [`Provenance::given`] (or the table) fails here instead of reading "default".
    #[test]
    fn config_says_where_every_option_came_from() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("puppet.conf"), "").unwrap();
        let config = Cli::command();
        let config = config.find_subcommand("config").unwrap();
        let longs: Vec<&str> = config
            .get_arguments()
            .filter_map(|arg| arg.get_long())
            .filter(|long| *long != "help")
            .collect();
        let mut argv = vec!["pmcheck".to_owned(), "config".to_owned()];
        for long in &longs {
            argv.push(format!("--{long}"));
            argv.push(sample(long, dir.path()));
        }
        let matches = Cli::command().try_get_matches_from(&argv).unwrap();
        Cli::from_arg_matches(&matches).unwrap();
        let given = Provenance::of(&matches).given();
        let host = Host {
            fqdn: &|| Err(crate::settings::puppet_conf::FqdnError::Empty),
            webserver: &|_| None,
        };
        let table = Settings::resolve(&given, &host).unwrap().to_string();
        for long in longs {
            let row = table
                .lines()
                .find(|line| line.split_whitespace().next() == Some(long))
                .unwrap_or_else(|| panic!("config shows no row for --{long}:\n{table}"));
            assert!(row.ends_with("(command line)"), "--{long}: {row}");
        }
    }

    /// What `serve` takes, `config` shows: a new daemon option cannot bypass the settings.
    #[test]
    fn config_takes_every_option_of_serve() {
        let cli = Cli::command();
        let longs = |name: &str| -> Vec<String> {
            let sub = cli.find_subcommand(name).unwrap();
            let mut longs: Vec<String> = sub
                .get_arguments()
                .filter_map(|arg| arg.get_long().map(str::to_owned))
                .collect();
            longs.sort();
            longs
        };
        assert_eq!(longs("serve"), longs("config"));
        assert!(longs("serve").len() >= 17, "{:?}", longs("serve"));
    }

    /// The daemon's settings are in the one settings object, with where each came from.
    #[test]
    fn the_daemons_settings_come_from_the_command_line_and_the_environment() {
        let matches = Cli::command()
            .try_get_matches_from([
                "pmcheck",
                "serve",
                "--interval",
                "5s",
                "--allow",
                "10.1.2.3/8",
            ])
            .unwrap();
        let given = Provenance::of(&matches).given();
        let daemon = given.daemon.expect("serve takes the daemon's options");
        assert_eq!(daemon.interval.value, Duration::from_secs(5));
        assert_eq!(daemon.interval.source, Source::Flag);
        assert_eq!(daemon.allow.value[0].to_string(), "10.0.0.0/8");
        assert_eq!(daemon.listen.value, Vec::<std::net::SocketAddr>::new());
        assert_eq!(daemon.listen.source, Source::Default("built in".into()));
        assert_eq!(daemon.max_connections.value, 1024);
        let check = Cli::command()
            .try_get_matches_from(["pmcheck", "check"])
            .unwrap();
        assert!(Provenance::of(&check).given().daemon.is_none());
    }

    /// Options nobody gave say so, and where their value came from instead.
    #[test]
    fn defaults_say_built_in() {
        let matches = Cli::command()
            .try_get_matches_from(["pmcheck", "config"])
            .unwrap();
        let given = Provenance::of(&matches).given();
        assert_eq!(given.certname, None);
        assert_eq!(given.timeout.value, Duration::from_millis(1500));
        assert_eq!(given.timeout.source, Source::Default("built in".into()));
        assert_eq!(
            given.state_dir.value,
            std::path::Path::new("/var/lib/pmcheck")
        );
    }
}
