//! A roll's mark: `STATE_DIR/roll`, which says that one rolling restart (the Ansible play, or
//! any tool that runs `pmcheck cycle` master by master) has claimed this master. Two rolls at
//! once each leave a master out and the guard is then all that protects the backend; a mark
//! on every master the roll will touch, refused while another roll's is there, makes them
//! take turns from any control node.
//!
//! The mark is a file of its own, not a holder of the drain record: every holder drains, and
//! a pmcheck that does not know a new kind reads the record as not valid, which still drains.
//! A roll marks every master before it begins, so an older daemon on any master would take
//! them all out at once. A mark drains nothing; it is changed under the state directory's
//! lock, as the record is, and lapses at its `until`, so a play killed with its control node
//! does not keep the next one out for good.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::drain::file::{DrainError, DrainFile, Locked};
use crate::drain::holders::operator;
use crate::drain::lock::LockError;
use crate::drain::record::REASON_LIMIT;
use crate::drain::tenure::Tenure;
use crate::text;

/// The mark's name in the state directory.
pub const NAME: &str = "roll";
/// The most a mark may be: what pmcheck writes is a few hundred bytes.
const LIMIT: u64 = 4096;
/// The most of a roll's name kept.
pub const NAME_LIMIT: usize = 128;

/// One roll's claim on this master.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// The roll's name, the same on every master it marks (the playbook's: its control node
    /// and start time).
    pub roll: String,
    /// What it runs, for the operator.
    pub what: String,
    /// Who began it, since when, and when the mark lapses.
    #[serde(flatten)]
    pub tenure: Tenure,
}

impl Mark {
    /// A mark for `roll`, by the person running this command, from `now` for `lasting`.
    pub fn new(roll: &str, what: &str, now: SystemTime, lasting: Duration) -> Self {
        Self {
            roll: text::one_line(roll, NAME_LIMIT).into_owned(),
            what: text::one_line(what, REASON_LIMIT).into_owned(),
            tenure: Tenure::from(operator(), now, Some(lasting)),
        }
    }

    /// `roll NAME (WHAT; by alice since ... until ...)`.
    pub fn describe(&self) -> String {
        let Tenure { by, since, until } = &self.tenure;
        let until = (until.as_ref())
            .map(|u| format!(" until {u}"))
            .unwrap_or_default();
        format!(
            "roll {} ({}; by {by} since {since}{until})",
            self.roll, self.what
        )
    }
}

/// Why a roll's mark cannot be made or taken away.
#[derive(Debug, Error)]
pub enum RollError {
    /// Another roll marked this master, and its mark has not lapsed.
    #[error(
        "another roll is under way here: {}; one roll at a time: wait for it to end, or, if its \
         play is gone, `pmcheck roll end --name '{}'` on each master it marked",
        .0.describe(), .0.roll
    )]
    Taken(Box<Mark>),
    /// The mark cannot be read: whose it is cannot be told, so no roll may begin.
    #[error(
        "cannot read the roll mark {path}: {why}; whose roll it is cannot be told: remove it \
         with `pmcheck roll end --force` once no roll runs"
    )]
    Unreadable {
        /// The mark's path.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// Another command held the state directory's lock for the whole wait.
    #[error("cannot change the roll mark: {0}")]
    Locked(#[source] LockError),
    /// The mark (or the lock it is changed under) cannot be written or removed.
    #[error("cannot change the roll mark {path}: {source}")]
    Write {
        /// The mark's path.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// `begin` without a name (`--force` only ends a mark).
    #[error("roll begin needs --name: the same name on every master the roll marks")]
    Unnamed,
    /// An option of the other step (`begin --force`, `end --reason`, `end --for`): refused
    /// rather than ignored, so that nobody believes it did something.
    #[error("{option} is not for `roll {step}`: {fix}")]
    Misplaced {
        /// The option given.
        option: &'static str,
        /// The step it was given to.
        step: &'static str,
        /// What to do instead.
        fix: &'static str,
    },
}

/// What a roll's mark was before `begin`.
#[derive(Debug, PartialEq, Eq)]
pub enum Began {
    /// None: this roll's is the first.
    Marked,
    /// This roll's own, renewed (the play ran the step again).
    Renewed,
    /// A lapsed one of another roll, replaced.
    Replaced(Mark),
}

/// What `end` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// This roll's mark, removed.
    Removed,
    /// No mark.
    NotMarked,
    /// Another roll's, left as it is.
    Other(Mark),
    /// `--force`: whatever stood there, removed.
    Forced(Option<Mark>),
}

/// The mark in `dir`: `None` when there is none.
pub fn read(dir: &Path) -> Result<Option<Mark>, RollError> {
    let path = dir.join(NAME);
    let unreadable = |why: String| RollError::Unreadable {
        path: path.clone(),
        why,
    };
    match crate::safe_file::read_state(&path, LIMIT) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| unreadable(format!("not a roll mark ({e})"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(unreadable(e.to_string())),
    }
}

impl Locked<'_> {
    /// Marks this master for `mine`'s roll, unless another roll's live mark is there.
    pub fn begin_roll(self, mine: &Mark, now: SystemTime) -> Result<Began, RollError> {
        let file = self.file();
        let began = match read(file.dir())? {
            None => Began::Marked,
            Some(other) if other.roll == mine.roll => Began::Renewed,
            Some(other) if other.tenure.expired_at(now) => Began::Replaced(other),
            Some(other) => return Err(RollError::Taken(Box::new(other))),
        };
        let json = serde_json::to_string_pretty(mine).map_err(io::Error::from);
        json.and_then(|json| file.replace(&file.dir().join(NAME), (json + "\n").as_bytes()))
            .map_err(|source| write_error(file, source))?;
        Ok(began)
    }

    /// Takes `roll`'s mark away; another roll's stays unless `force`.
    pub fn end_roll(self, roll: &str, force: bool) -> Result<Ended, RollError> {
        let file = self.file();
        let found = match read(file.dir()) {
            Ok(found) => found,
            Err(RollError::Unreadable { .. }) if force => None,
            Err(e) => return Err(e),
        };
        let ended = match found {
            None if !force => return Ok(Ended::NotMarked),
            Some(other) if other.roll != roll && !force => return Ok(Ended::Other(other)),
            Some(mine) if mine.roll == roll => Ended::Removed,
            found => Ended::Forced(found),
        };
        match std::fs::remove_file(file.dir().join(NAME)) {
            Ok(()) => Ok(ended),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Ended::NotMarked),
            Err(source) => Err(write_error(file, source)),
        }
    }
}

