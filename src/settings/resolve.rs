//! Resolving the settings: what was given beats puppet.conf, which beats Puppet's defaults;
//! Puppet Server's own files (webserver.conf, puppetserver.conf) say where it listens, which
//! CRL it checks and whether it runs one multithreaded JRuby. One function per concern.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs as _};
use std::path::{Path, PathBuf};

use crate::settings::host::Webserver;
use crate::settings::puppet_conf::{CANDIDATES, PuppetConf, Resolver};
use crate::settings::{
    Given, Host, Setting, Settings, SettingsError, Source, defaults, parse_certname,
};

impl Settings {
    /// Resolves every setting: what was given beats puppet.conf, which beats Puppet's defaults.
    pub fn resolve(given: &Given, host: &Host) -> Result<Self, SettingsError> {
        let (conf, puppet_conf) = load_puppet_conf(given, host)?;
        // Given, else puppet.conf, else Puppet's default: the resolver holds all three.
        let layout = conf.layout(host.exists);
        let mut resolver = Resolver::new(&conf, layout, host.fqdn);
        let puppet = &given.puppet;
        let shown = |path: &Option<PathBuf>| path.as_ref().map(|p| p.display().to_string());
        let named = [
            ("certname", puppet.certname.clone()),
            ("hostcert", shown(&puppet.hostcert)),
            ("hostprivkey", shown(&puppet.hostprivkey)),
            ("localcacert", shown(&puppet.localcacert)),
            ("hostcrl", shown(&puppet.hostcrl)),
        ];
        for (name, value) in named {
            if let Some(value) = value {
                resolver.set(name, value, given.source(name).clone());
            }
        }
        let path = |name: &str| resolver.resolve(name).map(|s| s.map(PathBuf::from));
        let mut given = given.clone();
        unique_code_environments(&mut given)?;
        let certname = resolver.resolve("certname")?;
        if parse_certname(&certname.value).is_err() {
            return Err(SettingsError::Certname {
                value: certname.value,
                source_: certname.source,
            });
        }
        let confd = given.setting("puppetserver_confd", &puppet.puppetserver_confd);
        let puppetserver_confd = confd.unwrap_or_else(|| {
            let how = format!("Puppet Server's conf.d of the {layout}");
            Setting::by_default(layout.puppetserver_confd().into(), how)
        });
        // A file of conf.d with its text, when it can be read.
        let confd_file = |name: &str| {
            let path = puppetserver_confd.value.join(name);
            (host.confd_file)(&path).map(|text| (path, text))
        };
        let webserver =
            confd_file("webserver.conf").map(|(path, text)| Webserver::parse(path, &text));
        let hostcrl = match &webserver {
            Some(Webserver {
                crl_path: Some(crl),
                path: web,
                ..
            }) if puppet.hostcrl.is_none() => {
                Setting::by_default(crl.clone(), format!("ssl-crl-path in {}", web.display()))
            }
            _ => path("hostcrl")?,
        };
        let puppet_addr = match &puppet.puppet_addr {
            Some(value) => Setting {
                value: parse_addr(value)?,
                source: given.source("puppet_addr").clone(),
            },
            None => default_puppet_addr(webserver, &resolver.resolve("serverport")?)?,
        };
        let multithreaded =
            multithreaded(&puppetserver_confd.value, confd_file("puppetserver.conf"))?;
        Ok(Self {
            ssldir: path("ssldir")?,
            hostcert: path("hostcert")?,
            hostprivkey: path("hostprivkey")?,
            localcacert: path("localcacert")?,
            hostcrl,
            // Shown, never needed to answer a poll: one that cannot be resolved shows no
            // environment, and `pmcheck config` says why.
            environmentpath: resolver.resolve("environmentpath").unwrap_or_else(|e| {
                Setting::by_default(String::new(), format!("cannot be resolved: {e}"))
            }),
            puppet_conf,
            certname,
            puppet_addr,
            puppetserver_confd,
            multithreaded,
            given,
        })
    }
}

