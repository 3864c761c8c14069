//! Resolving the settings: what was given beats puppet.conf, which beats Puppet's defaults;
//! Puppet Server's own files (webserver.conf, puppetserver.conf) say where it listens, which
//! CRL it checks and whether it runs one multithreaded JRuby. One function per concern.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs as _};
use std::path::PathBuf;

use crate::settings::daemon::Daemon;
use crate::settings::host::Webserver;
use crate::settings::puppet_conf::{self, PuppetConf, Resolver};
use crate::settings::{
    AddrProblem, Given, Host, Setting, Settings, SettingsError, Source, defaults, parse_certname,
};

impl Settings {
    /// Resolves every setting: what was given beats puppet.conf, which beats Puppet's defaults.
    pub fn resolve(given: &Given, host: &Host) -> Result<Self, SettingsError> {
        let (conf, puppet_conf) = load_puppet_conf(given, host)?;
        // Given, else puppet.conf, else Puppet's default: the resolver holds all three.
        let layout = conf.layout(host.exists);
        let mut resolver = Resolver::new(&conf, layout, host.fqdn);
        let overrides = [
            ("certname", given.certname.clone()),
            ("hostcert", path_text(given.hostcert.as_ref())),
            ("hostprivkey", path_text(given.hostprivkey.as_ref())),
            ("localcacert", path_text(given.localcacert.as_ref())),
            ("hostcrl", path_text(given.hostcrl.as_ref())),
        ];
        for (name, setting) in overrides {
            if let Some(Setting { value, source }) = setting {
                resolver.set(name, value, source);
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
        let daemon = daemon(given)?;
        let certname = string("certname")?;
        if parse_certname(&certname.value).is_err() {
            return Err(SettingsError::Certname {
                value: certname.value,
                source_: certname.source,
            });
        }
        let puppetserver_confd = given.puppetserver_confd.clone().unwrap_or_else(|| Setting {
            value: layout.puppetserver_confd().into(),
            source: Source::Default(format!("Puppet Server's conf.d of the {layout}")),
        });
        let confd = Confd {
            dir: &puppetserver_confd.value,
            host,
        };
        let webserver = confd
            .file("webserver.conf")
            .map(|(path, text)| Webserver::parse(path, &text));
        let hostcrl = match webserver
            .as_ref()
            .and_then(|w| Some((w.crl_path.clone()?, w)))
        {
            Some((crl, web)) if given.hostcrl.is_none() => Setting {
                value: crl,
                source: Source::Default(format!("ssl-crl-path in {}", web.path.display())),
            },
            _ => path("hostcrl")?,
        };
        let puppet_addr = match &given.puppet_addr {
            Some(Setting { value, source }) => Setting {
                value: parse_addr(value)?,
                source: source.clone(),
            },
            None => default_puppet_addr(webserver, &string("serverport")?)?,
        };
        let multithreaded = confd.multithreaded()?;
        Ok(Self {
            ssldir: path("ssldir")?,
            hostcert: path("hostcert")?,
            hostprivkey: path("hostprivkey")?,
            localcacert: path("localcacert")?,
            hostcrl,
            // Shown, never needed to answer a poll: one that cannot be resolved shows no
            // environment, and `pmcheck config` says why.
            environmentpath: string("environmentpath").unwrap_or_else(|e| Setting {
                value: String::new(),
                source: Source::Default(format!("cannot be resolved: {e}")),
            }),
            puppet_conf,
            certname,
            puppet_addr,
            status_path: given.status_path.clone(),
            timeout: given.timeout.clone(),
            pause_grace: given.pause_grace.clone(),
            wedged_after: given.wedged_after.clone(),
            puppetserver_confd,
            multithreaded,
            state_dir: given.state_dir.clone(),
            daemon,
            given: given.clone(),
        })
    }
}

/// puppet.conf: the one given (which must exist), else the first of the AIO and Debian
/// locations that exists, else none (Puppet's defaults).
fn load_puppet_conf(
    given: &Given,
    host: &Host,
) -> Result<(PuppetConf, Setting<Option<PathBuf>>), SettingsError> {
    if let Some(Setting {
        value: path,
        source,
    }) = &given.puppet_conf
    {
        std::fs::metadata(path).map_err(|source| SettingsError::PuppetConfMissing {
            path: path.clone(),
            source,
        })?;
        let setting = Setting {
            value: Some(path.clone()),
            source: source.clone(),
        };
        return Ok((PuppetConf::load(path)?, setting));
    }
    Ok(match puppet_conf::find_default(host.exists) {
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
                source: Source::Default(
                    "neither /etc/puppetlabs/puppet/puppet.conf nor \
                     /etc/puppet/puppet.conf exists; Puppet's defaults apply"
                        .into(),
                ),
            },
        ),
    })
}

