//! The drain record: an operator's decision, kept on disk, that this node must leave the pool.
//!
//! It is a small JSON file, `STATE_DIR/drain` ([`crate::drain::file`]). Whatever else sits
//! at that path (a symlink, a FIFO, a device, a directory, a file larger than any record) is
//! refused unread: the node then answers 503 UNKNOWN with the reason, because nobody can tell
//! whether it was meant to be drained. The daemon does not read the file per poll:
//! [`crate::drain::watch`] re-reads it when it changes.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::drain::holders::{Holder, Kind};
use crate::drain::tenure::{STAMP_LIMIT, Stamp, Tenure};
use crate::text;

/// The largest drain file read. What `pmcheck drain` writes stays under 2 KiB.
pub const RECORD_LIMIT: u64 = 8 * 1024;
/// The longest reason `pmcheck drain` accepts, and the most of a hand-written one shown.
pub const REASON_LIMIT: usize = 256;
/// The longest `forced` note kept from a record.
const FORCED_LIMIT: usize = 512;

/// The record as it is stored: who holds the node drained, `{"holders": [...]}`
/// ([`crate::drain::holders`]), operators' drains first: their reason is the one HAProxy shows.
///
/// A record written by hand names one drain at the top instead, with `reason`, `by`, `since`
/// and optionally `until`: it reads as that operator's drain, one no guard checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Stored")]
pub struct DrainRecord {
    /// Who holds the node drained; never empty.
    holders: Vec<Holder>,
}

/// A record as read: its holders, or a hand-written drain's fields.
#[derive(Deserialize)]
struct Stored {
    #[serde(default)]
    holders: Vec<Holder>,
    reason: Option<String>,
    by: Option<String>,
    since: Option<Stamp>,
    until: Option<Stamp>,
}

impl TryFrom<Stored> for DrainRecord {
    type Error = &'static str;

    fn try_from(stored: Stored) -> Result<Self, Self::Error> {
        if !stored.holders.is_empty() {
            return Ok(Self::sorted(stored.holders));
        }
        let (Some(reason), Some(by), Some(since)) = (stored.reason, stored.by, stored.since) else {
            return Err("it names no holders, nor a drain's `reason`, `by` and `since`");
        };
        let tenure = Tenure {
            by,
            since,
            until: stored.until,
        };
        Ok(Self {
            holders: vec![Holder::of(Kind::Drain, tenure, reason)],
        })
    }
}

impl DrainRecord {
    /// The record that says `holders` hold the node; `None` when nobody does.
    pub fn held_by(holders: Vec<Holder>) -> Option<Self> {
        (!holders.is_empty()).then(|| Self::sorted(holders))
    }

    fn sorted(mut holders: Vec<Holder>) -> Self {
        holders.sort_by_key(|h| h.kind != Kind::Drain);
        Self { holders }
    }

    /// Who holds the node, operators' drains first.
    pub fn holders(&self) -> &[Holder] {
        &self.holders
    }

    /// The holder the record is shown by: an operator's drain when there is one.
    pub fn first(&self) -> &Holder {
        // Never empty: `held_by` and the reading refuse an empty record.
        &self.holders[0]
    }

    /// Why the node is drained: the first holder's reason.
    pub fn reason(&self) -> &str {
        &self.first().what
    }

    /// Who drained it: the first holder's.
    pub fn by(&self) -> &str {
        &self.first().tenure.by
    }

    /// Since when: the first holder's.
    pub fn since(&self) -> &Stamp {
        &self.first().tenure.since
    }

    /// Until when: the first holder's `--for`, while it is the sole holder (a cycle's drain
    /// never expires under it).
    pub fn until(&self) -> Option<&Stamp> {
        match self.holders.as_slice() {
            [only] => only.tenure.until.as_ref(),
            _ => None,
        }
    }

