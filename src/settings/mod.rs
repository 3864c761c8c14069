//! pmcheck's resolved settings: command line and environment over puppet.conf over defaults,
//! each value with where it came from.

pub mod allow;
pub mod daemon;
pub mod duration;
pub mod env_file;
pub mod host;
pub mod lb_key;
pub mod lb_proof;
pub mod puppet_conf;
mod resolve;

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use thiserror::Error;

pub use self::daemon::{Daemon, Limits};
use self::duration::{parse_duration, parse_duration_or_off};
use self::host::FqdnError;
use self::puppet_conf::PuppetConfError;

/// The built-in defaults that other code reads too, or whose choice needs its reason (the rest
/// are written in [`crate::cli`] alone); clap shows them in `--help` and the man page.
pub mod defaults {
    /// Where `drain`, `undrain` and the daemon keep the drain record.
    pub const STATE_DIR: &str = "/var/lib/pmcheck";
    /// The status endpoint (Puppet Server >= 6.14).
    pub const STATUS_PATH: &str = "/status/v1/services/jruby-metrics";
    /// How long a paused JRuby pool (locked, or refilling after a flush) is answered OK:
    /// longer than a deploy's lock or a flush's refill (seconds), far shorter than Puppet
    /// Server's `borrow-timeout` (20 minutes), which bounds how long requests wait meanwhile.
    pub const PAUSE_GRACE: &str = "60s";
    /// A minute with nothing but failed borrows is no load spike (borrows then still succeed):
    /// ten times what HAProxy's `fall 3 inter 2s` takes to put a failing server out.
    pub const WEDGED_AFTER: &str = "60s";
    /// At most this many environments are read (`--code-environment`): each is a label value
    /// of the metrics, and a scrape stays small.
    pub const MAX_CODE_ENVIRONMENTS: usize = 16;
}

/// Why the settings cannot be resolved. Each names the setting and what to write instead.
#[derive(Debug, Error)]
pub enum SettingsError {
    /// `--puppet-conf` names a file that is not there.
    #[error("--puppet-conf {}: {source}; pass the path of an existing puppet.conf", path.display())]
    PuppetConfMissing {
        /// The path given.
        path: PathBuf,
        /// Why it cannot be examined.
        source: std::io::Error,
    },
    /// puppet.conf cannot be read or resolved.
    #[error(transparent)]
    PuppetConf(#[from] PuppetConfError),
    /// `--puppet-addr` cannot be resolved to an address.
    #[error("--puppet-addr {value}: {problem}; write HOST:PORT, for example 127.0.0.1:8140")]
    PuppetAddr {
        /// The value given.
        value: String,
        /// What the resolver said, or that the name has no address.
        problem: std::io::Error,
    },
    /// puppet.conf's serverport is not a port number.
    #[error("serverport = {value} ({source_}): not a port number")]
    Port {
        /// The value found.
        value: String,
        /// Where it was found.
        source_: Source,
    },
    /// The certname from puppet.conf is not a name Puppet would use.
    #[error("certname = {value} ({source_}): {CERTNAME_RULE}")]
    Certname {
        /// The value found.
        value: String,
        /// Where it was found.
        source_: Source,
    },
    /// `--code-environment` names more environments than a scrape carries.
    #[error(
        "--code-environment ({source_}): {count} environments; at most {}: name the ones \
         agents use",
        defaults::MAX_CODE_ENVIRONMENTS
    )]
    CodeEnvironments {
        /// How many were named.
        count: usize,
        /// Where they came from.
        source_: Source,
    },
    /// puppetserver.conf's `jruby-puppet.multithreaded` is not a boolean.
    #[error(
        "{}, line {line}: jruby-puppet.multithreaded = {value}: not a boolean; \
         write true or false (Puppet Server will not start with it either)",
        path.display()
    )]
    Multithreaded {
        /// The puppetserver.conf read.
        path: PathBuf,
        /// Its line.
        line: usize,
        /// The value found.
        value: String,
    },
}

/// What the host says where the configuration files are silent; tests pass their own, so
/// that no test depends on what the machine running it has installed.
pub struct Host {
    /// The FQDN, asked only when nothing sets the certname.
    pub fqdn: &'static dyn Fn() -> Result<String, FqdnError>,
    /// Whether a path exists: which puppet.conf is installed, and which layout's confdir.
    pub exists: &'static dyn Fn(&Path) -> bool,
    /// A file of Puppet Server's conf.d (webserver.conf, puppetserver.conf), if readable.
    pub confd_file: &'static dyn Fn(&Path) -> Option<String>,
}