/// The daemon's settings, when given: each `--code-environment` once, and not too many.
fn daemon(given: &Given) -> Result<Option<Daemon>, SettingsError> {
    let mut daemon = given.daemon.clone();
    if let Some(envs) = daemon.as_mut().map(|d| &mut d.code_environments) {
        let mut seen = std::collections::HashSet::new();
        envs.value.retain(|name| seen.insert(name.clone()));
        if envs.value.len() > defaults::MAX_CODE_ENVIRONMENTS {
            return Err(SettingsError::CodeEnvironments {
                count: envs.value.len(),
                max: defaults::MAX_CODE_ENVIRONMENTS,
                source_: envs.source.clone(),
            });
        }
    }
    Ok(daemon)
}

/// Puppet Server's conf.d, as the host reads it.
struct Confd<'a> {
    dir: &'a std::path::Path,
    host: &'a Host,
}

impl Confd<'_> {
    /// A file of conf.d with its text, when it can be read.
    fn file(&self, name: &str) -> Option<(PathBuf, String)> {
        let path = self.dir.join(name);
        (self.host.confd_file)(&path).map(|text| (path, text))
    }

    /// Whether Puppet Server runs one multithreaded JRuby (puppetserver.conf).
    fn multithreaded(&self) -> Result<Setting<bool>, SettingsError> {
        let Some((path, text)) = self.file("puppetserver.conf") else {
            return Ok(Setting {
                value: false,
                source: Source::Default(format!(
                    "Puppet Server's; no readable puppetserver.conf in {}",
                    self.dir.display()
                )),
            });
        };
        match crate::settings::host::multithreaded(&text) {
            Ok(Some(value)) => Ok(Setting {
                value,
                source: Source::Default(format!(
                    "jruby-puppet.multithreaded in {}",
                    path.display()
                )),
            }),
            Ok(None) => Ok(Setting {
                value: false,
                source: Source::Default(format!(
                    "Puppet Server's; {} does not set jruby-puppet.multithreaded",
                    path.display()
                )),
            }),
            Err((line, value)) => Err(SettingsError::Multithreaded { path, line, value }),
        }
    }
}

fn path_text(path: Option<&Setting<PathBuf>>) -> Option<Setting<String>> {
    path.map(|p| Setting {
        value: p.value.display().to_string(),
        source: p.source.clone(),
    })
}

/// Where Puppet Server listens: webserver.conf's ssl-port (and its ssl-host, unless that is a
/// wildcard), else 127.0.0.1 and puppet.conf's serverport, else 8140.
fn default_puppet_addr(
    webserver: Option<Webserver>,
    serverport: &Setting<String>,
) -> Result<Setting<SocketAddr>, SettingsError> {
    let loopback = IpAddr::from([127, 0, 0, 1]);
    if let Some(web) = webserver
        && let Some(value) = web.listener()
    {
        let how = match web.host.filter(|h| !h.is_unspecified()) {
            Some(_) => "ssl-host and ssl-port",
            None => "127.0.0.1 and ssl-port",
        };
        return Ok(Setting {
            value,
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
    let fail = |problem| SettingsError::PuppetAddr {
        value: value.to_owned(),
        problem,
    };
    let addrs: Vec<SocketAddr> = value
        .to_socket_addrs()
        .map_err(|e| fail(AddrProblem::Lookup(e)))?
        .collect();
    // Jetty's default listener is IPv4 (ssl-host 0.0.0.0): `localhost` must not become ::1.
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| fail(AddrProblem::NoAddress))
}