    /// Whether the drain lapsed by itself: its `until` has passed (an `until` that is not a
    /// time never lapses).
    pub fn expired_at(&self, now: SystemTime) -> bool {
        matches!(self.holders.as_slice(), [only] if only.tenure.expired_at(now))
    }

    /// What a `--force` went past, when a holder was forced.
    pub fn forced(&self) -> Option<&str> {
        self.holders.iter().find_map(|h| h.forced.as_deref())
    }
}

/// Checks a `--reason`: one line of printable text, short enough for HAProxy's stats page.
pub fn parse_reason(text: &str) -> Result<String, String> {
    let length = text.chars().count();
    if length > REASON_LIMIT {
        return Err(format!(
            "is {length} characters long; keep it to {REASON_LIMIT} (it is shown on HAProxy's \
             stats page and in every answer)"
        ));
    }
    if text.chars().any(char::is_control) {
        return Err(
            "contains a line break or another control character; write it on one line".to_owned(),
        );
    }
    if text.trim().is_empty() {
        return Err("is empty; say why the node leaves the pool".to_owned());
    }
    Ok(text.to_owned())
}

/// A drain file as found on disk. A file that is not a valid record still drains the node:
/// someone meant to drain it (`touch drain`), and guessing otherwise would put it back in the pool.
#[derive(Debug, Clone)]
pub struct Drain {
    /// The record, its texts made one-line and bounded (a hand-written file may hold anything).
    pub record: Option<DrainRecord>,
    /// What is wrong with the file, if anything.
    pub problem: Option<DrainProblem>,
}

impl Drain {
    /// The holders of the drain record `d`, if it is one: what a change keeps or replaces.
    pub fn holders_of(d: Option<Drain>) -> Vec<Holder> {
        (d.and_then(|d| d.record))
            .map(|r| r.holders().to_vec())
            .unwrap_or_default()
    }

    /// Reads a drain file's bytes; never fails (see the type's documentation).
    pub fn parse(bytes: &[u8]) -> Self {
        let mut record = match serde_json::from_slice::<DrainRecord>(bytes) {
            Ok(record) => record,
            Err(e) => {
                return Self {
                    record: None,
                    problem: Some(DrainProblem::of(bytes, e)),
                };
            }
        };
        for holder in &mut record.holders {
            holder.what = text::one_line(&holder.what, REASON_LIMIT).into_owned();
            holder.tenure.by = text::one_line(&holder.tenure.by, STAMP_LIMIT).into_owned();
            if let Some(forced) = &mut holder.forced {
                *forced = text::one_line(forced, FORCED_LIMIT).into_owned();
            }
        }
        let problem = record
            .until()
            .and_then(Stamp::problem)
            .map(DrainProblem::BadUntil);
        Self {
            record: Some(record),
            problem,
        }
    }

    /// When the drain began, if the record says so in RFC 3339.
    pub fn since(&self) -> Option<SystemTime> {
        self.record.as_ref()?.since().time()
    }

    /// When a `drain --for` lapses; `None` for a drain that lasts until `pmcheck undrain`.
    pub fn until(&self) -> Option<SystemTime> {
        self.record.as_ref()?.until()?.time()
    }

    /// Whether the drain lapsed by itself (`drain --for`).
    pub fn expired_at(&self, now: SystemTime) -> bool {
        self.record.as_ref().is_some_and(|r| r.expired_at(now))
    }

    /// The reason first, then who and when in few characters (`kernel upgrade (by alice
    /// 17:32Z-18:32Z)`): what the verdict's reason carries, because HAProxy shows only about
    /// 100 characters of a check's info and the reason must survive.
    pub fn summary(&self, now: SystemTime) -> String {
        let Some(r) = &self.record else {
            return self.describe();
        };
        // `YYYY-MM-DD` of now, in UTC.
        let today = &humantime::format_rfc3339_seconds(now).to_string()[..10];
        let (by, since) = (r.by(), r.since());
        let mut s = format!("{} (by {by} {}", r.reason(), clock(since, today));
        if let Some(until) = r.until() {
            s.push('-');
            s.push_str(&clock(until, since.as_str().get(..10).unwrap_or(today)));
        }
        s.push(')');
        // Only the mark of a `--force`: its note would push Puppet Server's state, which
        // follows, out of the 100 characters HAProxy shows (the record keeps the note, and
        // `describe` says it).
        if r.forced().is_some() {
            s.push_str("; forced");
        }
        s + &self.flaw()
    }

