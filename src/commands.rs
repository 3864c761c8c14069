//! The subcommands: the one place that turns clap's structs into settings and errors into
//! exit codes.

use std::collections::HashMap;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory as _};
use thiserror::Error;

use crate::cli::{Cli, Command, ConfigArgs, CycleArgs, Generate, StatusArgs};
use crate::exit::Exit;
use crate::operator::cycle::{self, Cycle, CycleError};
use crate::operator::drain::{self, ChangeError, wait_settings};
use crate::operator::wait::WaitError;
use crate::operator::{
    check, config, daemon, history, manual, run_single_threaded, runtime, status,
};
use crate::puppet::probe::ProbeTarget;
use crate::responder::bind::{self, ListenError};
use crate::responder::{inetd, server, signals, systemd};
use crate::settings::lb_proof::{LbKeyError, LbProof};
use crate::settings::{Daemon, Given, Host, Setting, Settings, SettingsError, Source};

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
    EnvFile(#[from] EnvFileError),
    /// The load balancers' key file is unusable.
    #[error(transparent)]
    LbKey(#[from] LbKeyError),
    /// `status --history`: the event log cannot be read.
    #[error(transparent)]
    History(#[from] history::HistoryError),
    /// Any other system error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// How the command ends.
    pub fn exit(&self) -> Exit {
        match self {
            Error::Settings(_) | Error::EnvFile(_) | Error::LbKey(_) => Exit::Config,
            Error::Listen(e) => e.exit(),
            Error::Change(e) => match e {
                ChangeError::Drain(_) => Exit::CantCreate,
                ChangeError::Wait(e) => wait_exit(e),
                ChangeError::LastServer(_) | ChangeError::Held(_) | ChangeError::BackedOff(_) => {
                    Exit::Refused
                }
                ChangeError::Io(_) => Exit::OsErr,
            },
            Error::Status(e) => status_exit(e),
            Error::Systemd(_) | Error::Io(_) | Error::History(_) => Exit::OsErr,
            Error::Cycle(e) => match e {
                CycleError::NoDaemon(e) => wait_exit(e),
                CycleError::Drain(_) => Exit::CantCreate,
                CycleError::LastServer(_) | CycleError::EmptyBackend { .. } => Exit::Refused,
                e if e.not_healthy() => Exit::Critical,
                CycleError::Wait { source, .. } => wait_exit(source),
                CycleError::Command { .. } | CycleError::Released { .. } => Exit::Warning,
                CycleError::Interrupted { .. } => Exit::Interrupted,
            },
        }
    }
}

/// `status`: 69 when the daemon cannot be reached (as the waits), 64 for a bad --url.
fn status_exit(e: &daemon::StatusError) -> Exit {
    match e {
        daemon::StatusError::Url { .. } => Exit::Usage,
        _ => Exit::Unavailable,
    }
}

fn wait_exit(e: &WaitError) -> Exit {
    match e {
        WaitError::OtherFile(_) => Exit::Config,
        WaitError::NoDaemon(_) => Exit::Unavailable,
        WaitError::TimedOut { .. } => Exit::TempFail,
        WaitError::Interrupted { .. } => Exit::Interrupted,
    }
}

/// Runs the parsed command line; `matches` tells where each value came from.
pub fn run(cli: Cli, matches: &ArgMatches) -> Exit {
    let quiet = matches!(cli.command, Command::Inetd(_)) && inetd::stderr_is_the_connection();
    if !quiet {
        // A monitoring plugin prints its one line and nothing else on a healthy run: only
        // warnings, unless RUST_LOG asks for more.
        let level = if matches!(cli.command, Command::Check(_)) {
            "warn"
        } else {
            "info"
        };
        crate::logging::init(level);
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
        Command::Check(args) => {
            return check::check(&given(), args.warn_expiry, args.crit_expiry);
        }
        Command::Config(args) => config_command(&args, matches),
        Command::Drain(args) => drain::drain(args).map(|()| Exit::Ok).map_err(Error::from),
        Command::Undrain(args) => drain::undrain(args).map(|()| Exit::Ok).map_err(Error::from),
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
    /// Options whose value `config` took from the service's environment file, by id.
    from_file: HashMap<String, Source>,
}

impl<'a> Provenance<'a> {
    /// The subcommand's matches and definition.
    fn of(matches: &'a ArgMatches) -> Self {
        let cli = <Cli as clap::CommandFactory>::command();
        match matches.subcommand() {
            Some((name, sub)) => Self {
                command: cli.find_subcommand(name).cloned().unwrap_or(cli),
                matches: sub,
                from_file: HashMap::new(),
            },
            None => Self {
                matches,
                command: cli,
                from_file: HashMap::new(),
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
            hostcrl: self.get("hostcrl"),
            puppet_addr: self.get("puppet_addr"),
            status_path: self.must("status_path"),
            timeout: self.must("timeout"),
            pause_grace: self.must("pause_grace"),
            wedged_after: self.must("wedged_after"),
            puppetserver_confd: self.get("puppetserver_confd"),
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
            lb_key_file: Setting {
                value: self
                    .get("lb_key_file")
                    .map(|s: Setting<std::path::PathBuf>| s.value),
                source: self.source("lb_key_file"),
            },
            lb_addresses: self.many("lb_address"),
            interval: self.must("interval"),
            max_connections: self.must("max_connections"),
            max_connections_per_source: self.must("max_connections_per_source"),
            slow_start: self.must("slow_start"),
            drained_status: self.must("drained_status"),
            code_environments: self.many("code_environment"),
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
        if let Some(source) = self.from_file.get(id) {
            return source.clone();
        }
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

/// `pmcheck config`: the settings with the service's environment file under the process
/// environment, as the unit gets them.
fn config_command(args: &ConfigArgs, matches: &ArgMatches) -> Result<Exit, Error> {
    let file = config::env_file(args.env_file.as_deref())?;
    let Some(file) = file else {
        let given = Provenance::of(matches).given();
        return Ok(config::config(
            &given,
            None,
            args.check,
            args.unit.as_deref(),
        )?);
    };
    // What the file sets, for options nobody gave on the command line or in the environment:
    // parsed again with those values as flags, so that clap checks them as it checks flags.
    let sub = Provenance::of(matches);
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut from_file = HashMap::new();
    for arg in sub.command.get_arguments() {
        let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        let id = arg.get_id().as_str();
        let var = var.to_string_lossy();
        let given = matches!(
            sub.matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        // An empty value is no value, as for the daemon (clap reads an empty variable so).
        if let Some(value) = file.get(&var).filter(|v| !given && !v.is_empty()) {
            let flag = format!("--{long}={value}");
            Cli::command()
                .try_get_matches_from(["pmcheck", "config", &flag])
                .map_err(|e| EnvFileError {
                    path: file.path.clone(),
                    var: var.to_string(),
                    value: value.to_owned(),
                    problem: e
                        .to_string()
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .trim_start_matches("error: ")
                        .to_owned(),
                })?;
            argv.push(flag.into());
            from_file.insert(
                id.to_owned(),
                Source::EnvFile(Box::new((file.path.clone(), var.to_string()))),
            );
        }
    }
    let all = Cli::command()
        .try_get_matches_from(argv)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut provenance = Provenance::of(&all);
    provenance.from_file = from_file;
    let given = provenance.given();
    Ok(config::config(
        &given,
        Some(&file),
        args.check,
        args.unit.as_deref(),
    )?)
}

/// A value of the service's environment file that the option it sets refuses.
#[derive(Debug, Error)]
#[error("{}: {var}={value}: {problem}; fix it in that file (`pmcheck serve --help` says what each takes)", path.display())]
pub struct EnvFileError {
    path: std::path::PathBuf,
    var: String,
    value: String,
    problem: String,
}

fn serve(given: &Given) -> Result<Exit, Error> {
    let settings = Settings::resolve(given, &Host::REAL)?;
    let Some(daemon) = &settings.daemon else {
        unreachable!("`serve` takes the daemon's options, so its settings have them");
    };
    let proof = LbProof::load(
        daemon.lb_key_file.value.as_deref(),
        daemon.lb_addresses.value.clone(),
    )?;
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
        agent: bind::bind_each(&daemon.agent_listen.value, "--agent-listen")?,
    };
    let notifier = systemd::Notifier::from_env();
    let rt = runtime(true)?;
    rt.block_on(async {
        let (reload, reloads) = tokio::sync::watch::channel(());
        let stopped = signals::stop_requested(reload)?;
        let ready = || {
            if let Some(n) = &notifier {
                n.notify("READY=1\nSTATUS=answering polls");
                if let Some(watchdog) = n.watchdog_task() {
                    tokio::spawn(watchdog);
                }
            }
        };
        server::serve(&settings, proof, listeners, reloads, ready, async {
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

fn cycle_command(args: CycleArgs) -> Result<Exit, Error> {
    let command = crate::operator::command::shown(&args.command);
    let reason = args.reason.unwrap_or_else(|| {
        let text = format!("pmcheck cycle: {}", command.trim_matches('`'));
        let text: String = text
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        text.chars()
            .take(crate::drain::record::REASON_LIMIT)
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
    if let Some(n) = args.history {
        history::show(&args.state.state_dir, n.into(), args.json)?;
        return Ok(Exit::Ok);
    }
    let reply = match run_single_threaded(daemon::ask(&args.url))? {
        Ok(reply) => reply,
        // A script reading --json gets JSON whatever happens, and the exit says which case.
        Err(e) if args.json => {
            let exit = status_exit(&e);
            println!(
                "{}",
                serde_json::json!({"error": e.to_string(), "url": args.url, "exit": exit.code()})
            );
            return Ok(exit);
        }
        Err(e) => return Err(e.into()),
    };
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
            "hostcert" | "hostprivkey" | "localcacert" | "hostcrl" => file(&format!("{long}.pem")),
            "puppet-addr" => "127.0.0.1:8141".into(),
            "status-path" => "/status/v1/simple/master".into(),
            "timeout" => "2s".into(),
            "pause-grace" => "45s".into(),
            "wedged-after" => "90s".into(),
            "puppetserver-confd" => file("confd"),
            "state-dir" => file("state"),
            "listen" => "127.0.0.1:9300".into(),
            "agent-listen" => "127.0.0.1:9301".into(),
            "allow" => "10.0.0.0/8".into(),
            "lb-key-file" => file("lb-key"),
            "lb-address" => "10.0.0.5/32".into(),
            "interval" => "3s".into(),
            "max-connections" => "100".into(),
            "max-connections-per-source" => "10".into(),
            "slow-start" => "30s".into(),
            "drained-status" => "404".into(),
            "code-environment" => "staging".into(),
            other => panic!("no sample value for --{other}: add one to this test"),
        }
    }

    /// `config`'s own options, which are not settings.
    const CONFIG_ONLY: [&str; 3] = ["check", "env-file", "unit"];

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
            .filter(|long| *long != "help" && !CONFIG_ONLY.contains(long))
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
            fqdn: &|| Err(crate::settings::host::FqdnError::Empty),
            exists: &|_| false,
            confd_file: &|_| None,
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
                .filter_map(|arg| arg.get_long())
                .filter(|long| !CONFIG_ONLY.contains(long))
                .map(str::to_owned)
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
