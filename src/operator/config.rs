//! `pmcheck config`: every setting the daemon will use and where it came from, with the
//! service's environment file read as systemd reads it; `--check` also checks that the daemon
//! can read every file it needs, as the user running the command and, when that is root, as
//! the unit runs the daemon (`User=`, `SupplementaryGroups=`): judged from owners, groups and
//! mode bits along each path, so that the message names what blocks (`/var/lib/puppet`, 0750,
//! not `ca.pem`). ACLs and security modules are not judged: the check as you also opens the file.

use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Group, User};

use crate::accounts::{group_name, user_name};
use crate::cli::ConfigArgs;
use crate::console::{out, outln};
use crate::exit::Exit;
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
    args: &ConfigArgs,
) -> Result<Exit, SettingsError> {
    let (check, unit) = (args.check, args.unit.as_deref());
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
    if let Some(daemon) = &settings.given.daemon
        && shuts_out_loopback(&daemon.allow)
    {
        let allow: Vec<String> = daemon.allow.iter().map(ToString::to_string).collect();
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
    let mut ok = readable(&needed(&settings), &readers, &mut out) && !misspelt;
    ok &= (settings.given.daemon.as_ref()).is_none_or(|daemon| key_file(daemon, &mut out));
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
    let unread = crate::provenance::unread_names(file.vars.iter().map(|(n, _)| n.as_str()), set);
    for (_, said) in &unread {
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
    let installed = || (UNIT_LOCATIONS.map(Path::new).into_iter()).find(|p| p.exists());
    let service = match unit {
        Some(file) => Some(Reader::unit(file)),
        None => Reader::systemd().or_else(|| installed().map(Reader::unit)),
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
    let (proof, unusable) = LbProof::of(daemon);
    if let Some(e) = unusable {
        let _ = writeln!(out, "error: {e}");
        return false;
    }
    for key in proof.answer().map(|a| a.keys).unwrap_or_default() {
        let from = key.addresses();
        let _ = writeln!(out, "load balancer key, line {}: for {from}", key.line);
    }
    for w in proof.warnings() {
        let _ = writeln!(out, "warning: {w}");
    }
    true
}

/// The files the daemon reads: name, path, and whether it must exist (Puppet Server's conf
/// files may be absent: their defaults apply).
fn needed(s: &Settings) -> Vec<Needed> {
    let conf = |name: &str| Some(s.puppetserver_confd.value.join(name));
    let key_file = s.given.daemon.as_ref().and_then(|d| d.lb_key_file.clone());
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

/// Where the unit is installed, the administrator's copy first.
pub const UNIT_LOCATIONS: [&str; 3] = [
    "/etc/systemd/system/pmcheck.service",
    "/lib/systemd/system/pmcheck.service",
    "/usr/lib/systemd/system/pmcheck.service",
];

/// Someone who reads the files: a user with its groups.
#[derive(Debug, Clone)]
pub struct Reader {
    /// Who, in words (`you (alice)`, `the service (user pmcheck, groups pmcheck, puppet)`).
    pub who: String,
    uid: u32,
    gids: Vec<u32>,
    /// Open the file too: the check runs as this reader.
    open: bool,
}

impl Reader {
    /// The user running this command.
    pub fn me() -> Self {
        let uid = nix::unistd::getuid().as_raw();
        let groups = nix::unistd::getgroups().unwrap_or_default();
        let gids = groups.into_iter().chain([nix::unistd::getgid()]);
        Self {
            who: format!("you ({})", user_name(uid)),
            uid,
            gids: gids.map(Gid::as_raw).collect(),
            open: true,
        }
    }

    /// The daemon as `unit` runs it (`User=`, `Group=`, `SupplementaryGroups=`), or why it
    /// cannot be told: the file alone, without its drop-ins (where systemd does not run).
    pub fn unit(unit: &Path) -> Result<Self, String> {
        let text = crate::safe_file::read_to_string(unit, crate::safe_file::CONFIG_LIMIT)
            .map_err(|e| format!("cannot read the unit {}: {e}", unit.display()))?;
        service(&text, &unit.display().to_string())
    }

    /// The daemon as systemd runs `pmcheck.service`, drop-ins included (`systemctl edit`):
    /// `None` when systemd is not running here or does not know the unit.
    pub fn systemd() -> Option<Result<Self, String>> {
        if !Path::new("/run/systemd/system").is_dir() {
            return None;
        }
        let out = std::process::Command::new("systemctl")
            .args(["show", "-p", "LoadState", "-p", "User", "-p", "Group"])
            .args(["-p", "SupplementaryGroups", "pmcheck.service"])
            .stderr(std::process::Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !text.lines().any(|l| l == "LoadState=loaded") {
            return None;
        }
        let source = "as systemd runs pmcheck.service, drop-ins included";
        Some(service(&text, source))
    }

    /// Whether this reader may read `path`: `Err` names what blocks it and how to fix it.
    pub fn can_read(&self, path: &Path) -> Result<(), String> {
        // Resolved where the checker may resolve it; else as written (the walk then finds
        // the directory that stops the resolution).
        let full = std::fs::canonicalize(path)
            .or_else(|_| std::path::absolute(path))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        // Each directory below `/`, outermost first, then the file.
        let dirs: Vec<&Path> = full.ancestors().skip(1).collect();
        for dir in dirs.into_iter().rev().skip(1) {
            self.allowed(dir, 0o1, "enter")?;
        }
        if full.parent().is_some() {
            self.allowed(&full, 0o4, "read")?;
        }
        if self.open {
            // Read as the daemon would: a FIFO or an endless file is named, not waited on.
            crate::safe_file::read(&full, crate::safe_file::CRL_LIMIT)
                .map_err(|e| format!("{}: {e}", full.display()))?;
        }
        Ok(())
    }

    /// Whether the mode bits of `path` give this reader `bit` (4 read, 1 search).
    fn allowed(&self, path: &Path, bit: u32, what: &str) -> Result<(), String> {
        if self.uid == 0 {
            return Ok(());
        }
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mode = meta.mode();
        // The owner's bits, else the group's, else the others'.
        let shift = match (meta.uid() == self.uid, self.gids.contains(&meta.gid())) {
            (true, _) => 6,
            (false, true) => 3,
            (false, false) => 0,
        };
        if (mode >> shift) & bit != 0 {
            return Ok(());
        }
        let (owner, group) = (user_name(meta.uid()), group_name(meta.gid()));
        let (shown, bits, who) = (path.display(), mode & 0o7777, &self.who);
        let mut why = format!("{shown} ({bits:04o} {owner}:{group}) does not let {who} {what} it");
        if (mode >> 3) & bit != 0 {
            let _ = write!(
                why,
                ": add group {group} (SupplementaryGroups= in the unit, or usermod -aG {group})"
            );
        }
        Err(why)
    }
}

/// One file the daemon reads: what it is, where, and whether it must exist.
#[derive(Debug, Clone)]
pub struct Needed {
    /// The setting's name (`hostcert`, `webserver.conf`).
    pub name: String,
    pub path: PathBuf,
    /// The daemon cannot work without it (a Puppet Server conf file may be absent: defaults).
    pub required: bool,
}

/// The daemon as `User=`, `Group=` and `SupplementaryGroups=` in `text` make it, read in
/// order as a unit file or `systemctl show` gives them; `source` says where it was read.
fn service(text: &str, source: &str) -> Result<Reader, String> {
    let (mut user, mut group, mut groups) = (None, None, Vec::new());
    let nonempty = |v: &str| Some(v.trim().to_owned()).filter(|v| !v.is_empty());
    for (key, value) in text.lines().filter_map(|l| l.trim().split_once('=')) {
        match (key, value.trim()) {
            ("User", v) => user = nonempty(v),
            ("Group", v) => group = nonempty(v),
            // An empty assignment clears the groups before it, as systemd reads it.
            ("SupplementaryGroups", "") => groups.clear(),
            ("SupplementaryGroups", v) => groups.extend(v.split_whitespace().map(str::to_owned)),
            _ => {}
        }
    }
    let user = user.ok_or_else(|| format!("{source}: no User="))?;
    let account = (User::from_name(&user).ok().flatten())
        .ok_or_else(|| format!("user {user} ({source}) does not exist"))?;
    let gid = |name: &String| match Group::from_name(name) {
        Ok(Some(group)) => Ok((group.gid.as_raw(), name.clone())),
        _ => Err(format!("group {name} ({source}) does not exist")),
    };
    let primary = match &group {
        Some(name) => gid(name)?,
        None => (account.gid.as_raw(), group_name(account.gid.as_raw())),
    };
    let others = groups.iter().map(gid).collect::<Result<Vec<_>, _>>()?;
    let (gids, names): (Vec<u32>, Vec<String>) = std::iter::once(primary).chain(others).unzip();
    let names = names.join(", ");
    Ok(Reader {
        who: format!("the service (user {user}, groups {names}; {source})"),
        uid: account.uid.as_raw(),
        gids,
        open: false,
    })
}

/// Checks every needed file for every reader; prints one line per problem and a summary, and
/// says whether all is well.
pub fn readable(needed: &[Needed], readers: &[Reader], out: &mut String) -> bool {
    let mut problems = 0;
    for n in needed {
        let (name, path) = (&n.name, n.path.display());
        let missing =
            std::fs::metadata(&n.path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
        if missing && !n.required {
            let _ = writeln!(
                out,
                "note: {name} {path} does not exist: its defaults apply"
            );
            continue;
        }
        let whys: Vec<String> = match missing {
            true => vec!["no such file".to_owned()],
            false => (readers.iter())
                .filter_map(|r| r.can_read(&n.path).err())
                .collect(),
        };
        for why in whys {
            problems += 1;
            let _ = writeln!(out, "problem: {name} {path}: {why}");
        }
    }
    let who: Vec<&str> = readers.iter().map(|r| r.who.as_str()).collect();
    let who = who.join(" and by ");
    let _ = match problems {
        0 => writeln!(out, "check: every file can be read by {who}"),
        n => writeln!(out, "check: {n} problem(s)"),
    };
    problems == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn nobody() -> Reader {
        Reader {
            who: "nobody".into(),
            uid: 65534,
            gids: vec![65534],
            open: false,
        }
    }

    /// As systemd reads them: an empty `SupplementaryGroups=` (a drop-in's) clears the ones
    /// before it, and `Group=` replaces the user's own group.
    #[test]
    fn a_drop_in_that_clears_the_groups_or_sets_the_group_is_read_as_systemd_reads_it() {
        let text =
            "User=root\nSupplementaryGroups=daemon bin\nSupplementaryGroups=\nGroup=daemon\n";
        let reader = service(text, "a test").unwrap();
        assert_eq!(reader.who, "the service (user root, groups daemon; a test)");
        assert_eq!(service("User=", "a test").unwrap_err(), "a test: no User=");
    }

    #[test]
    fn the_directory_that_blocks_is_named_not_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let inner = dir.path().join("ssl");
        std::fs::create_dir(&inner).unwrap();
        let file = inner.join("ca.pem");
        std::fs::write(&file, "x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o750)).unwrap();
        let why = nobody().can_read(&file).unwrap_err();
        assert!(
            why.starts_with(&format!(
                "{} (0750 ",
                inner.canonicalize().unwrap().display()
            )),
            "{why}"
        );
        assert!(
            why.contains("does not let nobody enter it: add group "),
            "{why}"
        );
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(nobody().can_read(&file), Ok(()));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let why = nobody().can_read(&file).unwrap_err();
        assert!(
            why.contains("(0600 ") && why.contains("does not let nobody read it"),
            "{why}"
        );
        assert!(
            !why.contains("add group"),
            "the group may not read it either: {why}"
        );
    }

    #[test]
    fn a_missing_optional_file_is_a_note_and_a_missing_required_one_a_problem() {
        let mut out = String::new();
        let needed = [
            Needed {
                name: "webserver.conf".into(),
                path: "/nonexistent/webserver.conf".into(),
                required: false,
            },
            Needed {
                name: "hostcert".into(),
                path: "/nonexistent/cert.pem".into(),
                required: true,
            },
        ];
        assert!(!readable(&needed, &[nobody()], &mut out));
        assert!(out.contains("note: webserver.conf /nonexistent/webserver.conf does not exist"));
        assert!(out.contains("problem: hostcert /nonexistent/cert.pem: no such file"));
        assert!(out.ends_with("check: 1 problem(s)\n"), "{out}");
    }
}
