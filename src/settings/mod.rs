//! pmcheck's resolved settings: command line and environment over puppet.conf over defaults,
//! each value with where it came from.

pub mod duration;
pub mod puppet_conf;

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use self::puppet_conf::{Layout, PuppetConf, PuppetConfError, Resolver, Source, Webserver};
use crate::cli::{PuppetArgs, StateArgs};
use crate::puppet::identity::IdentityFiles;
use crate::puppet::probe::{DEFAULT_STATUS_PATH, ProbeTarget};

/// The deadline of one probe when nothing else is said.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(1500);

#[derive(Debug, Error)]
pub enum SettingsError {
    #[error("--puppet-conf {path}: {source}; pass the path of an existing puppet.conf")]
    PuppetConfMissing {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    PuppetConf(#[from] PuppetConfError),
    #[error("--puppet-addr {value}: {detail}; write HOST:PORT, for example 127.0.0.1:8140")]
    PuppetAddr { value: String, detail: String },
    #[error("serverport = {value} ({source_}): not a port number")]
    Port { value: String, source_: Source },
    #[error("--status-path {value}: must start with /, for example {DEFAULT_STATUS_PATH}")]
    StatusPath { value: String },
    #[error("--certname {value}: not a DNS name Puppet would use (letters, digits, '-', '.', '_')")]
    Certname { value: String },
}

/// What the host says where the configuration files are silent; tests pass their own.
pub struct Host {
    /// The FQDN, asked only when nothing sets the certname.
    pub fqdn: &'static dyn Fn() -> Result<String, String>,
    /// Puppet Server's webserver.conf for a layout.
    pub webserver: &'static dyn Fn(Layout) -> Option<Webserver>,
}

impl Host {
    /// This machine.
    pub const REAL: Host = Host {
        fqdn: &puppet_conf::fqdn,
        webserver: &Webserver::find,
    };
}

/// A value and where it came from.
#[derive(Debug, Clone)]
pub struct Setting<T> {
    pub value: T,
    pub source: Source,
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub puppet_conf: Setting<Option<PathBuf>>,
    pub certname: Setting<String>,
    pub ssldir: Setting<PathBuf>,
    pub hostcert: Setting<PathBuf>,
    pub hostprivkey: Setting<PathBuf>,
    pub localcacert: Setting<PathBuf>,
    pub puppet_addr: Setting<SocketAddr>,
    pub status_path: Setting<String>,
    pub timeout: Setting<Duration>,
    pub state_dir: Setting<PathBuf>,
}

/// Tells a value given on the command line from one read from the environment.
pub trait Origin {
    fn origin(&self, id: &str, env: &'static str) -> Source;
}

impl Settings {
    /// Resolves every setting. `origin` tells flags from environment variables.
    pub fn resolve(
        args: &PuppetArgs,
        state: &StateArgs,
        origin: &dyn Origin,
        host: &Host,
    ) -> Result<Self, SettingsError> {
        let fqdn = host.fqdn;
        let (conf, puppet_conf) = match &args.puppet_conf {
            Some(path) => {
                std::fs::metadata(path).map_err(|source| SettingsError::PuppetConfMissing {
                    path: path.clone(),
                    source,
                })?;
                let source = origin.origin("puppet_conf", "PMCHECK_PUPPET_CONF");
                (PuppetConf::load(path)?, Setting { value: Some(path.clone()), source })
            }
            None => match puppet_conf::find_default() {
                Some(path) => (
                    PuppetConf::load(&path)?,
                    Setting {
                        value: Some(path),
                        source: Source::Default("first existing of the AIO and Debian locations".into()),
                    },
                ),
                None => (
                    PuppetConf::default(),
                    Setting {
                        value: None,
                        source: Source::Default("neither /etc/puppetlabs/puppet/puppet.conf nor /etc/puppet/puppet.conf exists; Puppet's defaults apply".into()),
                    },
                ),
            },
        };

        let mut resolver = Resolver::new(&conf, fqdn);
        let overrides = [
            ("certname", "PMCHECK_CERTNAME", args.certname.clone()),
            ("hostcert", "PMCHECK_HOSTCERT", path_text(&args.hostcert)),
            (
                "hostprivkey",
                "PMCHECK_HOSTPRIVKEY",
                path_text(&args.hostprivkey),
            ),
            (
                "localcacert",
                "PMCHECK_LOCALCACERT",
                path_text(&args.localcacert),
            ),
        ];
        for (name, env, value) in overrides {
            if let Some(value) = value {
                resolver.set(name, value, origin.origin(name, env));
            }
        }
        let string = |name: &str| -> Result<Setting<String>, SettingsError> {
            let (value, source) = resolver.resolve(name)?;
            Ok(Setting { value, source })
        };
        let path = |name: &str| -> Result<Setting<PathBuf>, SettingsError> {
            let s = string(name)?;
            Ok(Setting {
                value: PathBuf::from(s.value),
                source: s.source,
            })
        };

        let certname = string("certname")?;
        if certname.value.is_empty()
            || !certname
                .value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        {
            return Err(SettingsError::Certname {
                value: certname.value,
            });
        }

        let puppet_addr = match &args.puppet_addr {
            Some(value) => Setting {
                value: parse_addr(value)?,
                source: origin.origin("puppet_addr", "PMCHECK_PUPPET_ADDR"),
            },
            None => default_puppet_addr((host.webserver)(conf.layout()), &string("serverport")?)?,
        };

        let status_path = match &args.status_path {
            Some(value) if !value.starts_with('/') => {
                return Err(SettingsError::StatusPath {
                    value: value.clone(),
                });
            }
            Some(value) => Setting {
                value: value.clone(),
                source: origin.origin("status_path", "PMCHECK_STATUS_PATH"),
            },
            None => Setting {
                value: DEFAULT_STATUS_PATH.to_owned(),
                source: Source::Default("built in".into()),
            },
        };
        let timeout = match args.timeout {
            Some(value) => Setting {
                value,
                source: origin.origin("timeout", "PMCHECK_TIMEOUT"),
            },
            None => Setting {
                value: DEFAULT_TIMEOUT,
                source: Source::Default("built in".into()),
            },
        };
        let state_dir = Setting {
            value: state.state_dir.clone(),
            source: origin.origin("state_dir", "PMCHECK_STATE_DIR"),
        };

        Ok(Self {
            ssldir: path("ssldir")?,
            hostcert: path("hostcert")?,
            hostprivkey: path("hostprivkey")?,
            localcacert: path("localcacert")?,
            puppet_conf,
            certname,
            puppet_addr,
            status_path,
            timeout,
            state_dir,
        })
    }

    /// What the probe needs from these settings.
    pub fn probe_target(&self) -> ProbeTarget {
        ProbeTarget {
            identity: IdentityFiles {
                hostcert: self.hostcert.value.clone(),
                hostprivkey: self.hostprivkey.value.clone(),
                localcacert: self.localcacert.value.clone(),
            },
            certname: self.certname.value.clone(),
            addr: self.puppet_addr.value,
            status_path: self.status_path.value.clone(),
            timeout: self.timeout.value,
        }
    }
}

/// `pmcheck config`'s table.
impl fmt::Display for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let conf = match &self.puppet_conf.value {
            Some(p) => p.display().to_string(),
            None => "(none)".into(),
        };
        let timeout = crate::settings::duration::format_duration(self.timeout.value);
        let rows: [(&str, String, &Source); 10] = [
            ("puppet-conf", conf, &self.puppet_conf.source),
            (
                "certname",
                self.certname.value.clone(),
                &self.certname.source,
            ),
            (
                "ssldir",
                self.ssldir.value.display().to_string(),
                &self.ssldir.source,
            ),
            (
                "hostcert",
                self.hostcert.value.display().to_string(),
                &self.hostcert.source,
            ),
            (
                "hostprivkey",
                self.hostprivkey.value.display().to_string(),
                &self.hostprivkey.source,
            ),
            (
                "localcacert",
                self.localcacert.value.display().to_string(),
                &self.localcacert.source,
            ),
            (
                "puppet-addr",
                self.puppet_addr.value.to_string(),
                &self.puppet_addr.source,
            ),
            (
                "status-path",
                self.status_path.value.clone(),
                &self.status_path.source,
            ),
            ("timeout", timeout, &self.timeout.source),
            (
                "state-dir",
                self.state_dir.value.display().to_string(),
                &self.state_dir.source,
            ),
        ];
        let width = rows.iter().map(|(_, v, _)| v.len()).max().unwrap_or(0);
        for (name, value, source) in rows {
            writeln!(f, "{name:<12} {value:<width$}  ({source})")?;
        }
        if let Some(warning) = state_dir_warning(&self.state_dir.value) {
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

fn path_text(path: &Option<PathBuf>) -> Option<String> {
    path.as_ref().map(|p| p.display().to_string())
}

/// Where Puppet Server listens: webserver.conf's ssl-port (and its ssl-host, unless that is a
/// wildcard), else 127.0.0.1 and puppet.conf's serverport, else 8140.
fn default_puppet_addr(
    webserver: Option<Webserver>,
    serverport: &Setting<String>,
) -> Result<Setting<SocketAddr>, SettingsError> {
    let loopback = IpAddr::from([127, 0, 0, 1]);
    if let Some(web) = webserver
        && let Some(port) = web.port
    {
        let host = web.host.filter(|h| !h.is_unspecified());
        let how = match host {
            Some(_) => "ssl-host and ssl-port",
            None => "127.0.0.1 and ssl-port",
        };
        return Ok(Setting {
            value: SocketAddr::new(host.unwrap_or(loopback), port),
            source: Source::Default(format!("{how} from {}", web.path.display())),
        });
    }
    let number: u16 = serverport
        .value
        .trim()
        .parse()
        .map_err(|_| SettingsError::Port {
            value: serverport.value.clone(),
            source_: serverport.source.clone(),
        })?;
    let how = match &serverport.source {
        Source::Default(_) => "127.0.0.1 and Puppet's default serverport".to_owned(),
        other => format!("127.0.0.1 and serverport from {other}"),
    };
    Ok(Setting {
        value: SocketAddr::new(loopback, number),
        source: Source::Default(how),
    })
}

/// HOST:PORT; a name is resolved once, at start.
fn parse_addr(value: &str) -> Result<SocketAddr, SettingsError> {
    if let Ok(addr) = value.parse() {
        return Ok(addr);
    }
    let fail = |detail: String| SettingsError::PuppetAddr {
        value: value.to_owned(),
        detail,
    };
    let addrs: Vec<SocketAddr> = value
        .to_socket_addrs()
        .map_err(|e| fail(e.to_string()))?
        .collect();
    // Jetty's default listener is IPv4 (ssl-host 0.0.0.0): `localhost` must not become ::1.
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| fail("the name has no address".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    struct AllFlags;
    impl Origin for AllFlags {
        fn origin(&self, _: &str, _: &'static str) -> Source {
            Source::Flag
        }
    }

    const HOST: Host = Host {
        fqdn: &|| Ok("node1.example.com".into()),
        webserver: &|_| None,
    };

    fn state() -> StateArgs {
        StateArgs {
            state_dir: "/var/lib/pmcheck".into(),
        }
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
        let args = PuppetArgs {
            puppet_conf: Some(conf.clone()),
            certname: Some("puppet01.example.com".into()),
            ..Default::default()
        };
        let s = Settings::resolve(&args, &state(), &AllFlags, &HOST).unwrap();
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

        // Puppet Server's own listener beats the port agents dial.
        let with_web = Host {
            webserver: &|_| {
                Some(Webserver::parse(
                    "/w.conf".into(),
                    "ssl-host: 0.0.0.0\nssl-port: 8150\n",
                ))
            },
            ..HOST
        };
        let s = Settings::resolve(&args, &state(), &AllFlags, &with_web).unwrap();
        assert_eq!(s.puppet_addr.value, "127.0.0.1:8150".parse().unwrap());
        assert!(s.puppet_addr.source.to_string().contains("/w.conf"));
    }

    #[test]
    fn bad_values_name_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.conf");
        let args = PuppetArgs {
            puppet_conf: Some(missing),
            ..Default::default()
        };
        let text = Settings::resolve(&args, &state(), &AllFlags, &HOST)
            .unwrap_err()
            .to_string();
        assert!(
            text.starts_with("--puppet-conf") && text.contains("missing.conf"),
            "{text}"
        );

        let conf = dir.path().join("puppet.conf");
        std::fs::write(&conf, "[main]\nserverport = eighty\n").unwrap();
        let args = PuppetArgs {
            puppet_conf: Some(conf.clone()),
            ..Default::default()
        };
        let text = Settings::resolve(&args, &state(), &AllFlags, &HOST)
            .unwrap_err()
            .to_string();
        assert!(text.contains("serverport = eighty"), "{text}");

        let args = PuppetArgs {
            puppet_conf: Some(conf),
            puppet_addr: Some("nowhere".into()),
            ..Default::default()
        };
        let text = Settings::resolve(&args, &state(), &AllFlags, &HOST)
            .unwrap_err()
            .to_string();
        assert!(text.starts_with("--puppet-addr nowhere"), "{text}");
    }
}
