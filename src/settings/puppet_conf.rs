//! Puppet's own settings, read from puppet.conf the way Puppet Server reads them.
//!
//! We parse the file ourselves instead of running `puppet config print`: that costs seconds of
//! Ruby start-up and, as a non-root user on Debian, reports a different ssldir.

use std::collections::HashMap;
use std::fmt;

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::settings::host::FqdnError;

use super::{Setting, Source};

/// puppet.conf locations, in the order they are tried: AIO packages, then Debian's.
pub const CANDIDATES: [&str; 2] = [
    "/etc/puppetlabs/puppet/puppet.conf",
    "/etc/puppet/puppet.conf",
];

/// Puppet Server reads `[server]`, then the deprecated `[master]`, then `[main]`.
const SECTIONS: [&str; 3] = ["server", "master", "main"];

/// Why puppet.conf cannot be read or a setting in it cannot be resolved.
#[derive(Debug, Error)]
pub enum PuppetConfError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The puppet.conf file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A line is not `[section]`, `name = value` or a comment.
    #[error(
        "{path}:{line}: cannot parse `{shown}`: expected `[section]`, `name = value` or a # comment",
        shown = crate::text::one_line(text, 120)
    )]
    Syntax {
        /// The puppet.conf file.
        path: PathBuf,
        /// The line number, from 1.
        line: usize,
        /// The line as it is in the file; shown on one bounded line.
        text: String,
    },
    /// A value names a `$variable` Puppet does not know.
    #[error("{setting} = {value}: unknown variable ${var} (from {source_})")]
    UnknownVariable {
        /// The setting.
        setting: String,
        /// Its raw value.
        value: String,
        /// The unknown variable.
        var: String,
        /// Where the value came from.
        source_: Source,
    },
    /// Values refer to each other in a circle.
    #[error("{setting}: its value refers back to itself through $-variables")]
    Cycle {
        /// The setting.
        setting: String,
    },
    /// The certname is needed, not set, and the FQDN cannot be told.
    #[error("cannot work out the certname: {0}; set certname in puppet.conf or pass --certname")]
    Certname(#[from] FqdnError),
}

/// Which package family's defaults apply where puppet.conf is silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Puppet's own packages: confdir /etc/puppetlabs/puppet, ssldir $confdir/ssl.
    Aio,
    /// Debian's packages: confdir /etc/puppet, ssldir /var/lib/puppet/ssl.
    Debian,
}

impl Layout {
    /// Puppet Server's conf.d in this layout, where webserver.conf and puppetserver.conf live.
    pub fn puppetserver_confd(self) -> &'static str {
        match self {
            Layout::Aio => "/etc/puppetlabs/puppetserver/conf.d",
            Layout::Debian => "/etc/puppet/puppetserver/conf.d",
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Aio => "Puppet AIO layout",
            Layout::Debian => "Debian layout",
        })
    }
}

/// A parsed puppet.conf: `section -> name -> value`.
#[derive(Debug, Default, Clone)]
pub struct PuppetConf {
    path: Option<PathBuf>,
    sections: HashMap<String, HashMap<String, String>>,
}

impl PuppetConf {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Self, PuppetConfError> {
        let limit = crate::safe_file::CONFIG_LIMIT;
        let text = crate::safe_file::read_to_string(path, limit).map_err(|source| {
            PuppetConfError::Read {
                path: path.to_owned(),
                source,
            }
        })?;
        Self::parse(path, &text)
    }

