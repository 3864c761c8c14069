//! `pmcheck config --check`: can the daemon read every file it needs? As the user running the
//! command, and, when that is root, as the unit runs the daemon (its `User=` and
//! `SupplementaryGroups=`), judged from owners, groups and mode bits along each path, so that
//! the message names the file or directory that blocks (`/var/lib/puppet`, 0750, not `ca.pem`).
//! ACLs and security modules are not judged: the check for the running user also opens the file.

use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Group, User};

use crate::accounts::{group_name, user_name};

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
        let dirs: Vec<&Path> = (full.ancestors().skip(1))
            .filter(|d| d.parent().is_some())
            .collect();
        for dir in dirs.into_iter().rev() {
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
    for line in text.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("User=") {
            user = nonempty(v);
        } else if let Some(v) = line.strip_prefix("Group=") {
            group = nonempty(v);
        } else if let Some(v) = line.strip_prefix("SupplementaryGroups=") {
            // An empty assignment clears the groups before it, as systemd reads it.
            match v.trim() {
                "" => groups.clear(),
                v => groups.extend(v.split_whitespace().map(str::to_owned)),
            }
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
pub fn check(needed: &[Needed], readers: &[Reader], out: &mut String) -> bool {
    let mut problems = 0;
    for n in needed {
        let (name, path) = (&n.name, n.path.display());
        let missing =
            std::fs::metadata(&n.path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
        let whys = match missing {
            true if n.required => vec!["no such file".to_owned()],
            true => {
                out.push_str(&format!(
                    "note: {name} {path} does not exist: its defaults apply\n"
                ));
                continue;
            }
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
        assert!(!check(&needed, &[nobody()], &mut out));
        assert!(out.contains("note: webserver.conf /nonexistent/webserver.conf does not exist"));
        assert!(out.contains("problem: hostcert /nonexistent/cert.pem: no such file"));
        assert!(out.ends_with("check: 1 problem(s)\n"), "{out}");
    }
}
