//! The subcommands, each mapped to a sysexits-style exit code.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant, SystemTime};

use clap::ArgMatches;
use clap::parser::ValueSource;
use thiserror::Error;

use crate::cli::{CheckArgs, Cli, Command, DrainArgs, Generate, PuppetArgs, StateArgs, StatusArgs};
use crate::exit::Exit;
use crate::health::drain::{DrainError, DrainFile, DrainRecord};
use crate::health::verdict::{Decision, Verdict};
use crate::operator::{manual, status};
use crate::puppet::probe::{ProbeOutcome, Prober};
use crate::responder::connections::Limits;
use crate::responder::server::ListenError;
use crate::responder::{inetd, server, signals, systemd};
use crate::settings::puppet_conf::Source;
use crate::settings::{Host, Origin, Settings, SettingsError};

#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error(transparent)]
    Drain(#[from] DrainError),
    #[error(transparent)]
    Status(#[from] status::StatusError),
    #[error(transparent)]
    Systemd(#[from] systemd::SystemdError),
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
        }
    }
}

/// Runs the parsed command line; `matches` tells flags from environment variables.
pub fn run(cli: Cli, matches: &ArgMatches) -> Exit {
    let sub = matches.subcommand().map(|(_, m)| m).unwrap_or(matches);
    let origin = Matches(sub);
    let quiet = matches!(cli.command, Command::Inetd(_)) && inetd::stderr_is_the_connection();
    if !quiet {
        init_logging();
    }
    let result = match cli.command {
        Command::Serve(args) => serve(args, &origin),
        Command::Inetd(args) => {
            let target = Settings::resolve(&args.puppet, &args.state, &origin, &Host::REAL)
                .map(|s| s.probe_target());
            let answered = inetd::answer_one(&args.state.state_dir, target, args.read_timeout);
            block_on(answered)
                .and_then(|r| r)
                .map(|()| Exit::Ok)
                .map_err(Error::from)
        }
        Command::Check(args) => return check(args, &origin),
        Command::Config(args) => settings(&args.puppet, &args.state, &origin).map(|s| {
            print!("{s}");
            Exit::Ok
        }),
        Command::Drain(args) => drain(args),
        Command::Undrain(state) => undrain(state),
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

struct Matches<'a>(&'a ArgMatches);

impl Origin for Matches<'_> {
    fn origin(&self, id: &str, env: &'static str) -> Source {
        match self
            .0
            .try_get_raw(id)
            .ok()
            .and_then(|_| self.0.value_source(id))
        {
            Some(ValueSource::EnvVariable) => Source::Env(env),
            Some(ValueSource::DefaultValue) | None => Source::Default("built in".into()),
            Some(_) => Source::Flag,
        }
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

fn settings(args: &PuppetArgs, state: &StateArgs, origin: &dyn Origin) -> Result<Settings, Error> {
    Ok(Settings::resolve(args, state, origin, &Host::REAL)?)
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

/// Runs a short command to completion without waiting for a stdin reader left blocked.
fn block_on<F: std::future::Future>(future: F) -> std::io::Result<F::Output> {
    let rt = runtime(false)?;
    let output = rt.block_on(future);
    rt.shutdown_timeout(Duration::from_millis(100));
    Ok(output)
}

fn serve(args: crate::cli::ServeArgs, origin: &dyn Origin) -> Result<Exit, Error> {
    let settings = settings(&args.puppet, &args.state, origin)?;
    // Before any thread exists: taking systemd's sockets clears LISTEN_FDS from the environment.
    let listeners = match systemd::listeners()? {
        Some(inherited) => {
            if !args.listen.is_empty() {
                tracing::warn!(
                    "ignoring --listen/PMCHECK_LISTEN: systemd passed the listening sockets (change ListenStream= in pmcheck.socket instead)"
                );
            }
            inherited
        }
        None => server::bind(&args.listen)?,
    };
    let notifier = systemd::Notifier::from_env();
    let options = server::Options {
        interval: args.interval,
        allow: args.allow,
        limits: Limits {
            total: args.max_connections as usize,
            per_source: args.max_connections_per_source.min(args.max_connections) as usize,
        },
    };
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
        server::serve(&settings, options, listeners, reloads, ready, async {
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
fn check(args: CheckArgs, origin: &dyn Origin) -> Exit {
    let settings = match settings(&args.puppet, &args.state, origin) {
        Ok(s) => s,
        Err(e) => {
            println!("PMCHECK UNKNOWN - {e}");
            return Exit::Unknown;
        }
    };
    let report = match block_on(async { Prober::new(settings.probe_target()).probe().await }) {
        Ok(report) => report,
        Err(e) => {
            println!("PMCHECK UNKNOWN - cannot start the probe: {e}");
            return Exit::Unknown;
        }
    };
    let drain = DrainFile::new(&settings.state_dir.value).state(SystemTime::now());
    let decision = Decision::decide(&drain, Some(&report), Instant::now(), Duration::MAX);
    let (label, code) = match (decision.verdict, &report.outcome) {
        (Verdict::Unknown | Verdict::Starting, _) | (_, ProbeOutcome::CannotTell(_)) => {
            ("UNKNOWN", Exit::Unknown)
        }
        (_, ProbeOutcome::Unhealthy(_)) => ("CRITICAL", Exit::Critical),
        (Verdict::Drained, _) => ("WARNING", Exit::Warning),
        _ => ("OK", Exit::Ok),
    };
    println!(
        "PMCHECK {label} - {} | time={:.3}s;;;0",
        decision.reason,
        report.latency.as_secs_f64()
    );
    code
}

fn drain(args: DrainArgs) -> Result<Exit, Error> {
    let file = DrainFile::new(&args.state.state_dir);
    let previous = file.current();
    let record = DrainRecord::new(args.reason, args.for_, SystemTime::now());
    file.write(&record)?;
    let mut out = std::io::stdout().lock();
    if let Some(previous) = previous {
        writeln!(out, "replaced the previous drain: {}", previous.describe())?;
    }
    let until = record
        .until
        .as_deref()
        .map(|u| format!(" until {u}"))
        .unwrap_or_default();
    writeln!(
        out,
        "drained: {} (by {} since {}{until}); wrote {}",
        record.reason,
        record.by,
        record.since,
        file.path().display()
    )?;
    writeln!(
        out,
        "pmcheck now answers 503; HAProxy takes the node out after its `fall` failed checks. `pmcheck undrain` puts it back."
    )?;
    Ok(Exit::Ok)
}

fn undrain(state: StateArgs) -> Result<Exit, Error> {
    let file = DrainFile::new(&state.state_dir);
    match file.remove()? {
        Some(previous) => println!(
            "undrained: removed {} (was: {}); pmcheck answers from Puppet Server's health again",
            file.path().display(),
            previous.describe()
        ),
        None => println!(
            "not drained: there is no {}; nothing to do",
            file.path().display()
        ),
    }
    Ok(Exit::Ok)
}

fn status_command(args: StatusArgs) -> Result<Exit, Error> {
    let reply = block_on(status::ask(&args.url))??;
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