impl Host {
    /// This machine.
    pub const REAL: Host = Host {
        fqdn: &host::fqdn,
        exists: &|path| path.exists(),
        confd_file: &host::read_confd_file,
    };
}

/// Where a value came from, so `pmcheck config` can tell an operator what to edit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Given on the command line.
    Flag,
    /// Read from this environment variable (the one named in the option's clap definition).
    Env(String),
    /// Read from the service's environment file (`/etc/default/pmcheck`): the file and the
    /// variable (boxed: a rare source need not make every setting larger).
    EnvFile(Box<(PathBuf, String)>),
    /// Read from puppet.conf.
    File {
        /// The puppet.conf file.
        path: PathBuf,
        /// Its section that held the value.
        section: String,
    },
    /// Nobody said: a default, and how it was worked out.
    Default(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Flag => f.write_str("command line"),
            Source::Env(var) => write!(f, "environment {var}"),
            Source::EnvFile(at) => write!(f, "{} {}", at.0.display(), at.1),
            Source::File { path, section } => write!(f, "{} [{section}]", path.display()),
            Source::Default(how) => write!(f, "default: {how}"),
        }
    }
}

/// A value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting<T> {
    /// The value.
    pub value: T,
    /// Where it came from.
    pub source: Source,
}

impl<T> Setting<T> {
    /// Nobody said: `value`, worked out as `how` says.
    fn by_default(value: T, how: String) -> Self {
        Self {
            value,
            source: Source::Default(how),
        }
    }

    /// The same source's value, made `U` by `f`.
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Setting<U> {
        Setting {
            value: f(self.value),
            source: self.source,
        }
    }
}

/// What the operator gave, on the command line or in the environment, and where each value
/// came from. Settings that puppet.conf or the host can supply are optional; the others always
/// carry clap's default.
#[derive(Debug, Clone)]
pub struct Given {
    /// How to find and reach Puppet Server.
    pub puppet: Puppet,
    /// `--state-dir`.
    pub state_dir: PathBuf,
    /// The daemon's own settings, for `serve` and `config`.
    pub daemon: Option<Daemon>,
    /// Where each value came from, by the option's id.
    pub sources: HashMap<String, Source>,
}

impl Given {
    /// Where the value of the option `id` came from.
    pub fn source(&self, id: &str) -> &Source {
        (self.sources.get(id))
            .unwrap_or_else(|| panic!("pmcheck bug: no source of the option `{id}`"))
    }