    /// What a phrase about the record ends with: `; ` and what is wrong with it, if anything.
    fn flaw(&self) -> String {
        (self.problem.as_ref())
            .map(|problem| format!("; {problem}"))
            .unwrap_or_default()
    }

    /// One phrase for people: the reason, who and since when.
    pub fn describe(&self) -> String {
        match &self.record {
            Some(r) => {
                let until = r.until().map(|u| format!(" until {u}")).unwrap_or_default();
                // A `--force` that went past a load balancer's hold, with its note.
                let forced = (r.forced().map(|f| format!("; forced: {f}"))).unwrap_or_default();
                let (reason, by, since, flaw) = (r.reason(), r.by(), r.since(), self.flaw());
                format!("{reason} (by {by} since {since}{until}){forced}{flaw}")
            }
            None => match &self.problem {
                Some(DrainProblem::Note(note)) => format!("{note} (a note, {NOTE})"),
                problem => format!(
                    "drain file is {}; it still counts as drained",
                    problem
                        .as_ref()
                        .map_or("unreadable".to_owned(), ToString::to_string)
                ),
            },
        }
    }

    /// A hand-written note's first line, which stands for the reason.
    pub fn note(&self) -> Option<&str> {
        match &self.problem {
            Some(DrainProblem::Note(note)) => Some(note),
            _ => None,
        }
    }
}

/// What a note drain file is, after its text.
const NOTE: &str = "not a pmcheck record; it still counts as drained";

/// An RFC 3339 time in few characters: `17:32Z` on `day` (`17:32:05Z` when the seconds count),
/// else `2026-11-20T17:32Z`; a time that does not parse, as written.
fn clock(time: &Stamp, day: &str) -> String {
    let Some(t) = time.time() else {
        return time.as_str().to_owned();
    };
    let full = humantime::format_rfc3339_seconds(t).to_string();
    let (date, rest) = full.split_at(10);
    let hms = rest.trim_start_matches('T').trim_end_matches('Z');
    let hm = hms.strip_suffix(":00").unwrap_or(hms);
    if date == day {
        format!("{hm}Z")
    } else {
        format!("{date}T{hm}Z")
    }
}

/// What is wrong with a drain file that still drains the node.
#[derive(Debug, Clone, Error)]
pub enum DrainProblem {
    /// The file is empty (`touch drain`).
    #[error("empty")]
    Empty,
    /// The file is text, not JSON (`echo "kernel upgrade" > drain`): its first line, made one
    /// safe line, stands for the reason, where a JSON parser's complaint would say nothing.
    #[error("{NOTE}")]
    Note(String),
    /// The file looks like JSON but is not a drain record (a hand-edited record).
    #[error("not a valid drain record ({0})")]
    NotARecord(Arc<serde_json::Error>),
    /// `until` is not an RFC 3339 time.
    #[error("`until` is not an RFC 3339 time ({0}), so the drain does not expire")]
    BadUntil(humantime::TimestampError),
}

impl DrainProblem {
    /// Why `bytes` are not a record: empty, a note, or broken JSON with the parser's words.
    fn of(bytes: &[u8], e: serde_json::Error) -> Self {
        let text = String::from_utf8_lossy(bytes);
        let text = text.trim();
        match text.chars().next() {
            None => DrainProblem::Empty,
            Some('{' | '[' | '"') => DrainProblem::NotARecord(Arc::new(e)),
            Some(_) => {
                let first = text.lines().next().unwrap_or_default();
                DrainProblem::Note(text::one_line(first, REASON_LIMIT).into_owned())
            }
        }
    }
}

