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

/// The record as it is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRecord {
    /// Why the node is drained.
    pub reason: String,
    /// Who drained it, since when, until when (`by`, `since`, `until` in the file).
    #[serde(flatten)]
    pub tenure: Tenure,
    /// Why `drain --force` was needed: which load balancer said this node was the last server
    /// taking traffic. Absent for an ordinary drain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced: Option<String>,
    /// Who holds the node drained ([`crate::drain::holders`]); empty in a record written
    /// before holders existed, or by hand: then it is one operator's drain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
}

impl DrainRecord {
    /// A record made now by whoever runs the command.
    pub fn new(reason: String, lasting: Option<Duration>, now: SystemTime) -> Self {
        let drain = Holder::drain(reason, lasting, now);
        Self {
            reason: drain.what,
            tenure: drain.tenure,
            forced: None,
            holders: Vec::new(),
        }
    }

    /// Who holds the node. A record without holders (written before they existed, or by
    /// hand) is one operator's drain.
    pub fn holders(&self) -> Vec<Holder> {
        if !self.holders.is_empty() {
            return self.holders.clone();
        }
        vec![Holder {
            kind: Kind::Drain,
            tenure: self.tenure.clone(),
            what: self.reason.clone(),
            process: None,
            guarded: false,
        }]
    }

    /// The record that says `holders` hold the node (operators' drains first: their reason is
    /// the one HAProxy shows); `None` when nobody does. A `--for` applies only while a drain is
    /// the sole holder: a cycle's drain never expires under it.
    pub fn held_by(mut holders: Vec<Holder>, forced: Option<String>) -> Option<Self> {
        holders.sort_by_key(|h| h.kind != Kind::Drain);
        let first = holders.first()?.clone();
        let mut tenure = first.tenure;
        if holders.len() > 1 {
            tenure.until = None;
        }
        Some(Self {
            reason: first.what,
            tenure,
            forced,
            holders,
        })
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
    /// Reads a drain file's bytes; never fails (see the type's documentation).
    pub fn parse(bytes: &[u8]) -> Self {
        let mut record = match serde_json::from_slice::<DrainRecord>(bytes) {
            Ok(record) => record,
            Err(e) => {
                return Self {
                    record: None,
                    problem: Some(DrainProblem::NotARecord(Arc::new(e))),
                };
            }
        };
        record.reason = text::one_line(&record.reason, REASON_LIMIT).into_owned();
        record.tenure.by = text::one_line(&record.tenure.by, STAMP_LIMIT).into_owned();
        if let Some(forced) = &mut record.forced {
            *forced = text::one_line(forced, FORCED_LIMIT).into_owned();
        }
        for holder in &mut record.holders {
            holder.what = text::one_line(&holder.what, REASON_LIMIT).into_owned();
            holder.tenure.by = text::one_line(&holder.tenure.by, STAMP_LIMIT).into_owned();
        }
        let problem = record
            .tenure
            .until
            .as_ref()
            .and_then(Stamp::problem)
            .map(DrainProblem::BadUntil);
        Self {
            record: Some(record),
            problem,
        }
    }

    /// The record's times.
    fn tenure(&self) -> Option<&Tenure> {
        self.record.as_ref().map(|r| &r.tenure)
    }

    /// When the drain began, if the record says so in RFC 3339.
    pub fn since(&self) -> Option<SystemTime> {
        self.tenure()?.since.time()
    }

    /// When a `drain --for` lapses; `None` for a drain that lasts until `pmcheck undrain`.
    pub fn until(&self) -> Option<SystemTime> {
        self.tenure()?.until.as_ref()?.time()
    }

    /// Whether the drain lapsed by itself (`drain --for`).
    pub fn expired_at(&self, now: SystemTime) -> bool {
        self.tenure().is_some_and(|t| t.expired_at(now))
    }

    /// The reason first, then who and when in few characters (`kernel upgrade (by alice
    /// 17:32Z-18:32Z)`): what the verdict's reason carries, because HAProxy shows only about
    /// 100 characters of a check's info and the reason must survive.
    pub fn summary(&self, now: SystemTime) -> String {
        let Some(r) = &self.record else {
            return self.describe();
        };
        let today = rfc3339_date(now);
        let Tenure { by, since, until } = &r.tenure;
        let mut s = format!("{} (by {by} {}", r.reason, clock(since, &today));
        if let Some(until) = until {
            s.push('-');
            s.push_str(&clock(until, since.as_str().get(..10).unwrap_or(&today)));
        }
        s.push(')');
        // Only the mark of a `--force`: its note would push Puppet Server's state, which
        // follows, out of the 100 characters HAProxy shows (the record keeps the note, and
        // `describe` says it).
        if r.forced.is_some() {
            s.push_str("; forced");
        }
        if let Some(problem) = &self.problem {
            s.push_str("; ");
            s.push_str(&problem.to_string());
        }
        s
    }

    /// What [`Self::describe`] ends with: a `--force` that went past a load balancer's hold,
    /// and what is wrong with the record.
    fn tail(&self, r: &DrainRecord, s: &mut String) {
        if let Some(forced) = &r.forced {
            s.push_str("; forced: ");
            s.push_str(forced);
        }
        if let Some(problem) = &self.problem {
            s.push_str("; ");
            s.push_str(&problem.to_string());
        }
    }

    /// One phrase for people: the reason, who and since when.
    pub fn describe(&self) -> String {
        match &self.record {
            Some(r) => {
                let Tenure { by, since, until } = &r.tenure;
                let mut s = format!("{} (by {by} since {since}", r.reason);
                if let Some(until) = until {
                    s.push_str(" until ");
                    s.push_str(until.as_str());
                }
                s.push(')');
                self.tail(r, &mut s);
                s
            }
            None => format!(
                "drain file is {}; it still counts as drained",
                self.problem
                    .as_ref()
                    .map_or("unreadable".to_owned(), ToString::to_string)
            ),
        }
    }
}

/// `YYYY-MM-DD` of `t`, in UTC.
fn rfc3339_date(t: SystemTime) -> String {
    let mut day = humantime::format_rfc3339_seconds(t).to_string();
    day.truncate(10);
    day
}

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
    /// The file is not a JSON drain record (`touch drain`, a hand-edited file).
    #[error("not a valid drain record ({0})")]
    NotARecord(Arc<serde_json::Error>),
    /// `until` is not an RFC 3339 time.
    #[error("`until` is not an RFC 3339 time ({0}), so the drain does not expire")]
    BadUntil(humantime::TimestampError),
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