    /// `pmcheck config`'s row of the option `name` (its long name), showing `value`.
    fn row(&self, name: &'static str, value: String) -> Row<'_> {
        (name, value, self.source(&name.replace('-', "_")))
    }

    /// The value of the option `id` with where it came from, when it was given.
    fn setting<T: Clone>(&self, id: &str, value: &Option<T>) -> Option<Setting<T>> {
        Some(Setting {
            value: value.clone()?,
            source: self.source(id).clone(),
        })
    }
}

/// How to find and reach the local Puppet Server. Unset values come from puppet.conf.
#[derive(Debug, Clone, Args)]
pub struct Puppet {
    /// puppet.conf to read [default: first existing of /etc/puppetlabs/puppet/puppet.conf, /etc/puppet/puppet.conf]
    #[arg(long, env = "PMCHECK_PUPPET_CONF", value_name = "PATH")]
    pub(crate) puppet_conf: Option<PathBuf>,
    /// The certname: the TLS name verified, sent as SNI and as Host [default: from puppet.conf, else the FQDN]
    #[arg(long, env = "PMCHECK_CERTNAME", value_name = "NAME", value_parser = parse_certname)]
    pub(crate) certname: Option<String>,
    /// Client certificate [default: puppet.conf hostcert]
    #[arg(long, env = "PMCHECK_HOSTCERT", value_name = "PATH")]
    pub(crate) hostcert: Option<PathBuf>,
    /// Client private key (PKCS#1, SEC1 or PKCS#8 PEM) [default: puppet.conf hostprivkey]
    #[arg(long, env = "PMCHECK_HOSTPRIVKEY", value_name = "PATH")]
    pub(crate) hostprivkey: Option<PathBuf>,
    /// CA certificate(s) that must have signed Puppet Server's certificate [default: puppet.conf localcacert]
    #[arg(long, env = "PMCHECK_LOCALCACERT", value_name = "PATH")]
    pub(crate) localcacert: Option<PathBuf>,
    /// The CRL whose nextUpdate is watched (check, /metrics) [default: ssl-crl-path of Puppet Server's webserver.conf, else puppet.conf hostcrl]
    #[arg(long, env = "PMCHECK_HOSTCRL", value_name = "PATH")]
    pub(crate) hostcrl: Option<PathBuf>,
    /// Where to connect [default: ssl-host:ssl-port of Puppet Server's webserver.conf (127.0.0.1 for a wildcard host), else 127.0.0.1:<serverport from puppet.conf, else 8140>]
    #[arg(long, env = "PMCHECK_PUPPET_ADDR", value_name = "HOST:PORT")]
    pub(crate) puppet_addr: Option<String>,
    /// Status endpoint; the status service's 404 moves on to pe-jruby-metrics, /status/v1/simple/server, then /status/v1/simple/master
    #[arg(long, env = "PMCHECK_STATUS_PATH", value_name = "PATH", default_value = defaults::STATUS_PATH, value_parser = parse_status_path)]
    pub(crate) status_path: String,
    /// Deadline of one probe; Puppet Server gets a ?timeout=N below it
    #[arg(long, env = "PMCHECK_TIMEOUT", value_name = "DURATION", value_parser = parse_duration, default_value = "1500ms")]
    pub(crate) timeout: Duration,
    /// How long a JRuby pool that was ready since Puppet Server started may be locked or refilling (a code deploy, a pool flush) and still answer OK at the floor weight; 0s answers NOTREADY at once
    #[arg(long, env = "PMCHECK_PAUSE_GRACE", value_name = "DURATION", value_parser = parse_duration_or_off, default_value = defaults::PAUSE_GRACE)]
    pub(crate) pause_grace: Duration,
    /// How long a JRuby pool with none free may go without one successful borrow while borrows time out or are refused, before it is out (NOTREADY) until a borrow succeeds; 0s never puts a busy pool out
    #[arg(long, env = "PMCHECK_WEDGED_AFTER", value_name = "DURATION", value_parser = parse_duration_or_off, default_value = defaults::WEDGED_AFTER)]
    pub(crate) wedged_after: Duration,
    /// Puppet Server's conf.d, for webserver.conf (where it listens) and puppetserver.conf (jruby-puppet.multithreaded) [default: /etc/puppetlabs/puppetserver/conf.d, or /etc/puppet/puppetserver/conf.d with Debian's layout]
    #[arg(long, env = "PMCHECK_PUPPETSERVER_CONFD", value_name = "DIR")]
    pub(crate) puppetserver_confd: Option<PathBuf>,
}

/// pmcheck's resolved settings, each with where it came from.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The puppet.conf read, if any.
    pub puppet_conf: Setting<Option<PathBuf>>,
    /// The name verified in Puppet Server's certificate, sent as SNI and Host.
    pub certname: Setting<String>,
    /// Puppet's ssldir (shown; the three files below are what is used).
    pub ssldir: Setting<PathBuf>,
    /// This host's certificate.
    pub hostcert: Setting<PathBuf>,
    /// This host's private key.
    pub hostprivkey: Setting<PathBuf>,
    /// The Puppet CA certificate(s).
    pub localcacert: Setting<PathBuf>,
    /// The CRL whose dates are watched: webserver.conf's `ssl-crl-path` (what Puppet Server
    /// checks agents against), else puppet.conf's `hostcrl`.
    pub hostcrl: Setting<PathBuf>,
    /// puppet.conf's `environmentpath`: where the deploy records of `--code-environment` are
    /// (directories separated by `:`).
    pub environmentpath: Setting<String>,
    /// Where Puppet Server listens.
    pub puppet_addr: Setting<SocketAddr>,
    /// Puppet Server's conf.d (webserver.conf, puppetserver.conf).
    pub puppetserver_confd: Setting<PathBuf>,
    /// Puppet Server runs one multithreaded JRuby (puppetserver.conf).
    pub multithreaded: Setting<bool>,
    /// What they were resolved from, and the settings nothing else sets (the status path, the
    /// deadlines, the state directory, the daemon's own): the daemon resolves them again when
    /// Puppet's files change.
    pub given: Given,
}