/// What the drain record says at one moment.
#[derive(Debug, Clone)]
pub enum DrainState {
    /// There is no drain record.
    NotDrained,
    /// The node is drained.
    Drained(Drain),
    /// A `--for` drain whose time is up: it no longer counts, but people should see it.
    Expired(Drain),
    /// The state cannot be read, so nobody can tell whether the node is drained: fail closed.
    Unknown(Unreadable),
}

impl DrainState {
    pub(crate) fn of(drain: Drain, now: SystemTime) -> Self {
        if drain.expired_at(now) {
            DrainState::Expired(drain)
        } else {
            DrainState::Drained(drain)
        }
    }

    /// The same state seen at `now`: a drain whose `until` has passed becomes expired.
    pub fn at(&self, now: SystemTime) -> Option<Self> {
        match self {
            DrainState::Drained(d) if d.expired_at(now) => Some(DrainState::Expired(d.clone())),
            _ => None,
        }
    }
}

/// Why the drain state cannot be told.
#[derive(Debug, Clone, Error)]
pub enum Unreadable {
    #[error(
        "drain record {path} is a symbolic link, which pmcheck does not follow: remove it \
         (`pmcheck undrain`) and drain with `pmcheck drain`"
    )]
    /// The record is a symbolic link.
    Symlink {
        /// The drain record's path.
        path: PathBuf,
    },
    #[error(
        "drain record {path} is {kind}, not a regular file: remove it (`pmcheck undrain`, or \
         by hand) and drain with `pmcheck drain`"
    )]
    /// The record is a FIFO, device, directory or socket.
    NotRegular {
        /// The drain record's path.
        path: PathBuf,
        /// What it is instead, in words.
        kind: &'static str,
    },
    #[error(
        "drain record {path} is {len} bytes, more than the {RECORD_LIMIT} a record may have: \
         it is not read; replace it with `pmcheck drain` or remove it with `pmcheck undrain`"
    )]
    /// The record is larger than any record pmcheck writes.
    TooLarge {
        /// The drain record's path.
        path: PathBuf,
        /// Its size in bytes.
        len: u64,
    },
    /// Reading the record failed.
    #[error("cannot read drain record {path}: {source}")]
    Read {
        /// The drain record's path.
        path: PathBuf,
        /// What the system said.
        source: Arc<io::Error>,
    },
    #[error(
        "reading drain record {path} has not finished after {}: is its filesystem hung?",
        crate::settings::duration::format_duration(*after)
    )]
    /// Reading the record did not finish in time.
    Hung {
        /// The drain record's path.
        path: PathBuf,
        /// How long pmcheck waited.
        after: Duration,
    },
    #[error(
        "state directory {dir} does not exist: create it (the package does, and `pmcheck serve` \
         does when it may) or pass --state-dir"
    )]
    /// The state directory is missing.
    NoStateDir {
        /// The state directory.
        dir: PathBuf,
    },
    /// The state directory is something else.
    #[error("state directory {dir} is not a directory")]
    StateDirNotDir {
        /// The state directory.
        dir: PathBuf,
    },
    /// The state directory cannot be examined.
    #[error("cannot read state directory {dir}: {source}")]
    StateDir {
        /// The state directory.
        dir: PathBuf,
        /// What the system said.
        source: Arc<io::Error>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_a_record_is_empty_a_note_or_broken_json() {
        let problem = |bytes: &[u8]| Drain::parse(bytes).problem.map(|p| p.to_string());
        assert_eq!(problem(b" \n").as_deref(), Some("empty"));
        let note = Drain::parse(b"\n  reboot\r\n2nd line");
        assert_eq!(note.note(), Some("reboot"));
        assert!(note.record.is_none());
        let broken = problem(br#"{"reason": "kernel"#).unwrap_or_default();
        assert!(
            broken.starts_with("not a valid drain record (EOF"),
            "{broken}"
        );
    }
}
