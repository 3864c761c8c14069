//! Where each setting came from: the command line, the environment variable its definition
//! names, the service's environment file (`pmcheck config`), or its default. Built from an
//! explicit argument list, so that provenance is tested without a process.

use std::collections::HashMap;
use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory as _, FromArgMatches as _};
use thiserror::Error;

use crate::cli::{Cli, StateArgs};
use crate::settings::env_file::EnvFile;
use crate::settings::{Daemon, Given, Puppet, Source};

/// A value of the service's environment file that the option it sets refuses.
#[derive(Debug, Error)]
#[error("{}: {var}={value}: {problem}; fix it in that file (`pmcheck serve --help` says what each takes)", path.display())]
pub struct EnvFileError {
    path: std::path::PathBuf,
    var: String,
    value: String,
    problem: String,
}

/// Where clap found each value of a subcommand: on the command line, in the environment variable
/// its definition names, or its default. The only place that turns clap's matches into
/// [`Given`] settings, so an option's name, variable and default are each written once.
pub struct Provenance<'a> {
    matches: &'a ArgMatches,
    command: clap::Command,
    /// Options whose value `config` took from the service's environment file, by id.
    from_file: HashMap<String, Source>,
}

impl<'a> Provenance<'a> {
    /// The subcommand's matches and definition.
    pub fn of(matches: &'a ArgMatches) -> Self {
        let cli = Cli::command();
        let (command, matches) = match matches.subcommand() {
            Some((name, sub)) => (cli.find_subcommand(name).cloned().unwrap_or(cli), sub),
            None => (cli, matches),
        };
        Self {
            matches,
            command,
            from_file: HashMap::new(),
        }
    }

