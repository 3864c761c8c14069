//! What the host says where the configuration files are silent: its FQDN, the way Facter tells
//! Puppet's default certname, and where Puppet Server itself listens (its webserver.conf).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why the host's FQDN (Puppet's default certname) cannot be told.
#[derive(Debug, Error)]
pub enum FqdnError {
    /// gethostname(2) failed.
    #[error("gethostname failed: {0}")]
    Hostname(#[source] std::io::Error),
    /// The host name is empty.
    #[error("the host name is empty")]
    Empty,
}

/// Where Puppet Server itself listens, from its webserver.conf (`ssl-host`, `ssl-port`):
/// puppet.conf's serverport is what agents dial, which may be a load balancer's port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webserver {
    /// The webserver.conf file.
    pub path: PathBuf,
    /// `ssl-host`, when it is an address.
    pub host: Option<IpAddr>,
    /// `ssl-port`.
    pub port: Option<u16>,
    /// `ssl-crl-path`: the CRL Puppet Server itself checks agents against (a compile master
    /// with the CA disabled points it at the CA's CRL copy).
    pub crl_path: Option<PathBuf>,
}

/// A file of Puppet Server's conf.d, if it can be read.
pub fn read_confd_file(path: &Path) -> Option<String> {
    crate::safe_file::read_to_string(path, crate::safe_file::CONFIG_LIMIT).ok()
}

impl Webserver {
    /// Reads the first `ssl-host` and `ssl-port` of the HOCON file; a full HOCON parser would
    /// be overkill for two scalars that Puppet's packages write one per line.
    pub fn parse(path: PathBuf, text: &str) -> Self {
        let scalar = |key: &str| {
            text.lines().find_map(|line| {
                let rest = line.trim().strip_prefix(key)?.trim_start();
                let value = rest.strip_prefix([':', '='])?;
                let value = value.split(['#', ',']).next()?.trim().trim_matches('"');
                Some(value.to_owned())
            })
        };
        Self {
            host: scalar("ssl-host").and_then(|h| h.parse().ok()),
            port: scalar("ssl-port").and_then(|p| p.parse().ok()),
            crl_path: scalar("ssl-crl-path")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
            path,
        }
    }

    /// Where pmcheck probes the Puppet Server this file configures: `ssl-host` unless it is a
    /// wildcard (then 127.0.0.1), and `ssl-port`; `None` without a port.
    pub fn listener(&self) -> Option<SocketAddr> {
        let host =
            (self.host.filter(|h| !h.is_unspecified())).unwrap_or(IpAddr::from([127, 0, 0, 1]));
        Some(SocketAddr::new(host, self.port?))
    }
}

/// The host's FQDN the way Facter computes Puppet's default certname: the host name, plus its
/// domain from the host name itself, else from the canonical name of the host name (what
/// `hostname -f` prints) when that extends it, else from resolv.conf. A reverse lookup of an
/// address would be wrong: many containers map 127.0.0.1 to `localhost`.
pub fn fqdn() -> Result<String, FqdnError> {
    let host = dns_lookup::get_hostname().map_err(FqdnError::Hostname)?;
    fqdn_from(&host, canonical_name(&host).as_deref(), || {
        crate::safe_file::read_to_string(
            Path::new("/etc/resolv.conf"),
            crate::safe_file::CONFIG_LIMIT,
        )
        .ok()
        .and_then(|text| resolv_domain(&text))
    })
}

pub(crate) fn fqdn_from(
    host: &str,
    canonical: Option<&str>,
    resolv: impl FnOnce() -> Option<String>,
) -> Result<String, FqdnError> {
    let (short, own_domain) = (host.split_once('.')).map_or((host, None), |(s, d)| (s, Some(d)));
    if short.is_empty() {
        return Err(FqdnError::Empty);
    }
    let domain = own_domain
        .or_else(|| canonical?.strip_prefix(short)?.strip_prefix('.'))
        .map(str::to_owned)
        .or_else(resolv);
    let name = match domain.as_deref().map(|d| d.trim_end_matches('.')) {
        Some(domain) if !domain.is_empty() => format!("{short}.{domain}"),
        _ => short.to_owned(),
    };
    Ok(name.to_ascii_lowercase())
}

fn canonical_name(host: &str) -> Option<String> {
    /// `AI_CANONNAME` from <netdb.h> (the same value on Linux and the BSDs).
    const AI_CANONNAME: i32 = 0x0002;
    let hints = dns_lookup::AddrInfoHints {
        flags: AI_CANONNAME,
        ..Default::default()
    };
    let mut infos = dns_lookup::getaddrinfo(Some(host), None, Some(hints)).ok()?;
    infos
        .find_map(|info| info.ok().and_then(|i| i.canonname))
        .filter(|name| !name.is_empty())
}

/// The `domain`, else the first `search` entry, of resolv.conf, as Facter reads it.
pub fn resolv_domain(text: &str) -> Option<String> {
    let mut search = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("domain") => return words.next().map(str::to_owned),
            Some("search") if search.is_none() => search = words.next().map(str::to_owned),
            _ => {}
        }
    }
    search
}

/// `jruby-puppet.multithreaded` of puppetserver.conf: the status API does not say the mode,
/// and in it the pool's numbers count borrow slots of one JRuby, not instances.
///
/// Read line by line, as Puppet's packages write the file (`jruby-puppet: {` ... `}`, one
/// setting per line, or the dotted key at the top); the last setting wins, as in HOCON.
/// `Err` holds the line and the value that is not a boolean.
pub fn multithreaded(text: &str) -> Result<Option<bool>, (usize, String)> {
    let mut blocks: Vec<String> = Vec::new();
    let mut found = None;
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("");
        let line = line.split("//").next().unwrap_or("").trim();
        if line.starts_with('}') {
            blocks.pop();
            continue;
        }
        let Some(at) = line.find([':', '=', '{']) else {
            continue;
        };
        let key = line[..at].trim().trim_matches('"');
        let value = line[at..].trim_start_matches([':', '=']).trim();
        if value.starts_with('{') {
            if !value.contains('}') {
                blocks.push(key.to_owned());
            }
            continue;
        }
        let mut path: Vec<&str> = blocks.iter().map(String::as_str).collect();
        path.extend(key.split('.'));
        if path != ["jruby-puppet", "multithreaded"] {
            continue;
        }
        let value = value.trim_end_matches(',').trim().trim_matches('"');
        found = Some(match value {
            "true" | "yes" | "on" => true,
            "false" | "no" | "off" => false,
            other => return Err((number + 1, other.to_owned())),
        });
    }
    Ok(found)
}