fn write_error(file: &DrainFile, source: io::Error) -> RollError {
    RollError::Write {
        path: file.dir().join(NAME),
        source,
    }
}

impl RollError {
    /// The state directory's lock could not be taken for the mark in `dir`: said of the
    /// mark, not of the drain record.
    pub fn unlocked(dir: &Path, e: DrainError) -> Self {
        let path = dir.join(NAME);
        match e {
            DrainError::Locked(held) => RollError::Locked(held),
            DrainError::Write { source, .. }
            | DrainError::Lock { source, .. }
            | DrainError::Remove { source, .. } => RollError::Write { path, source },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(roll: &str, lasting: Duration) -> Mark {
        Mark::new(
            roll,
            "systemctl restart puppetserver",
            SystemTime::now(),
            lasting,
        )
    }

    #[test]
    fn one_roll_at_a_time_until_it_ends_or_lapses() {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        let now = SystemTime::now();
        let hour = Duration::from_secs(3600);
        let first = mark("ctl1 1", hour);
        let began = |m: &Mark, at| file.lock().unwrap().begin_roll(m, at);
        assert_eq!(began(&first, now).unwrap(), Began::Marked);
        assert_eq!(began(&first, now).unwrap(), Began::Renewed);
        let second = mark("ctl2 7", hour);
        let e = began(&second, now).unwrap_err().to_string();
        assert!(
            e.contains("another roll is under way here: roll ctl1 1 ("),
            "{e}"
        );
        assert!(e.contains("`pmcheck roll end --name 'ctl1 1'`"), "{e}");
        assert!(!file.occupied(), "a mark drains nothing");
        // Another roll's end leaves the mark; its own takes it away.
        let end = |roll: &str, force| file.lock().unwrap().end_roll(roll, force).unwrap();
        assert!(matches!(end("ctl2 7", false), Ended::Other(m) if m == first));
        assert_eq!(end("ctl1 1", false), Ended::Removed);
        assert_eq!(end("ctl1 1", false), Ended::NotMarked);
        // A lapsed mark of another roll is replaced.
        assert_eq!(began(&first, now).unwrap(), Began::Marked);
        let later = now + 2 * hour;
        assert!(matches!(began(&second, later).unwrap(), Began::Replaced(m) if m == first));
        assert!(matches!(end("x", true), Ended::Forced(Some(m)) if m == second));
    }

    #[test]
    fn an_unreadable_mark_lets_no_roll_begin_and_force_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        std::fs::write(dir.path().join(NAME), "garbage").unwrap();
        let e = (file.lock().unwrap())
            .begin_roll(&mark("r", Duration::from_secs(60)), SystemTime::now())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a roll mark"), "{e}");
        assert!(e.contains("`pmcheck roll end --force`"), "{e}");
        assert!(matches!(
            file.lock().unwrap().end_roll("r", false),
            Err(RollError::Unreadable { .. })
        ));
        assert_eq!(
            file.lock().unwrap().end_roll("r", true).unwrap(),
            Ended::Forced(None)
        );
        assert!(read(dir.path()).unwrap().is_none());
    }
}