    /// Parses puppet.conf text. Settings before any section header belong to `[main]`, as in Puppet.
    pub fn parse(path: &Path, text: &str) -> Result<Self, PuppetConfError> {
        let mut sections: HashMap<String, HashMap<String, String>> = HashMap::new();
        let mut section = "main".to_owned();
        for (index, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.trim().to_owned();
                continue;
            }
            let named = |name: &str| {
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            };
            let Some((name, value)) = (line.split_once('='))
                .map(|(name, value)| (name.trim(), value))
                .filter(|(name, _)| named(name))
            else {
                return Err(PuppetConfError::Syntax {
                    path: path.to_owned(),
                    line: index + 1,
                    text: line.to_owned(),
                });
            };
            sections
                .entry(section.clone())
                .or_default()
                .insert(name.to_owned(), strip_metadata(value.trim()).to_owned());
        }
        Ok(Self {
            path: Some(path.to_owned()),
            sections,
        })
    }

    /// The value of `name` as Puppet Server sees it, and the section it came from.
    pub fn get(&self, name: &str) -> Option<(&str, &'static str)> {
        // Puppet 7 renamed masterport to serverport and keeps the old name as an alias.
        let names: &[&str] = match name {
            "serverport" | "masterport" => &["serverport", "masterport"],
            _ => std::slice::from_ref(&name),
        };
        SECTIONS.iter().find_map(|section| {
            let settings = self.sections.get(*section)?;
            names
                .iter()
                .find_map(|n| settings.get(*n))
                .map(|v| (v.as_str(), *section))
        })
    }

    /// The layout whose defaults apply: the one the file belongs to, or for a file elsewhere
    /// (or none) the installed one, as Puppet keeps its confdir whatever `--config` says.
    /// `installed` answers whether a confdir exists on this host (the `Host` seam).
    pub fn layout(&self, installed: &dyn Fn(&Path) -> bool) -> Layout {
        match &self.path {
            Some(p) if p.starts_with("/etc/puppetlabs") => Layout::Aio,
            Some(p) if p.starts_with("/etc/puppet") => Layout::Debian,
            _ if installed(Path::new("/etc/puppetlabs/puppet")) => Layout::Aio,
            _ if installed(Path::new("/etc/puppet")) => Layout::Debian,
            _ => Layout::Aio,
        }
    }
}

/// Puppet allows `{ owner = service, mode = 0640 }` after a path; it is not part of the value.
fn strip_metadata(value: &str) -> &str {
    match value.rfind('{') {
        Some(open) if value.ends_with('}') => value[..open].trim_end(),
        _ => value,
    }
}

/// Resolves settings with `$var` interpolation over command-line overrides, puppet.conf and
/// Puppet's defaults for the layout.
pub struct Resolver<'a> {
    conf: &'a PuppetConf,
    layout: Layout,
    overrides: HashMap<&'static str, (String, Source)>,
    fqdn: &'a dyn Fn() -> Result<String, FqdnError>,
}

impl<'a> Resolver<'a> {
    /// `layout` gives the defaults where `conf` is silent; `fqdn` is asked only when the
    /// certname is needed and nothing sets it.
    pub fn new(
        conf: &'a PuppetConf,
        layout: Layout,
        fqdn: &'a dyn Fn() -> Result<String, FqdnError>,
    ) -> Self {
        Self {
            conf,
            layout,
            overrides: HashMap::new(),
            fqdn,
        }
    }

    /// A value from the command line or the environment that beats puppet.conf.
    pub fn set(&mut self, name: &'static str, value: String, source: Source) {
        self.overrides.insert(name, (value, source));
    }

    /// The fully interpolated value of `name`, from where its raw value came from.
    pub fn resolve(&self, name: &str) -> Result<Setting<String>, PuppetConfError> {
        let (value, source) = self.resolve_depth(name, 0)?;
        Ok(Setting { value, source })
    }

    fn resolve_depth(&self, name: &str, depth: usize) -> Result<(String, Source), PuppetConfError> {
        if depth > 16 {
            return Err(PuppetConfError::Cycle {
                setting: name.to_owned(),
            });
        }
        let (raw, source) = match (self.overrides.get(name), self.conf.get(name)) {
            (Some((value, source)), _) => (value.clone(), source.clone()),
            (None, Some((value, section))) => {
                let path = self.conf.path.clone().unwrap_or_default();
                let section = section.to_owned();
                (value.to_owned(), Source::File { path, section })
            }
            (None, None) => self.default(name)?,
        };
        let value = self.interpolate(name, &raw, &source, depth)?;
        Ok((value, source))
    }

