//! `pmcheck config`: every setting the daemon will use and where it came from, with the
//! service's environment file read as systemd reads it; `--check` also checks that the daemon
//! can read every file it needs.

use std::path::{Path, PathBuf};

use crate::console::{out, outln};
use crate::exit::Exit;
use crate::operator::access::{self, Needed, Reader, UNIT_LOCATIONS};
use crate::settings::env_file::EnvFile;
use crate::settings::lb_proof::LbProof;
use crate::settings::{Given, Host, Settings, SettingsError};

/// The environment file `config` reads: `--env-file PATH`, `none`, or the packaged location.
pub fn env_file(given: Option<&Path>) -> std::io::Result<Option<EnvFile>> {
    match given {
        Some(path) if path == Path::new("none") => Ok(None),
        Some(path) => EnvFile::load(path).map(Some).map_err(|e| {
            std::io::Error::new(e.kind(), format!("--env-file {}: {e}", path.display()))
        }),
        None => EnvFile::find().transpose(),
    }
}

/// Prints the settings (and with `check`, what cannot be read); the exit says whether all is
/// well.
pub fn config(
    given: &Given,
    file: Option<&EnvFile>,
    check: bool,
    unit: Option<&Path>,
) -> Result<Exit, SettingsError> {
    let settings = Settings::resolve(given, &Host::REAL)?;
    out!("{settings}");
    // A misspelt name changes nothing: before a restart (`--check`) that is an error.
    let mut misspelt = false;
    let level = if check { "error" } else { "warning" };
    if let Some(file) = file {
        let set = |n: &str| file.vars.iter().any(|(v, _)| v == n) || std::env::var_os(n).is_some();
        for (line, text) in &file.ignored {
            outln!(
                "warning: {} line {line}: systemd ignores `{text}` (write VAR=value, no `export`)",
                file.path.display()
            );
        }
        for (name, meant) in
            crate::provenance::unread_names(file.vars.iter().map(|(n, _)| n.as_str()))
        {
            misspelt = true;
            outln!(
                "{level}: {}: {}",
                file.path.display(),
                crate::provenance::unread_name_said(name, meant.as_deref(), set)
            );
        }
    }
    // Settings read from Puppet Server's files fall back to defaults when a file cannot be
    // read: say so, the fallback may be wrong (`--check` makes it an error).
    for name in ["webserver.conf", "puppetserver.conf"] {
        let path = settings.puppetserver_confd.value.join(name);
        if let Err(e) = crate::safe_file::read(&path, crate::safe_file::CONFIG_LIMIT)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            outln!(
                "warning: cannot read {}: {e}; its settings were not applied (run `pmcheck config --check`)",
                path.display()
            );
        }
    }
    // The commands on this host ask the daemon over loopback: an --allow without it shuts
    // out `status`, the waits and `cycle`, which then cannot tell a refusal from a dead daemon.
    if let Some(daemon) = &settings.daemon
        && shuts_out_loopback(&daemon.allow.value)
    {
        outln!(
            "warning: --allow (PMCHECK_ALLOW) {} admits neither 127.0.0.1 nor ::1: `pmcheck status`, \
             `drain --wait`, `undrain --wait` and `cycle` on this host will be refused; add \
             127.0.0.1/32 and ::1/128 to it",
            daemon
                .allow
                .value
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    if !check {
        return Ok(Exit::Ok);
    }
    let mut readers = vec![Reader::me()];
    let mut out = String::new();
    if nix::unistd::getuid().is_root() {
        // What systemd runs (drop-ins included) unless --unit names a file; the file where
        // systemd does not run.
        let service = match unit {
            Some(file) => Some(Reader::unit(file)),
            None => Reader::systemd().or_else(|| {
                (UNIT_LOCATIONS.iter().map(PathBuf::from))
                    .find(|p| p.exists())
                    .map(|file| Reader::unit(&file))
            }),
        };
        match service {
            Some(Ok(service)) => readers.push(service),
            Some(Err(why)) => out.push_str(&format!("note: not checked as the service: {why}\n")),
            None => out.push_str(
                "note: no pmcheck.service installed: checked as you only (--unit names one)\n",
            ),
        }
    }
    let mut ok = access::check(&needed(&settings), &readers, &mut out) && !misspelt;
    if let Some(daemon) = &settings.daemon {
        ok &= key_file(daemon, &mut out);
    }
    out!("{out}");
    Ok(if ok { Exit::Ok } else { Exit::Config })
}

/// The load balancer key file as the daemon will read it: each key's addresses and what is
/// weak, or why it cannot be used (`false`).
fn key_file(daemon: &crate::settings::daemon::Daemon, out: &mut String) -> bool {
    let addresses = daemon.lb_addresses.value.clone();
    match LbProof::load(daemon.lb_key_file.value.as_deref(), addresses) {
        Ok(proof) => {
            for key in proof.answer().map(|a| a.keys).unwrap_or_default() {
                let from = key.addresses();
                out.push_str(&format!(
                    "load balancer key, line {}: for {from}\n",
                    key.line
                ));
            }
            for w in proof.warnings() {
                out.push_str(&format!("warning: {w}\n"));
            }
            true
        }
        Err(e) => {
            out.push_str(&format!("error: {e}\n"));
            false
        }
    }
}

/// The files the daemon reads.
fn needed(s: &Settings) -> Vec<Needed> {
    let need = |name: &str, path: &Path, required: bool| Needed {
        name: name.to_owned(),
        path: path.to_owned(),
        required,
    };
    let mut files = Vec::new();
    if let Some(conf) = &s.puppet_conf.value {
        files.push(need("puppet.conf", conf, true));
    }
    files.extend([
        need("hostcert", &s.hostcert.value, true),
        need("hostprivkey", &s.hostprivkey.value, true),
        need("localcacert", &s.localcacert.value, true),
        need(
            "webserver.conf",
            &s.puppetserver_confd.value.join("webserver.conf"),
            false,
        ),
        need(
            "puppetserver.conf",
            &s.puppetserver_confd.value.join("puppetserver.conf"),
            false,
        ),
    ]);
    if let Some(key_file) = s.daemon.as_ref().and_then(|d| d.lb_key_file.value.as_ref()) {
        files.push(need("lb-key-file", key_file, true));
    }
    files
}

/// Whether `allow` restricts polls and admits neither loopback address.
fn shuts_out_loopback(allow: &[ipnet::IpNet]) -> bool {
    use std::net::{Ipv4Addr, Ipv6Addr};
    let admits = |ip| crate::settings::allow::permits(allow, ip);
    !admits(Ipv4Addr::LOCALHOST.into()) && !admits(Ipv6Addr::LOCALHOST.into())
}