/// A row of `pmcheck config`'s table: the setting, its value as shown, where it came from.
type Row<'a> = (&'a str, String, &'a Source);

/// The row of `s`, its value shown by `show`.
fn row<'a, T>(name: &'a str, s: &'a Setting<T>, show: impl Fn(&T) -> String) -> Row<'a> {
    (name, show(&s.value), &s.source)
}

/// `pmcheck config`'s table.
impl fmt::Display for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = |p: &PathBuf| p.display().to_string();
        let duration = |d: &Duration| duration::format_duration(*d);
        let given = &self.given;
        let mut rows = vec![
            row("puppet-conf", &self.puppet_conf, |p| {
                p.as_ref().map_or_else(|| "(none)".into(), path)
            }),
            row("certname", &self.certname, String::clone),
            row("ssldir", &self.ssldir, path),
            row("hostcert", &self.hostcert, path),
            row("hostprivkey", &self.hostprivkey, path),
            row("localcacert", &self.localcacert, path),
            row("hostcrl", &self.hostcrl, path),
            row("environmentpath", &self.environmentpath, String::clone),
            row("puppet-addr", &self.puppet_addr, ToString::to_string),
            given.row("status-path", given.puppet.status_path.clone()),
            given.row("timeout", duration(&given.puppet.timeout)),
            given.row("pause-grace", duration(&given.puppet.pause_grace)),
            given.row("wedged-after", duration(&given.puppet.wedged_after)),
            row("puppetserver-confd", &self.puppetserver_confd, path),
            row("multithreaded", &self.multithreaded, ToString::to_string),
            given.row("state-dir", path(&given.state_dir)),
        ];
        if let Some(daemon) = &given.daemon {
            rows.extend(daemon.rows(given));
        }
        let width = rows.iter().map(|(_, v, _)| v.len()).max().unwrap_or(0);
        for (name, value, source) in rows {
            writeln!(f, "{name:<26} {value:<width$}  ({source})")?;
        }
        if let Some(warning) = state_dir_warning(&given.state_dir) {
            writeln!(f, "warning: {warning}")?;
        }
        Ok(())
    }
}

/// A state directory that anybody may write lets anybody drain or undrain the node (or plant
/// a FIFO there); say so where the operator looks.
pub fn state_dir_warning(dir: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir).ok()?.permissions().mode();
    (mode & 0o002 != 0).then(|| {
        format!(
            "state directory {} is writable by every user (mode {:o}): anybody may drain or \
             undrain this node; make it 0755 (chmod 755 {})",
            dir.display(),
            mode & 0o7777,
            dir.display()
        )
    })
}

/// What Puppet allows in a certname.
const CERTNAME_RULE: &str = "not a DNS name Puppet would use (letters, digits, '-', '.', '_')";

/// A certname as Puppet allows it; for clap, and for the one puppet.conf gives.
pub fn parse_certname(text: &str) -> Result<String, String> {
    let valid = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    valid
        .then(|| text.to_owned())
        .ok_or_else(|| CERTNAME_RULE.to_owned())
}