    fn default(&self, name: &str) -> Result<(String, Source), PuppetConfError> {
        let layout = self.layout;
        // Only these differ between the layouts; the rest derive from them.
        let of_layout = |aio: &str, debian: &str| match layout {
            Layout::Aio => (aio.to_owned(), true),
            Layout::Debian => (debian.to_owned(), true),
        };
        let (value, per_layout) = match name {
            "confdir" => of_layout("/etc/puppetlabs/puppet", "/etc/puppet"),
            "vardir" => of_layout("/opt/puppetlabs/puppet/cache", "/var/cache/puppet"),
            "ssldir" => of_layout("$confdir/ssl", "/var/lib/puppet/ssl"),
            "codedir" => of_layout("/etc/puppetlabs/code", "/etc/puppet/code"),
            "logdir" => of_layout("/var/log/puppetlabs/puppet", "/var/log/puppet"),
            "rundir" => of_layout("/var/run/puppetlabs", "/run/puppet"),
            "statedir" => ("$vardir/state".into(), false),
            "certdir" => ("$ssldir/certs".into(), false),
            "privatekeydir" => ("$ssldir/private_keys".into(), false),
            "publickeydir" => ("$ssldir/public_keys".into(), false),
            "requestdir" => ("$ssldir/certificate_requests".into(), false),
            "hostcert" => ("$certdir/$certname.pem".into(), false),
            "hostprivkey" => ("$privatekeydir/$certname.pem".into(), false),
            "hostpubkey" => ("$publickeydir/$certname.pem".into(), false),
            "localcacert" => ("$certdir/ca.pem".into(), false),
            "hostcrl" => ("$ssldir/crl.pem".into(), false),
            "environmentpath" => ("$codedir/environments".into(), false),
            "serverport" | "masterport" => ("8140".into(), false),
            "certname" => {
                let fqdn = (self.fqdn)().map_err(PuppetConfError::Certname)?;
                return Ok((fqdn, Source::Default("the host's FQDN".into())));
            }
            other => {
                return Err(PuppetConfError::UnknownVariable {
                    setting: other.to_owned(),
                    value: String::new(),
                    var: other.to_owned(),
                    source_: Source::Default("none".into()),
                });
            }
        };
        let how = match (per_layout, value.contains('$')) {
            (true, true) => format!("{value}, {layout}"),
            (true, false) => layout.to_string(),
            (false, _) => value.clone(),
        };
        Ok((value, Source::Default(how)))
    }