    /// The settings given, each with where it came from.
    pub fn given(&self) -> Given {
        /// clap parsed what its definitions define: a failure here is pmcheck's bug.
        fn parsed<T>(e: clap::Error) -> T {
            panic!("pmcheck bug: the settings given: {e}")
        }
        let ids: Vec<&str> = (self.command.get_arguments())
            .map(|arg| arg.get_id().as_str())
            .collect();
        Given {
            puppet: Puppet::from_arg_matches(self.matches).unwrap_or_else(parsed),
            state_dir: StateArgs::from_arg_matches(self.matches)
                .unwrap_or_else(parsed)
                .state_dir,
            daemon: (ids.contains(&"interval"))
                .then(|| Daemon::from_arg_matches(self.matches).unwrap_or_else(parsed)),
            sources: (ids.iter())
                .map(|&id| (id.to_owned(), self.source(id)))
                .collect(),
        }
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

    /// The environment variable of option `id`, as its definition names it.
    fn env(&self, id: &str) -> String {
        self.command
            .get_arguments()
            .find(|arg| arg.get_id() == id)
            .and_then(|arg| arg.get_env())
            .map(|var| var.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The settings of `argv` (parsed into `matches`) with what the service's environment
    /// `file` sets for options nobody gave on the command line or in the environment: parsed
    /// again with those values as flags, so that clap checks them as it checks flags.
    pub fn with_env_file(
        argv: &[OsString],
        matches: &ArgMatches,
        file: &EnvFile,
    ) -> Result<Given, ProvenanceError> {
        let sub = Provenance::of(matches);
        let mut argv = argv.to_vec();
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
            .map_err(|e| ProvenanceError::Reparse(e.to_string()))?;
        let mut provenance = Provenance::of(&all);
        provenance.from_file = from_file;
        Ok(provenance.given())
    }
}

/// Why the environment file's values cannot be taken.
#[derive(Debug, Error)]
pub enum ProvenanceError {
    /// A value the option it sets refuses.
    #[error(transparent)]
    EnvFile(#[from] EnvFileError),
    /// The command line with the file's values no longer parses (a bug: each was checked).
    #[error("the command line with the environment file's values: {0}")]
    Reparse(String),
}

/// The `PMCHECK_*` names among `names` that no option of any command reads, each said in words
/// with the name it most likely meant (and, unless `set` says that one is set, its value): a
/// typo in /etc/default/pmcheck (`PMCHECK_DRAINED_STAUTS`) would otherwise change nothing, and
/// say nothing.
pub fn unread_names<'a>(
    names: impl IntoIterator<Item = &'a str>,
    set: impl Fn(&str) -> bool,
) -> Vec<(&'a str, String)> {
    let known: Vec<String> = every_argument(&Cli::command())
        .filter_map(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    let mut unread: Vec<_> = names
        .into_iter()
        .filter(|n| n.starts_with("PMCHECK_") && !known.iter().any(|k| k == n))
        .map(|n| {
            let meant = known
                .iter()
                .map(|k| (strsim::levenshtein(n, k), k))
                .filter(|(d, _)| *d <= 3)
                .min()
                .map(|(_, k)| k.as_str());
            (n, said(n, meant, &set))
        })
        .collect();
    unread.sort();
    unread.dedup();
    unread
}

/// [`unread_names`]'s finding in words: `NAME is read by no option (did you mean OTHER?)`,
/// and, when `set` says OTHER is not set either, the value OTHER keeps: a drain answered 503
/// instead of 404 is a DOWN server in the shipped backend, which the typo alone does not say.
fn said(name: &str, meant: Option<&str>, set: &impl Fn(&str) -> bool) -> String {
    match meant {
        Some(meant) if !set(meant) => format!(
            "{name} is read by no option of pmcheck (did you mean {meant}?): it changes nothing; \
             {meant} keeps {}",
            default_of(meant)
                .map_or_else(|| "no value".to_owned(), |d| format!("its default, {d}"))
        ),
        Some(meant) => format!(
            "{name} is read by no option of pmcheck (did you mean {meant}?): it changes nothing"
        ),
        None => format!(
            "{name} is read by no option of pmcheck (see `pmcheck config` for every name): it changes nothing"
        ),
    }
}

/// The options of every subcommand, then the top level's.
fn every_argument(cli: &clap::Command) -> impl Iterator<Item = &clap::Arg> {
    (cli.get_subcommands())
        .flat_map(clap::Command::get_arguments)
        .chain(cli.get_arguments())
}

/// The default of the option the variable `env` sets, as `pmcheck config` shows it.
fn default_of(env: &str) -> Option<String> {
    let cli = Cli::command();
    let arg = every_argument(&cli).find(|a| a.get_env().is_some_and(|e| e == env))?;
    let values: Vec<String> = (arg.get_default_values().iter())
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

/// When clap refused a value that came from the environment, which variable held it and where
/// the service reads it: clap's message names a flag nobody typed.
pub fn env_hint(error: &clap::Error, args: &[String]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(arg)) = error.get(ContextKind::InvalidArg) else {
        return None;
    };
    let long = arg.split_whitespace().next()?.strip_prefix("--")?;
    let typed = format!("--{long}");
    if args
        .iter()
        .any(|a| *a == typed || a.starts_with(&format!("{typed}=")))
    {
        return None;
    }
    let cli = Cli::command();
    let var = every_argument(&cli)
        .find(|a| a.get_long() == Some(long))?
        .get_env()?
        .to_owned();
    let value = std::env::var_os(&var)?;
    Some(format!(
        "hint: {typed} was not given: its value came from the environment, {}={}; the service \
         reads it from /etc/default/pmcheck (/etc/sysconfig/pmcheck on RPM systems): fix it there",
        var.to_string_lossy(),
        value.to_string_lossy()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_name_is_unread_and_the_meant_one_named() {
        let names = [
            "PMCHECK_DRAINED_STAUTS",
            "PMCHECK_INTERVAL",
            "PATH",
            "PMCHECK_NOTHING_LIKE_IT",
            "PMCHECK_DRAINED_STAUTS",
        ];
        let unread = unread_names(names, |_| true);
        assert_eq!(
            unread.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            ["PMCHECK_DRAINED_STAUTS", "PMCHECK_NOTHING_LIKE_IT"]
        );
        assert!(
            unread[0]
                .1
                .contains("(did you mean PMCHECK_DRAINED_STATUS?)"),
            "{unread:?}"
        );
        assert!(unread[1].1.contains("(see `pmcheck config`"), "{unread:?}");
    }

    /// What the packages set or document (/etc/default/pmcheck, the units, xinetd, the Puppet
    /// module) is read by an option: the warning never fires on a shipped name.
    #[test]
    fn every_name_the_packages_use_is_read() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut names = Vec::new();
        let mut dirs = vec![root.join("packaging"), root.join("systemd")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if let Ok(text) = std::fs::read_to_string(&path) {
                    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                        if word.len() > "PMCHECK_".len() && word.starts_with("PMCHECK_") {
                            names.push(word.to_owned());
                        }
                    }
                }
            }
        }
        assert!(names.len() > 20, "{names:?}");
        assert_eq!(
            unread_names(names.iter().map(String::as_str), |_| true),
            vec![]
        );
    }
    use crate::settings::{Host, Settings};
    use clap::FromArgMatches;
    use std::time::Duration;

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
        let daemon = given
            .daemon
            .as_ref()
            .expect("serve takes the daemon's options");
        assert_eq!(daemon.interval, Duration::from_secs(5));
        assert_eq!(*given.source("interval"), Source::Flag);
        assert_eq!(daemon.allow[0].to_string(), "10.0.0.0/8");
        assert_eq!(daemon.listen, Vec::<std::net::SocketAddr>::new());
        assert_eq!(*given.source("listen"), Source::Default("built in".into()));
        assert_eq!(daemon.max_connections, 1024);
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
        assert_eq!(given.puppet.certname, None);
        assert_eq!(given.puppet.timeout, Duration::from_millis(1500));
        assert_eq!(*given.source("timeout"), Source::Default("built in".into()));
        assert_eq!(given.state_dir, std::path::Path::new("/var/lib/pmcheck"));
    }

    /// `config` with the service's environment file, from an explicit argument list: what the
    /// file sets fills what the command line left, and says which file and variable it was.
    #[test]
    fn the_environment_file_fills_what_nobody_gave() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pmcheck");
        let text = "PMCHECK_INTERVAL=7s\nPMCHECK_TIMEOUT=2s\n";
        let file = EnvFile::parse(&path, text);
        let argv: Vec<OsString> = ["pmcheck", "config", "--timeout", "3s"]
            .map(OsString::from)
            .to_vec();
        let matches = Cli::command().try_get_matches_from(&argv).unwrap();
        let given = Provenance::with_env_file(&argv, &matches, &file).unwrap();
        let daemon = given
            .daemon
            .as_ref()
            .expect("config takes the daemon's options");
        assert_eq!(daemon.interval, Duration::from_secs(7));
        assert_eq!(
            *given.source("interval"),
            Source::EnvFile(Box::new((path.clone(), "PMCHECK_INTERVAL".to_owned())))
        );
        assert_eq!(
            given.puppet.timeout,
            Duration::from_secs(3),
            "the command line wins"
        );
        assert_eq!(*given.source("timeout"), Source::Flag);
        let bad = EnvFile::parse(&path, "PMCHECK_INTERVAL=soon\n");
        let e = Provenance::with_env_file(&argv, &matches, &bad)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("{}: PMCHECK_INTERVAL=soon: ", path.display())),
            "{e}"
        );
    }
}
