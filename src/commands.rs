//! The subcommands: the one place that turns clap's structs into settings and errors into
//! exit codes.

use std::ffi::OsString;
use std::time::Duration;

use clap::ArgMatches;
use thiserror::Error;

use crate::cli::{Cli, Command, DaemonUrl, Generate, StatusArgs};
use crate::console::{errln, out, outln};
use crate::drain::roll::RollError;
use crate::exit::Exit;
use crate::operator::cycle::{self, CycleError};
use crate::operator::daemon::{self, Daemon};
use crate::operator::drain::{self, ChangeError};
use crate::operator::guard::GuardError;
use crate::operator::wait::WaitError;
use crate::operator::{check, config, manual, run_single_threaded, status, stop};
use crate::provenance::{Provenance, ProvenanceError};
use crate::responder::bind::{self, ListenError};
use crate::responder::{heartbeat, inetd, server, signals};
use crate::settings::lb_proof::LbProof;
use crate::settings::{Given, Host, Settings, SettingsError};
use crate::systemd;

/// Why a command failed; each becomes its exit code in [`Error::exit`].
#[derive(Debug, Error)]
pub enum Error {
    /// The settings cannot be resolved.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// A listen address cannot be bound.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// `drain` or `undrain` failed.
    #[error(transparent)]
    Change(#[from] ChangeError),
    /// The daemon cannot be asked.
    #[error(transparent)]
    Status(#[from] daemon::StatusError),
    /// systemd's sockets are unusable.
    #[error(transparent)]
    Systemd(#[from] systemd::SystemdError),
    /// `cycle` stopped before the end.
    #[error(transparent)]
    Cycle(#[from] CycleError),
    /// A value of the service's environment file is refused.
    #[error(transparent)]
    EnvFile(#[from] ProvenanceError),
    /// `status --history`: the event log cannot be read.
    #[error(transparent)]
    History(#[from] drain::HistoryError),
    /// `roll`: another roll's mark, or the mark cannot be read or changed.
    #[error(transparent)]
    Roll(#[from] RollError),
    /// Any other system error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// How the command ends.
    pub fn exit(&self) -> Exit {
        match self {
            Error::Settings(_) | Error::EnvFile(_) => Exit::Config,
            Error::Listen(e) => e.exit(),
            Error::Change(e) => match e {
                ChangeError::Drain(_) | ChangeError::Guard(GuardError::Drain(_)) => {
                    Exit::CantCreate
                }
                ChangeError::Wait(_, e) => wait_exit(e),
                ChangeError::Guard(GuardError::LetGo(_)) => Exit::Warning,
                ChangeError::Guard(GuardError::Unasked(_)) => Exit::Unavailable,
                ChangeError::Guard(GuardError::Daemon(e)) => status_exit(e),
                ChangeError::Guard(_) | ChangeError::Held(_) => Exit::Refused,
            },
            Error::Status(e) => status_exit(e),
            Error::Roll(RollError::Locked(_) | RollError::Write { .. }) => Exit::CantCreate,
            Error::Roll(RollError::Unnamed | RollError::Misplaced { .. }) => Exit::Usage,
            Error::Roll(_) => Exit::Refused,
            Error::Systemd(_) | Error::Io(_) | Error::History(_) => Exit::OsErr,
            Error::Cycle(e) => match e {
                CycleError::NoDaemon(e) => wait_exit(e),
                CycleError::Guard(GuardError::Daemon(e)) => status_exit(e),
                CycleError::Drain(_) => Exit::CantCreate,
                CycleError::Turn { .. }
                | CycleError::EmptyBackend { .. }
                | CycleError::Guard(GuardError::KeyFile(_)) => Exit::Refused,
                CycleError::Guard(_) => Exit::Unavailable,
                // Puppet Server did not come back in time (as opposed to a drain or undrain wait).
                CycleError::Wait {
                    step: cycle::Step::WaitHealthy,
                    source: WaitError::TimedOut { .. },
                } => Exit::Critical,
                CycleError::Wait { source, .. } => wait_exit(source),
                CycleError::Command { .. } | CycleError::Released { .. } => Exit::Warning,
                CycleError::Interrupted(_) | CycleError::Unchanged => Exit::Interrupted,
            },
        }
    }
}

/// `status`: 69 when the daemon cannot be reached (as the waits), 64 for a bad --url.
fn status_exit(e: &daemon::StatusError) -> Exit {
    match e {
        daemon::StatusError::Url { .. } => Exit::Usage,
        daemon::StatusError::OtherVersion { .. } => Exit::Protocol,
        _ => Exit::Unavailable,
    }
}

fn wait_exit(e: &WaitError) -> Exit {
    match e {
        WaitError::OtherFile(_) => Exit::Config,
        WaitError::NoDaemon(e) => status_exit(e),
        WaitError::Held { .. } => Exit::Held,
        WaitError::TimedOut { .. } => Exit::TempFail,
        WaitError::Interrupted { .. } => Exit::Interrupted,
    }
}

/// Runs the command line `argv`, parsed into `cli` and `matches` (which tell where each value
/// came from).
pub fn run(cli: Cli, matches: &ArgMatches, argv: &[OsString]) -> Exit {
    let quiet = matches!(cli.command, Command::Inetd(_)) && inetd::stderr_is_the_connection();
    if !quiet {
        // A monitoring plugin prints its one line and nothing else on a healthy run: only
        // warnings, unless RUST_LOG asks for more.
        crate::logging::init(match cli.command {
            Command::Check(_) => "warn",
            _ => "info",
        });
    }
    command(cli.command, matches, argv).unwrap_or_else(|e| {
        // Under xinetd stderr is the connection: no stray text there.
        if !quiet {
            errln!("pmcheck: {e}");
        }
        e.exit()
    })
}

/// Runs `command`: those that say nothing of how they went end [`Exit::Ok`] unless they fail.
fn command(command: Command, matches: &ArgMatches, argv: &[OsString]) -> Result<Exit, Error> {
    let given = || Provenance::of(matches).given();
    let done = match command {
        Command::Serve(_) => return serve(&given()),
        Command::Inetd(args) => Ok(run_single_threaded(inetd::answer_one(&given(), &args))??),
        Command::Check(args) => return Ok(check::check(&given(), &args)),
        Command::Config(args) => {
            // The service's environment file under the process environment, as the unit gets
            // them.
            let file = config::env_file(args.env_file.as_deref())?;
            let given = match &file {
                Some(file) => Provenance::with_env_file(argv, matches, file)?,
                None => given(),
            };
            return Ok(config::config(&given, file.as_ref(), &args)?);
        }
        Command::Drain(args) => asking(drain::drain, &args, &args.waiting.daemon),
        Command::Undrain(args) => asking(drain::undrain, &args, &args.waiting.daemon),
        Command::Cycle(args) => asking(cycle::run, &args, &args.waiting.daemon),
        Command::Status(args) => return status_command(args),
        Command::Roll(args) => Ok(run_single_threaded(crate::operator::roll::roll(args))??),
        Command::OnStop(args) => Ok(run_single_threaded(stop::on_stop(&args))?),
        Command::OnStart(args) => {
            Ok(run_single_threaded(stop::on_start(&args))?.map_err(ChangeError::from)?)
        }
        Command::StopGuard(args) => Ok(stop::stop_guard(args)?),
        Command::Generate { what } => {
            // Made whole first, then written as the other commands write ([`crate::console`]).
            let mut text = Vec::new();
            match what {
                Generate::Man => manual::man(&mut text)?,
                Generate::Completions { shell } => {
                    let mut cli = <Cli as clap::CommandFactory>::command();
                    clap_complete::generate(shell, &mut cli, "pmcheck", &mut text);
                }
            }
            out!("{}", String::from_utf8_lossy(&text));
            Ok(())
        }
    };
    done.map(|()| Exit::Ok)
}

/// Runs `command` with `args` on one thread: an operator's command, which asks the daemon at
/// `--url`.
fn asking<A, E>(
    command: impl AsyncFnOnce(&A, &Daemon) -> Result<(), E>,
    args: &A,
    url: &DaemonUrl,
) -> Result<(), Error>
where
    Error: From<E>,
{
    let daemon = Daemon::new(&url.url)?;
    run_single_threaded(command(args, &daemon))?.map_err(Error::from)
}

fn serve(given: &Given) -> Result<Exit, Error> {
    let settings = Settings::resolve(given, &Host::REAL)?;
    // Under systemd the environment is /etc/default/pmcheck: a misspelt name there is said
    // once, where the operator looks (`pmcheck config` says it before the restart).
    let environment: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .collect();
    let names = environment.iter().map(String::as_str);
    let set = |n: &str| std::env::var_os(n).is_some();
    for (name, said) in crate::provenance::unread_names(names, set) {
        tracing::warn!(variable = name, warning = %said, "a variable no option reads");
    }
    let Some(daemon) = &settings.given.daemon else {
        unreachable!("`serve` takes the daemon's options, so its settings have them");
    };
    // A key file that cannot be used never stops the daemon: pushed to every master at once,
    // that would empty the backends. Said loudly; nothing proves a poll until it is fixed.
    let (proof, unusable) = LbProof::of(daemon);
    if let Some(e) = unusable {
        tracing::error!(
            error = %e,
            "the load balancer key file is unusable: pmcheck answers the load balancers as always, but no poll proves itself: `drain` and `cycle` refuse (exit 77) unless --force, the waits go by HAProxy's timing, and `pmcheck status` says so. Fix the file, then `systemctl reload pmcheck` (`pmcheck config --check` tells first)"
        );
    }
    for warning in proof.warnings() {
        tracing::warn!(%warning, "a load balancer key is bound too widely");
    }
    // Before any thread exists: taking systemd's sockets clears LISTEN_FDS from the environment.
    let listeners = match systemd::listeners()? {
        Some(inherited) => {
            if !daemon.listen.is_empty() {
                tracing::warn!(
                    "ignoring --listen/PMCHECK_LISTEN: systemd passed the listening sockets (change ListenStream= in pmcheck.socket instead)"
                );
            }
            inherited
        }
        None => bind::bind(&daemon.listen)?,
    };
    let listeners = server::Listeners {
        http: listeners,
        agent: bind::bind_each(&daemon.agent_listen, "--agent-listen")?,
    };
    let notifier = systemd::Notifier::from_env();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (reload, reloads) = tokio::sync::watch::channel(());
        let stopped = signals::stop_requested(reload)?;
        let ready = |progress| {
            if let Some(n) = &notifier {
                n.notify("READY=1\nSTATUS=answering polls");
                if let Some(watchdog) = heartbeat::watchdog(n, progress) {
                    tokio::spawn(watchdog);
                }
            }
        };
        server::serve(&settings, daemon, proof, listeners, reloads, ready, async {
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

fn status_command(args: StatusArgs) -> Result<Exit, Error> {
    if let Some(n) = args.history {
        drain::history(&args.state.state_dir, n.into(), args.json)?;
        return Ok(Exit::Ok);
    }
    let reply = match Daemon::new(&args.daemon.url) {
        Ok(daemon) => run_single_threaded(daemon.reply(&Default::default()))?,
        Err(e) => Err(e),
    };
    let reply = match reply {
        Ok(reply) => reply,
        // A script reading --json gets JSON whatever happens, and the exit says which case.
        Err(e) if args.json => {
            let exit = status_exit(&e);
            outln!(
                "{}",
                serde_json::json!({"error": e.to_string(), "url": args.daemon.url, "exit": exit.code()})
            );
            return Ok(exit);
        }
        Err(e) => return Err(e.into()),
    };
    if args.json {
        out!("{}", reply.body);
    } else {
        // Who holds the node out, from the record on this host: a cycle that stopped half-way
        // keeps it drained until `pmcheck undrain`, and says so nowhere else.
        let file = crate::drain::file::DrainFile::new(&args.state.state_dir);
        let holders = crate::drain::record::Drain::holders_of(file.current());
        let roll = crate::operator::roll::line(&args.state.state_dir, std::time::SystemTime::now());
        out!("{}", status::describe(&reply, &holders, roll.as_deref()));
    }
    Ok(match reply.status {
        200 => Exit::Ok,
        _ => Exit::Warning,
    })
}