/// puppet.conf: the one given (which must exist), else the first of the AIO and Debian
/// locations that exists, else none (Puppet's defaults).
fn load_puppet_conf(
    given: &Given,
    host: &Host,
) -> Result<(PuppetConf, Setting<Option<PathBuf>>), SettingsError> {
    let setting = match given.setting("puppet_conf", &given.puppet.puppet_conf) {
        Some(given) => {
            std::fs::metadata(&given.value).map_err(|source| SettingsError::PuppetConfMissing {
                path: given.value.clone(),
                source,
            })?;
            given.map(Some)
        }
        None => {
            let found = CANDIDATES
                .iter()
                .map(PathBuf::from)
                .find(|p| (host.exists)(p));
            let how = match found {
                Some(_) => "first existing of the AIO and Debian locations",
                None => {
                    "neither /etc/puppetlabs/puppet/puppet.conf nor /etc/puppet/puppet.conf \
                     exists; Puppet's defaults apply"
                }
            };
            Setting::by_default(found, how.into())
        }
    };
    let conf = match &setting.value {
        Some(path) => PuppetConf::load(path)?,
        None => PuppetConf::default(),
    };
    Ok((conf, setting))
}

/// The daemon's settings, when given: each `--code-environment` once, and not too many.
fn unique_code_environments(given: &mut Given) -> Result<(), SettingsError> {
    let Some(envs) = given.daemon.as_mut().map(|d| &mut d.code_environment) else {
        return Ok(());
    };
    let mut seen = std::collections::HashSet::new();
    envs.retain(|name| seen.insert(name.clone()));
    if envs.len() > defaults::MAX_CODE_ENVIRONMENTS {
        return Err(SettingsError::CodeEnvironments {
            count: envs.len(),
            source_: given.source("code_environment").clone(),
        });
    }
    Ok(())
}

/// Whether Puppet Server runs one multithreaded JRuby: puppetserver.conf of conf.d `dir`, as
/// read (`file`).
fn multithreaded(
    dir: &Path,
    file: Option<(PathBuf, String)>,
) -> Result<Setting<bool>, SettingsError> {
    let Some((path, text)) = file else {
        let how = format!(
            "Puppet Server's; no readable puppetserver.conf in {}",
            dir.display()
        );
        return Ok(Setting::by_default(false, how));
    };
    let shown = path.display();
    let (value, how) = match crate::settings::host::multithreaded(&text) {
        Ok(Some(value)) => (value, format!("jruby-puppet.multithreaded in {shown}")),
        Ok(None) => (
            false,
            format!("Puppet Server's; {shown} does not set jruby-puppet.multithreaded"),
        ),
        Err((line, value)) => return Err(SettingsError::Multithreaded { path, line, value }),
    };
    Ok(Setting::by_default(value, how))
}

/// Where Puppet Server listens: webserver.conf's ssl-port (and its ssl-host, unless that is a
/// wildcard), else 127.0.0.1 and puppet.conf's serverport, else 8140.
fn default_puppet_addr(
    webserver: Option<Webserver>,
    serverport: &Setting<String>,
) -> Result<Setting<SocketAddr>, SettingsError> {
    if let Some(web) = webserver
        && let Some(value) = web.listener()
    {
        // Its host is ssl-host's unless that is a wildcard (or not set).
        let how = match web.host == Some(value.ip()) {
            true => "ssl-host and ssl-port",
            false => "127.0.0.1 and ssl-port",
        };
        let how = format!("{how} from {}", web.path.display());
        return Ok(Setting::by_default(value, how));
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
    let loopback = IpAddr::from([127, 0, 0, 1]);
    Ok(Setting::by_default(SocketAddr::new(loopback, number), how))
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
    let addrs: Vec<SocketAddr> = value.to_socket_addrs().map_err(fail)?.collect();
    // Jetty's default listener is IPv4 (ssl-host 0.0.0.0): `localhost` must not become ::1.
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| fail(std::io::Error::other("the name has no address")))
}
