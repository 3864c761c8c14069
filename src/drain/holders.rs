//! Who holds the node drained: an operator's `pmcheck drain`, each running `pmcheck cycle`, and
//! cycles that stopped half-way. The node returns to rotation only when none is left.
//!
//! The holders live in the drain record itself (`holders`), so the daemon still reads one file
//! and a drain is still one atomic rename. Every change is a read-modify-write under an
//! exclusive `flock` of the state directory, so two commands never undo each other. A cycle is
//! identified by its process ID, the process's start time and the boot ID: one that died, or a
//! reboot, is recognised as stale. A stale cycle keeps the node drained (it may have stopped
//! half-way through an upgrade) but does not stop `pmcheck undrain`; a running one does, unless
//! `--force`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// What kind of holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// `pmcheck drain`: until `pmcheck undrain` (or its `--for` ends).
    Drain,
    /// A running `pmcheck cycle`: until it ends.
    Cycle,
    /// A cycle that stopped half-way: until `pmcheck undrain`.
    StoppedCycle,
}

/// A process, told apart from any later one with the same PID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    /// Its PID.
    pub pid: u32,
    /// Its start time in clock ticks after boot (`/proc/PID/stat`, field 22).
    pub start: u64,
    /// The boot it ran in (`/proc/sys/kernel/random/boot_id`).
    pub boot: String,
}

impl Process {
    /// This process.
    pub fn this() -> Option<Self> {
        let pid = std::process::id();
        Some(Self {
            pid,
            start: start_of(pid)?,
            boot: boot_id()?,
        })
    }

    /// The process still runs: same boot, same PID, same start time.
    pub fn alive(&self) -> bool {
        boot_id().is_some_and(|b| b == self.boot) && start_of(self.pid) == Some(self.start)
    }
}

fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_owned())
}

/// Field 22 of `/proc/PID/stat`, after the command name (which may hold spaces and parentheses).
fn start_of(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// One holder of the drain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// What kind.
    pub kind: Kind,
    /// Who (`alice`, `alice via sudo`).
    pub by: String,
    /// Since when (RFC 3339).
    pub since: String,
    /// The drain's reason, or the cycle's command.
    pub what: String,
    /// The end of a `drain --for` (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// The cycle's process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<Process>,
    /// The last-server guard checked it against a load balancer's word before it was written,
    /// so a load balancer may hold it ([`crate::health::hold`]). A drain written without
    /// the daemon (or by hand) is never held: nobody could have told its writer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub guarded: bool,
}

impl Holder {
    /// The operator's drain, written now by whoever runs the command.
    pub fn drain(reason: String, lasting: Option<Duration>, now: SystemTime) -> Self {
        Self {
            kind: Kind::Drain,
            by: operator(),
            since: rfc3339(now),
            what: reason,
            // To the millisecond, rounded up: `--for 3s` lasts 3 s, and never ends early.
            until: lasting.map(|d| rfc3339_millis(ceil_milli(now + d))),
            process: None,
            guarded: false,
        }
    }

    /// This process's cycle, from now.
    pub fn cycle(reason: String, now: SystemTime) -> Self {
        Self {
            kind: Kind::Cycle,
            by: operator(),
            since: rfc3339(now),
            what: reason,
            until: None,
            process: Process::this(),
            guarded: false,
        }
    }

    /// The holder is this process.
    pub fn is_me(&self) -> bool {
        self.process.is_some() && self.process == Process::this()
    }

    /// A cycle that still runs.
    pub fn running(&self) -> bool {
        self.kind == Kind::Cycle && self.process.as_ref().is_some_and(Process::alive)
    }

    /// A drain whose `--for` has passed: it holds nothing any more.
    pub fn expired_at(&self, now: SystemTime) -> bool {
        self.until
            .as_deref()
            .and_then(|u| humantime::parse_rfc3339_weak(u).ok())
            .is_some_and(|until| now >= until)
    }

    /// For people: `cycle pid 4242 (pmcheck cycle: systemctl restart puppetserver, by alice
    /// since ...)`, with `, no longer running` for a stale one.
    pub fn describe(&self) -> String {
        let who = match (&self.kind, &self.process) {
            (Kind::Drain, _) => "drain".to_owned(),
            (Kind::Cycle, Some(p)) => format!("cycle pid {}", p.pid),
            (Kind::Cycle, None) => "cycle".to_owned(),
            (Kind::StoppedCycle, _) => "stopped cycle".to_owned(),
        };
        let stale = if self.kind == Kind::Cycle && !self.running() {
            ", no longer running"
        } else {
            ""
        };
        format!(
            "{who} ({}, by {} since {}{stale})",
            self.what, self.by, self.since
        )
    }
}

/// Who drains, from the system's user database (NSS), not from variables anyone can set: the
/// real user, and the person behind sudo when that is credible (we run as root, and sudo's
/// SUDO_USER and SUDO_UID name the same account).
pub(crate) fn operator() -> String {
    let uid = nix::unistd::getuid();
    let me = user_name(uid);
    if !uid.is_root() {
        return me;
    }
    let sudoer = std::env::var("SUDO_USER").ok().filter(|name| {
        std::env::var("SUDO_UID")
            .ok()
            .and_then(|id| id.parse().ok())
            .filter(|&id| id != 0)
            .is_some_and(|id| user_name(nix::unistd::Uid::from_raw(id)) == *name)
    });
    match sudoer {
        Some(name) => format!("{name} via sudo"),
        None => me,
    }
}

/// The user database's name for `uid`, else `uid N`.
pub(crate) fn user_name(uid: nix::unistd::Uid) -> String {
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => user.name,
        _ => format!("uid {uid}"),
    }
}

/// RFC 3339 in whole seconds, UTC.
fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn rfc3339_millis(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

fn ceil_milli(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) if d.subsec_nanos() % 1_000_000 > 0 => {
            UNIX_EPOCH + Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX) + 1)
        }
        _ => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_dead_or_earlier_one_is_not() {
        let me = Process::this().expect("/proc is mounted");
        assert!(me.alive());
        let earlier = Process {
            start: me.start.saturating_sub(1),
            ..me.clone()
        };
        assert!(!earlier.alive(), "the PID was reused");
        let other_boot = Process {
            boot: "00000000-0000-0000-0000-000000000000".into(),
            ..me.clone()
        };
        assert!(!other_boot.alive(), "a reboot since");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(start_of(pid), None, "reaped");
    }

    #[test]
    fn a_drain_for_lasts_exactly_that_long_to_the_millisecond() {
        let now = humantime::parse_rfc3339("2026-11-22T10:00:00.250Z").unwrap();
        let d = Holder::drain("x".into(), Some(Duration::from_secs(3)), now);
        assert_eq!(d.until.as_deref(), Some("2026-11-22T10:00:03.250Z"));
        assert!(!d.expired_at(now + Duration::from_millis(2999)));
        assert!(d.expired_at(now + Duration::from_secs(3)));
        // Below a millisecond, rounded up: never early.
        let now = now + Duration::from_micros(1);
        let d = Holder::drain("x".into(), Some(Duration::from_secs(3)), now);
        assert_eq!(d.until.as_deref(), Some("2026-11-22T10:00:03.251Z"));
    }
}
