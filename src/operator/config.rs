//! `pmcheck config`: every setting the daemon will use and where it came from, with the
//! service's environment file read as systemd reads it; `--check` also checks that the daemon
//! can read every file it needs.

use std::fmt::Write as _;
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
    let misspelt = file.is_some_and(|file| env_file_warnings(file, check));
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
        let allow: Vec<String> = daemon.allow.value.iter().map(ToString::to_string).collect();
        outln!(
            "warning: --allow (PMCHECK_ALLOW) {} admits neither 127.0.0.1 nor ::1: `pmcheck status`, \
             `drain --wait`, `undrain --wait` and `cycle` on this host will be refused; add \
             127.0.0.1/32 and ::1/128 to it",
            allow.join(",")
        );
    }
    if !check {
        return Ok(Exit::Ok);
    }
    let mut out = String::new();
    let readers = readers(unit, &mut out);
    let mut ok = access::check(&needed(&settings), &readers, &mut out) && !misspelt;
    ok &= (settings.daemon.as_ref()).is_none_or(|daemon| key_file(daemon, &mut out));
    out!("{out}");
    Ok(if ok { Exit::Ok } else { Exit::Config })
}

/// What systemd ignores in the environment `file`, and the names no option reads (errors with
/// `check`): whether there were any of those.
fn env_file_warnings(file: &EnvFile, check: bool) -> bool {
    let level = if check { "error" } else { "warning" };
    let path = file.path.display();
    let set = |n: &str| file.vars.iter().any(|(v, _)| v == n) || std::env::var_os(n).is_some();
    for (line, text) in &file.ignored {
        outln!(
            "warning: {path} line {line}: systemd ignores `{text}` (write VAR=value, no `export`)"
        );
    }
    let unread = crate::provenance::unread_names(file.vars.iter().map(|(n, _)| n.as_str()));
    for (name, meant) in &unread {
        let said = crate::provenance::unread_name_said(name, meant.as_deref(), set);
        outln!("{level}: {path}: {said}");
    }
    !unread.is_empty()
}

/// Who the files are checked for: you, and as root the service as systemd runs it (drop-ins
/// included) unless `unit` names a file; the installed file where systemd does not run.
fn readers(unit: Option<&Path>, out: &mut String) -> Vec<Reader> {
    let mut readers = vec![Reader::me()];
    if !nix::unistd::getuid().is_root() {
        return readers;
    }
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
    readers
}

/// The load balancer key file as the daemon will read it: each key's addresses and what is
/// weak, or why it cannot be used (`false`).
fn key_file(daemon: &crate::settings::daemon::Daemon, out: &mut String) -> bool {
    let addresses = daemon.lb_addresses.value.clone();
    match LbProof::load(daemon.lb_key_file.value.as_deref(), addresses) {
        Ok(proof) => {
            for key in proof.answer().map(|a| a.keys).unwrap_or_default() {
                let from = key.addresses();
                let _ = writeln!(out, "load balancer key, line {}: for {from}", key.line);
            }
            for w in proof.warnings() {
                let _ = writeln!(out, "warning: {w}");
            }
            true
        }
        Err(e) => {
            let _ = writeln!(out, "error: {e}");
            false
        }
    }
}

/// The files the daemon reads: name, path, and whether it must exist (Puppet Server's conf
/// files may be absent: their defaults apply).
fn needed(s: &Settings) -> Vec<Needed> {
    let conf = |name: &str| Some(s.puppetserver_confd.value.join(name));
    let key_file = s.daemon.as_ref().and_then(|d| d.lb_key_file.clone().value);
    let files = [
        ("puppet.conf", s.puppet_conf.value.clone(), true),
        ("hostcert", Some(s.hostcert.value.clone()), true),
        ("hostprivkey", Some(s.hostprivkey.value.clone()), true),
        ("localcacert", Some(s.localcacert.value.clone()), true),
        ("webserver.conf", conf("webserver.conf"), false),
        ("puppetserver.conf", conf("puppetserver.conf"), false),
        ("lb-key-file", key_file, true),
    ];
    (files.into_iter())
        .filter_map(|(name, path, required)| {
            Some(Needed {
                name: name.to_owned(),
                path: path?,
                required,
            })
        })
        .collect()
}

/// Whether `allow` restricts polls and admits neither loopback address.
pub(crate) fn shuts_out_loopback(allow: &[ipnet::IpNet]) -> bool {
    use std::net::{Ipv4Addr, Ipv6Addr};
    let admits = |ip| crate::settings::allow::permits(allow, ip);
    !admits(Ipv4Addr::LOCALHOST.into()) && !admits(Ipv6Addr::LOCALHOST.into())
}