/// A status path for clap: an absolute path on Puppet Server.
pub fn parse_status_path(text: &str) -> Result<String, String> {
    (text.starts_with('/'))
        .then(|| text.to_owned())
        .ok_or_else(|| format!("must start with /, for example {}", defaults::STATUS_PATH))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A host with no Puppet installed: whatever the machine running the tests has.
    const HOST: Host = Host {
        fqdn: &|| Ok("node1.example.com".into()),
        exists: &|_| false,
        confd_file: &|_| None,
    };

    /// A host with Debian's Puppet packages (confdir /etc/puppet).
    const DEBIAN: Host = Host {
        exists: &|path| path == Path::new("/etc/puppet"),
        ..HOST
    };

    /// What `pmcheck check ARGS` gives, nothing from the environment.
    fn given(args: &[&str]) -> Given {
        use clap::CommandFactory as _;
        let argv = ["pmcheck", "check"].iter().chain(args);
        let matches = crate::cli::Cli::command().get_matches_from(argv);
        crate::provenance::Provenance::of(&matches).given()
    }

    /// A path as an argument.
    fn arg(path: &Path) -> &str {
        path.to_str().unwrap()
    }

    #[test]
    fn puppet_conf_feeds_paths_and_port_and_flags_override() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("puppet.conf");
        std::fs::write(
            &conf,
            "[main]\nssldir = /ssl\n[server]\nserverport = 8141\n",
        )
        .unwrap();
        let given = given(&[
            "--puppet-conf",
            arg(&conf),
            "--certname",
            "puppet01.example.com",
        ]);
        let s = Settings::resolve(&given, &HOST).unwrap();
        assert_eq!(
            s.hostcert.value,
            Path::new("/ssl/certs/puppet01.example.com.pem")
        );
        assert_eq!(s.localcacert.value, Path::new("/ssl/certs/ca.pem"));
        assert_eq!(s.puppet_addr.value, "127.0.0.1:8141".parse().unwrap());
        assert_eq!(s.certname.source, Source::Flag);
        let table = s.to_string();
        assert!(table.contains("[server]"), "{table}");
        assert!(table.contains(&conf.display().to_string()), "{table}");
    }

    #[test]
    fn puppet_servers_own_listener_beats_the_port_agents_dial() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("puppet.conf");
        std::fs::write(&conf, "[server]\nserverport = 8141\n").unwrap();
        let given = given(&["--puppet-conf", arg(&conf)]);
        let with_web = Host {
            confd_file: &|path| {
                (path == Path::new("/etc/puppet/puppetserver/conf.d/webserver.conf"))
                    .then(|| "ssl-host: 0.0.0.0\nssl-port: 8150\n".into())
            },
            ..DEBIAN
        };
        let s = Settings::resolve(&given, &with_web).unwrap();
        assert_eq!(s.puppet_addr.value, "127.0.0.1:8150".parse().unwrap());
        assert!(
            s.puppet_addr
                .source
                .to_string()
                .contains("/etc/puppet/puppetserver/conf.d/webserver.conf"),
            "{:?}",
            s.puppet_addr.source
        );
        assert!(!s.multithreaded.value);
    }

    /// The CRL watched is the one Puppet Server checks agents against (webserver.conf's
    /// `ssl-crl-path`), else puppet.conf's `hostcrl`; `--hostcrl` beats both.
    #[test]
    fn the_crl_is_puppet_servers_own_else_puppet_confs() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("puppet.conf");
        std::fs::write(&conf, "[main]\nssldir = /ssl\n").unwrap();
        let given = given(&["--puppet-conf", arg(&conf)]);
        let s = Settings::resolve(&given, &HOST).unwrap();
        assert_eq!(s.hostcrl.value, Path::new("/ssl/crl.pem"));
        let with_crl = Host {
            confd_file: &|path| {
                path.ends_with("webserver.conf").then(|| {
                    "webserver: {\n    ssl-port: 8140\n    ssl-crl-path: /etc/puppet/ca/crl.pem\n}\n"
                        .into()
                })
            },
            ..HOST
        };
        let s = Settings::resolve(&given, &with_crl).unwrap();
        assert_eq!(s.hostcrl.value, Path::new("/etc/puppet/ca/crl.pem"));
        assert!(
            s.hostcrl.source.to_string().contains("ssl-crl-path in "),
            "{:?}",
            s.hostcrl.source
        );
        let flagged =
            super::tests::given(&["--puppet-conf", arg(&conf), "--hostcrl", "/mine/crl.pem"]);
        let s = Settings::resolve(&flagged, &with_crl).unwrap();
        assert_eq!(s.hostcrl.value, Path::new("/mine/crl.pem"));
    }

    /// Puppet's default environmentpath is `$codedir/environments`; puppet.conf's wins; one
    /// that cannot be resolved is shown as such, and the rest still resolves.
    #[test]
    fn the_environmentpath_is_puppets() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("puppet.conf");
        std::fs::write(&conf, "[main]\ncodedir = /code\n").unwrap();
        let given = given(&["--puppet-conf", arg(&conf)]);
        let s = Settings::resolve(&given, &HOST).unwrap();
        assert_eq!(s.environmentpath.value, "/code/environments");
        std::fs::write(&conf, "[server]\nenvironmentpath = /a:$codedir/b\n").unwrap();
        let s = Settings::resolve(&given, &HOST).unwrap();
        assert_eq!(
            s.environmentpath.value, "/a:/etc/puppetlabs/code/b",
            "{s:?}"
        );
        let s = Settings::resolve(&given, &DEBIAN).unwrap();
        assert_eq!(s.environmentpath.value, "/a:/etc/puppet/code/b", "{s:?}");
        std::fs::write(&conf, "[server]\nenvironmentpath = $nosuchsetting/x\n").unwrap();
        let s = Settings::resolve(&given, &HOST).unwrap();
        assert_eq!(s.environmentpath.value, "");
        assert!(
            s.environmentpath
                .source
                .to_string()
                .contains("cannot be resolved"),
            "{:?}",
            s.environmentpath.source
        );
    }

    #[test]
    fn puppetserver_conf_says_whether_the_jruby_is_multithreaded() {
        let given = given(&["--puppetserver-confd", "/srv/confd"]);
        let host = |text: &'static str| -> Host {
            let file: &'static dyn Fn(&Path) -> Option<String> =
                Box::leak(Box::new(move |path: &Path| {
                    (path == Path::new("/srv/confd/puppetserver.conf")).then(|| text.into())
                }));
            Host {
                confd_file: file,
                ..HOST
            }
        };
        let conf = "jruby-puppet: {\n    ruby-load-path: [/usr/lib/puppetserver/ruby/vendor_ruby]\n    \
                    # multithreaded: false\n    multithreaded: true\n    max-active-instances: 3\n}\n";
        let s = Settings::resolve(&given, &host(conf)).unwrap();
        assert!(s.multithreaded.value);
        assert!(
            s.multithreaded
                .source
                .to_string()
                .contains("jruby-puppet.multithreaded in /srv/confd/puppetserver.conf"),
            "{}",
            s.multithreaded.source
        );
        let s = Settings::resolve(&given, &host("jruby-puppet.multithreaded = false\n")).unwrap();
        assert!(!s.multithreaded.value);
        let s =
            Settings::resolve(&given, &host("http-client: {\n  multithreaded: true\n}\n")).unwrap();
        assert!(!s.multithreaded.value, "another block's key");
        let e = Settings::resolve(
            &given,
            &host("jruby-puppet: {\n  multithreaded: maybe\n}\n"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("/srv/confd/puppetserver.conf, line 2")
                && e.contains("multithreaded = maybe")
                && e.contains("write true or false"),
            "{e}"
        );
        let s = Settings::resolve(&given, &HOST).unwrap();
        assert!(!s.multithreaded.value);
        assert!(
            s.multithreaded
                .source
                .to_string()
                .contains("no readable puppetserver.conf in /srv/confd"),
            "{}",
            s.multithreaded.source
        );
    }

    #[test]
    fn a_missing_puppet_conf_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let given = given(&["--puppet-conf", arg(&dir.path().join("missing.conf"))]);
        let text = Settings::resolve(&given, &HOST).unwrap_err().to_string();
        assert!(
            text.starts_with("--puppet-conf") && text.contains("missing.conf"),
            "{text}"
        );
    }

    #[test]
    fn a_bad_serverport_is_quoted_with_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("puppet.conf");
        std::fs::write(&conf, "[main]\nserverport = eighty\n").unwrap();
        let given = given(&["--puppet-conf", arg(&conf)]);
        let text = Settings::resolve(&given, &HOST).unwrap_err().to_string();
        assert!(text.contains("serverport = eighty"), "{text}");
        assert!(text.contains(&conf.display().to_string()), "{text}");
    }

    #[test]
    fn an_unresolvable_puppet_addr_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("puppet.conf");
        std::fs::write(&conf, "").unwrap();
        let given = given(&["--puppet-conf", arg(&conf), "--puppet-addr", "nowhere"]);
        let text = Settings::resolve(&given, &HOST).unwrap_err().to_string();
        assert!(text.starts_with("--puppet-addr nowhere"), "{text}");
    }

    #[test]
    fn a_certname_from_puppet_conf_is_checked_like_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("puppet.conf");
        std::fs::write(&conf, "[main]\ncertname = bad name\n").unwrap();
        let given = given(&["--puppet-conf", arg(&conf)]);
        let text = Settings::resolve(&given, &HOST).unwrap_err().to_string();
        assert!(text.starts_with("certname = bad name ("), "{text}");
        assert!(parse_certname("bad name").is_err());
        assert!(parse_certname("node-1.example_x.com").is_ok());
    }
}