    /// Replaces `$name` and `${name}` with their resolved values.
    fn interpolate(
        &self,
        setting: &str,
        raw: &str,
        source: &Source,
        depth: usize,
    ) -> Result<String, PuppetConfError> {
        let mut out = String::with_capacity(raw.len());
        let mut rest = raw;
        while let Some(dollar) = rest.find('$') {
            out.push_str(&rest[..dollar]);
            let after = &rest[dollar + 1..];
            let (var, consumed) = if let Some(braced) = after.strip_prefix('{') {
                match braced.find('}') {
                    Some(end) => (&braced[..end], end + 2),
                    None => (braced, braced.len() + 1),
                }
            } else {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            };
            if var.is_empty() {
                out.push('$');
                rest = after;
                continue;
            }
            let (value, _) = self.resolve_depth(var, depth + 1).map_err(|e| match e {
                PuppetConfError::UnknownVariable { .. } => PuppetConfError::UnknownVariable {
                    setting: setting.to_owned(),
                    value: raw.to_owned(),
                    var: var.to_owned(),
                    source_: source.clone(),
                },
                e => e,
            })?;
            out.push_str(&value);
            rest = &after[consumed..];
        }
        out.push_str(rest);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::host::{FqdnError, Webserver, fqdn_from, resolv_domain};

    fn conf(path: &str, text: &str) -> PuppetConf {
        PuppetConf::parse(Path::new(path), text).expect("parses")
    }

    fn no_fqdn() -> Result<String, FqdnError> {
        Ok("node1.example.com".into())
    }

    fn nothing_installed(_: &Path) -> bool {
        false
    }

    #[test]
    fn server_section_beats_master_beats_main() {
        let c = conf(
            "/etc/puppetlabs/puppet/puppet.conf",
            "[main]\ncertname = a\nserverport = 1\n[master]\ncertname = b\n[server]\ncertname = c\n",
        );
        assert_eq!(c.get("certname"), Some(("c", "server")));
        assert_eq!(c.get("serverport"), Some(("1", "main")));
        let c = conf(
            "/x/puppet.conf",
            "[main]\ncertname = a\n[master]\ncertname = b\n",
        );
        assert_eq!(c.get("certname"), Some(("b", "master")));
    }

    #[test]
    fn settings_before_a_section_are_main_and_comments_and_metadata_are_ignored() {
        let c = conf(
            "/x/puppet.conf",
            "# comment\n  ; also comment\ncertname = early\n[agent]\nserver = puppet\n[main]\nssldir = /s {owner = service, mode = 0771}\n",
        );
        assert_eq!(c.get("certname"), Some(("early", "main")));
        assert_eq!(c.get("ssldir"), Some(("/s", "main")));
        assert_eq!(
            c.get("server"),
            None,
            "[agent] is not read by Puppet Server"
        );
    }

    #[test]
    fn syntax_errors_name_the_file_and_line() {
        let err = PuppetConf::parse(
            Path::new("/x/puppet.conf"),
            "[main]\nthis is not a setting\n",
        )
        .expect_err("must fail");
        let text = err.to_string();
        assert!(text.contains("/x/puppet.conf:2"), "{text}");
        assert!(text.contains("this is not a setting"), "{text}");
    }

    #[test]
    fn debian_layout_defaults() {
        let c = conf("/etc/puppet/puppet.conf", "[main]\n");
        assert_eq!(c.layout(&nothing_installed), Layout::Debian);
        let r = Resolver::new(&c, Layout::Debian, &no_fqdn);
        assert_eq!(r.resolve("ssldir").unwrap().value, "/var/lib/puppet/ssl");
        assert_eq!(r.resolve("vardir").unwrap().value, "/var/cache/puppet");
        assert_eq!(
            r.resolve("hostcert").unwrap().value,
            "/var/lib/puppet/ssl/certs/node1.example.com.pem"
        );
        assert_eq!(
            r.resolve("hostprivkey").unwrap().value,
            "/var/lib/puppet/ssl/private_keys/node1.example.com.pem"
        );
        assert_eq!(
            r.resolve("localcacert").unwrap().value,
            "/var/lib/puppet/ssl/certs/ca.pem"
        );
        assert_eq!(r.resolve("serverport").unwrap().value, "8140");
    }

    #[test]
    fn aio_layout_defaults() {
        let c = conf("/etc/puppetlabs/puppet/puppet.conf", "");
        assert_eq!(c.layout(&nothing_installed), Layout::Aio);
        let r = Resolver::new(&c, Layout::Aio, &no_fqdn);
        assert_eq!(
            r.resolve("ssldir").unwrap().value,
            "/etc/puppetlabs/puppet/ssl"
        );
        assert_eq!(
            r.resolve("localcacert").unwrap().value,
            "/etc/puppetlabs/puppet/ssl/certs/ca.pem"
        );
        let source = r.resolve("certname").unwrap().source;
        assert!(matches!(source, Source::Default(_)));
    }

    #[test]
    fn a_puppet_conf_elsewhere_keeps_the_installed_confdir_as_puppet_does() {
        let c = conf("/tmp/elsewhere/puppet.conf", "");
        let debian_installed = |p: &Path| p == Path::new("/etc/puppet");
        let aio_installed =
            |p: &Path| p == Path::new("/etc/puppetlabs/puppet") || p == Path::new("/etc/puppet");
        assert_eq!(c.layout(&debian_installed), Layout::Debian);
        assert_eq!(c.layout(&aio_installed), Layout::Aio, "AIO first");
        assert_eq!(
            c.layout(&nothing_installed),
            Layout::Aio,
            "Puppet's own default"
        );
        for layout in [Layout::Debian, Layout::Aio] {
            let r = Resolver::new(&c, layout, &no_fqdn);
            let confdir = r.resolve("confdir").unwrap().value;
            let want = match layout {
                Layout::Debian => "/etc/puppet",
                Layout::Aio => "/etc/puppetlabs/puppet",
            };
            assert_eq!(
                confdir, want,
                "`puppet --config /tmp/elsewhere/puppet.conf` keeps its confdir"
            );
        }
        let r = Resolver::new(&c, Layout::Aio, &no_fqdn);
        let source = r.resolve("hostcert").unwrap().source;
        assert_eq!(
            source,
            Source::Default("$certdir/$certname.pem".into()),
            "not layout-specific"
        );
    }

    #[test]
    fn interpolation_follows_variables_through_sections_and_overrides() {
        let c = conf(
            "/etc/puppetlabs/puppet/puppet.conf",
            "[main]\nvardir = /v\nssldir = $vardir/ssl\ncertname = fromfile\n[server]\nhostcert = ${certdir}/x-$certname.pem\nmasterport = 8141\n",
        );
        let mut r = Resolver::new(&c, Layout::Aio, &no_fqdn);
        assert_eq!(
            r.resolve("hostcert").unwrap().value,
            "/v/ssl/certs/x-fromfile.pem"
        );
        assert_eq!(
            r.resolve("serverport").unwrap().value,
            "8141",
            "masterport is an alias"
        );
        r.set("certname", "cli".into(), Source::Flag);
        let Setting { value, source } = r.resolve("hostcert").unwrap();
        assert_eq!(value, "/v/ssl/certs/x-cli.pem");
        assert_eq!(
            source,
            Source::File {
                path: "/etc/puppetlabs/puppet/puppet.conf".into(),
                section: "server".into()
            }
        );
    }

    #[test]
    fn unknown_variables_and_cycles_are_errors_naming_the_setting() {
        let c = conf(
            "/x/puppet.conf",
            "[main]\nhostcert = $nosuch/cert.pem\nssldir = $certdir\n",
        );
        let r = Resolver::new(&c, Layout::Aio, &no_fqdn);
        let text = r.resolve("hostcert").unwrap_err().to_string();
        assert!(
            text.contains("hostcert") && text.contains("$nosuch"),
            "{text}"
        );
        let text = r.resolve("ssldir").unwrap_err().to_string();
        assert!(text.contains("refers back to itself"), "{text}");
    }

    #[test]
    fn certname_lookup_failure_says_how_to_fix_it() {
        let c = conf("/x/puppet.conf", "");
        let failing = || Err(FqdnError::Empty);
        let r = Resolver::new(&c, Layout::Aio, &failing);
        let text = r.resolve("hostcert").unwrap_err().to_string();
        assert_eq!(
            text,
            "cannot work out the certname: the host name is empty; set certname in puppet.conf \
             or pass --certname"
        );
    }

    #[test]
    fn fqdn_follows_facter() {
        let none = || None;
        let resolv = || Some("corp.example.".to_owned());
        assert_eq!(
            fqdn_from("Node1.Example.COM", None, none).unwrap(),
            "node1.example.com"
        );
        assert_eq!(
            fqdn_from("node1", Some("node1.dc1.example.com"), none).unwrap(),
            "node1.dc1.example.com"
        );
        // /etc/hosts: 127.0.0.1 localhost.localdomain node1 -- the canonical name is not node1's.
        assert_eq!(
            fqdn_from("node1", Some("localhost.localdomain"), resolv).unwrap(),
            "node1.corp.example"
        );
        assert_eq!(fqdn_from("vm", Some("vm"), none).unwrap(), "vm");
        assert!(fqdn_from("", None, none).is_err());
    }

    #[test]
    fn webserver_conf_gives_puppet_servers_own_listener() {
        let w = Webserver::parse(
            "/w".into(),
            "webserver: {\n    access-log-config: /x.xml\n    client-auth: want\n    ssl-host: 0.0.0.0\n    ssl-port: 8141\n}\n",
        );
        assert_eq!(w.host, Some("0.0.0.0".parse().unwrap()));
        assert_eq!(w.port, Some(8141));
        let w = Webserver::parse(
            "/w".into(),
            "webserver {\n ssl-host = \"10.1.2.3\" # admin net\n}\n",
        );
        assert_eq!(w.host, Some("10.1.2.3".parse().unwrap()));
        assert_eq!(w.port, None);
    }

    #[test]
    fn resolv_conf_domain_then_search() {
        assert_eq!(
            resolv_domain("nameserver 1.1.1.1\nsearch a.b c.d\ndomain e.f\n").as_deref(),
            Some("e.f")
        );
        assert_eq!(resolv_domain("search a.b c.d\n").as_deref(), Some("a.b"));
        assert_eq!(resolv_domain("nameserver 1.1.1.1\n"), None);
    }
}
