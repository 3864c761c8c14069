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

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::drain::tenure::Tenure;

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
    /// Puppet Server's unit stopping (`pmcheck on-stop`): until it has started again
    /// (`pmcheck on-start`).
    Stop,
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
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id");
    Some(id.ok()?.trim().to_owned())
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
    /// Who, since when, until when (`by`, `since`, `until` in the file).
    #[serde(flatten)]
    pub tenure: Tenure,
    /// The drain's reason, or the cycle's command.
    pub what: String,
    /// The cycle's process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<Process>,
    /// The last-server guard checked it against the load balancers' word before it was
    /// written, so a load balancer may hold it ([`crate::health::hold`]). A drain written
    /// while no daemon answered (or by hand) is never held: nobody could have told its writer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checked: bool,
    /// What `--force` went past (a load balancer's word that this node is its backend's last
    /// server), or that it was forced: a forced drain is never held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced: Option<String>,
}

impl Holder {
    /// `kind` held by `tenure` for `what`, of no process, that no guard checked.
    pub fn of(kind: Kind, tenure: Tenure, what: String) -> Self {
        Self {
            kind,
            tenure,
            what,
            process: None,
            checked: false,
            forced: None,
        }
    }

    /// The operator's drain, written now by whoever runs the command.
    pub fn drain(reason: String, lasting: Option<Duration>, now: SystemTime) -> Self {
        Self::of(Kind::Drain, Tenure::from(operator(), now, lasting), reason)
    }

    /// This process's cycle, from now.
    pub fn cycle(reason: String, now: SystemTime) -> Self {
        Self {
            kind: Kind::Cycle,
            process: Process::this(),
            ..Self::drain(reason, None, now)
        }
    }

    /// Puppet Server's `unit` stopping, from now. Its `since` is to the millisecond: the
    /// daemon lets go of it once Puppet Server started after it ([`crate::health::hold`]).
    pub fn stop(unit: &str, now: SystemTime) -> Self {
        let mut stop = Self::drain(format!("{unit} stopping"), None, now);
        stop.kind = Kind::Stop;
        stop.tenure.since = crate::drain::tenure::Stamp::millis(now);
        stop
    }

    /// `other` goes when this holder is held: a drain replaces the earlier drain, a stop the
    /// last stop's hold; every cycle holds on its own.
    pub fn replaces(&self, other: &Holder) -> bool {
        matches!(self.kind, Kind::Drain | Kind::Stop) && other.kind == self.kind
    }

    /// The holder is this process.
    pub fn is_me(&self) -> bool {
        self.process.is_some() && self.process == Process::this()
    }

    /// A cycle that still runs.
    pub fn running(&self) -> bool {
        self.kind == Kind::Cycle && self.process.as_ref().is_some_and(Process::alive)
    }

    /// For people: `cycle pid 4242 (pmcheck cycle: systemctl restart puppetserver, by alice
    /// since ...)`, with `, no longer running` for a stale one.
    pub fn describe(&self) -> String {
        let who = match (&self.kind, &self.process) {
            (Kind::Drain, _) => "drain".to_owned(),
            (Kind::Cycle, Some(p)) => format!("cycle pid {}", p.pid),
            (Kind::Cycle, None) => "cycle".to_owned(),
            (Kind::StoppedCycle, _) => "stopped cycle".to_owned(),
            (Kind::Stop, _) => "stop".to_owned(),
        };
        let stale = if self.kind == Kind::Cycle && !self.running() {
            ", no longer running"
        } else {
            ""
        };
        let Tenure { by, since, .. } = &self.tenure;
        format!("{who} ({}, by {by} since {since}{stale})", self.what)
    }
}

/// Who drains, from the system's user database (NSS), not from variables anyone can set: the
/// real user, and the person behind sudo when that is credible (we run as root, and sudo's
/// SUDO_USER and SUDO_UID name the same account).
pub(crate) fn operator() -> String {
    let uid = nix::unistd::getuid();
    let me = crate::accounts::user_name(uid.as_raw());
    if !uid.is_root() {
        return me;
    }
    let sudoer = std::env::var("SUDO_USER").ok().filter(|name| {
        std::env::var("SUDO_UID")
            .ok()
            .and_then(|id| id.parse().ok())
            .filter(|&id| id != 0)
            .is_some_and(|id| crate::accounts::user_name(id) == *name)
    });
    sudoer.map_or(me, |name| format!("{name} via sudo"))
}

/// What a hold found.
#[derive(Debug)]
pub struct Held {
    /// The holders it replaced, expired or not.
    pub replaced: Vec<Holder>,
    /// The live holders beside the new one.
    pub others: Vec<Holder>,
}

/// What letting go of one holder left.
#[derive(Debug, PartialEq, Eq)]
pub enum Release {
    /// There was no record: nobody held the node.
    NotDrained,
    /// The record does not name that holder, and is left as it is.
    NotHeld(Vec<Holder>),
    /// It was the last holder: the record is removed.
    Undrained,
    /// These others still hold the node.
    StillHeld(Vec<Holder>),
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
}
