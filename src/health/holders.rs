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

use std::fs::File;
use std::time::{Duration, SystemTime};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::health::drain::{Drain, DrainError, DrainFile, DrainRecord};

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
}

impl Holder {
    /// The operator's drain, written now.
    pub fn drain(reason: String, lasting: Option<Duration>, now: SystemTime) -> Self {
        let record = DrainRecord::new(reason, lasting, now);
        Self {
            kind: Kind::Drain,
            by: record.by,
            since: record.since,
            what: record.reason,
            until: record.until,
            process: None,
        }
    }

    /// This process's cycle, from now.
    pub fn cycle(reason: String, now: SystemTime) -> Self {
        let record = DrainRecord::new(reason, None, now);
        Self {
            kind: Kind::Cycle,
            by: record.by,
            since: record.since,
            what: record.reason,
            until: None,
            process: Process::this(),
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

/// The holders of a record. A record without any (written before holders existed, or by
/// hand) is one operator's drain.
pub fn of(record: &DrainRecord) -> Vec<Holder> {
    if !record.holders.is_empty() {
        return record.holders.clone();
    }
    vec![Holder {
        kind: Kind::Drain,
        by: record.by.clone(),
        since: record.since.clone(),
        what: record.reason.clone(),
        until: record.until.clone(),
        process: None,
    }]
}

/// The record that says `holders` hold the node (operators' drains first: their reason is the
/// one HAProxy shows); `None` when nobody does. A `--for` applies only while a drain is the
/// sole holder: a cycle's drain never expires under it.
pub fn record(mut holders: Vec<Holder>, forced: Option<String>) -> Option<DrainRecord> {
    holders.sort_by_key(|h| h.kind != Kind::Drain);
    let first = holders.first()?.clone();
    let until = match holders.as_slice() {
        [only] => only.until.clone(),
        _ => None,
    };
    Some(DrainRecord {
        reason: first.what,
        by: first.by,
        since: first.since,
        until,
        forced,
        holders,
    })
}

/// What an update does with the record.
#[derive(Debug)]
pub enum Change {
    /// Leave it as it is.
    Keep,
    /// Write this record.
    Write(DrainRecord),
    /// Remove the record: the node is undrained.
    Remove,
}

/// Reads the record, decides and applies `change`, all under an exclusive lock of the state
/// directory, so that no other pmcheck command changes it in between.
pub fn update<T>(
    file: &DrainFile,
    change: impl FnOnce(Option<Drain>) -> (Change, T),
) -> Result<T, DrainError> {
    let _lock = lock(file)?;
    file.sweep_leftovers();
    let (change, result) = change(file.current());
    match change {
        Change::Keep => {}
        Change::Write(record) => file.write(&record)?,
        Change::Remove => {
            file.remove()?;
        }
    }
    Ok(result)
}

/// An exclusive `flock` of the state directory, released when dropped.
fn lock(file: &DrainFile) -> Result<Flock<File>, DrainError> {
    let fail = |source| DrainError::Write {
        dir: file.dir().to_path_buf(),
        source,
    };
    file.create_dir().map_err(fail)?;
    let dir = File::open(file.dir()).map_err(fail)?;
    Flock::lock(dir, FlockArg::LockExclusive).map_err(|(_, errno)| fail(errno.into()))
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
    fn a_record_without_holders_is_one_operators_drain() {
        let record = DrainRecord::new("kernel".into(), None, SystemTime::now());
        let holders = of(&record);
        assert_eq!(holders.len(), 1);
        assert_eq!(
            (holders[0].kind, holders[0].what.as_str()),
            (Kind::Drain, "kernel")
        );
    }

    #[test]
    fn a_drain_comes_first_and_its_for_applies_only_alone() {
        let now = SystemTime::now();
        let cycle = Holder::cycle("pmcheck cycle: true".into(), now);
        let drain = Holder::drain("kernel".into(), Some(Duration::from_secs(60)), now);
        let both = record(vec![cycle.clone(), drain.clone()], None).unwrap();
        assert_eq!(both.reason, "kernel");
        assert_eq!(both.until, None, "a cycle's drain never expires under it");
        assert_eq!(both.holders[1], cycle);
        let alone = record(vec![drain.clone()], None).unwrap();
        assert_eq!(alone.until, drain.until);
        assert_eq!(record(Vec::new(), None), None);
        assert!(cycle.is_me() && cycle.running());
        assert!(cycle.describe().starts_with(&format!(
            "cycle pid {} (pmcheck cycle: true, by ",
            std::process::id()
        )));
        assert!(drain.expired_at(now + Duration::from_secs(61)));
    }
}
