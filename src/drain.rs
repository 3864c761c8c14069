//! The drain record: an operator's decision, kept on disk, that this node must leave the pool.
//!
//! It is a small JSON file, `STATE_DIR/drain`, written atomically so that a reader sees the old
//! record or the new one, never half of either. The daemon reads it at every poll (a failed
//! `open` and a `stat` of the directory while not drained), so a drain needs no signal and
//! survives restarts.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The record as it is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRecord {
    pub reason: String,
    pub by: String,
    /// RFC 3339, UTC.
    pub since: String,
    /// RFC 3339, UTC; absent for a drain that lasts until `pmcheck undrain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
}

impl DrainRecord {
    /// A record made now by whoever runs the command.
    pub fn new(reason: String, lasting: Option<Duration>, now: SystemTime) -> Self {
        Self {
            reason,
            by: operator(),
            since: humantime::format_rfc3339_seconds(now).to_string(),
            // Whole seconds are stored: round up, so that a drain never ends early.
            until: lasting
                .map(|d| humantime::format_rfc3339_seconds(ceil_second(now + d)).to_string()),
        }
    }
}

fn ceil_second(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) if d.subsec_nanos() > 0 => UNIX_EPOCH + Duration::from_secs(d.as_secs() + 1),
        _ => t,
    }
}

/// A drain file as found on disk. A file that is not a valid record still drains the node:
/// someone meant to drain it (`touch drain`), and guessing otherwise would put it back in the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drain {
    pub record: Option<DrainRecord>,
    /// Why the file is not a valid record, if it is not.
    pub problem: Option<String>,
    until: Option<SystemTime>,
}

impl Drain {
    fn parse(bytes: &[u8]) -> Self {
        let record = match serde_json::from_slice::<DrainRecord>(bytes) {
            Ok(record) => record,
            Err(e) => {
                return Self {
                    record: None,
                    problem: Some(format!("not a valid drain record ({e})")),
                    until: None,
                };
            }
        };
        let (until, problem) = match record.until.as_deref().map(humantime::parse_rfc3339_weak) {
            None => (None, None),
            Some(Ok(t)) => (Some(t), None),
            Some(Err(e)) => (
                None,
                Some(format!(
                    "`until` is not an RFC 3339 time ({e}), so the drain does not expire"
                )),
            ),
        };
        Self {
            record: Some(record),
            problem,
            until,
        }
    }

    /// Whether the drain lapsed by itself (`drain --for`).
    pub fn expired_at(&self, now: SystemTime) -> bool {
        self.until.is_some_and(|until| until <= now)
    }

    /// One phrase for people: the reason, who and since when.
    pub fn describe(&self) -> String {
        match &self.record {
            Some(r) => {
                let mut s = format!("{} (by {} since {}", r.reason, r.by, r.since);
                if let Some(until) = &r.until {
                    s.push_str(" until ");
                    s.push_str(until);
                }
                s.push(')');
                if let Some(problem) = &self.problem {
                    s.push_str("; ");
                    s.push_str(problem);
                }
                s
            }
            None => format!(
                "drain file is {}; it still counts as drained",
                self.problem.as_deref().unwrap_or("unreadable")
            ),
        }
    }
}

/// What the drain record says at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainState {
    NotDrained,
    Drained(Drain),
    /// A `--for` drain whose time is up: it no longer counts, but people should see it.
    Expired(Drain),
    /// The state cannot be read, so nobody can tell whether the node is drained: fail closed.
    Unknown(String),
}

#[derive(Debug, Error)]
pub enum DrainError {
    #[error(
        "cannot write the drain record in {dir}: {source}; run the command as root (sudo) or as \
         the user that owns {dir}, or choose another directory with --state-dir"
    )]
    Write { dir: PathBuf, source: io::Error },
    #[error("cannot remove the drain record {path}: {source}; run the command as root (sudo) or as the user that owns {dir}", dir = path.parent().unwrap_or(Path::new("/")).display())]
    Remove { path: PathBuf, source: io::Error },
}

/// The drain record of one state directory.
#[derive(Debug)]
pub struct DrainFile {
    dir: PathBuf,
    path: PathBuf,
}

impl DrainFile {
    pub fn new(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.to_owned(),
            path: state_dir.join("drain"),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The drain state now. Never fails: what cannot be read is [`DrainState::Unknown`].
    pub fn state(&self, now: SystemTime) -> DrainState {
        match fs::read(&self.path) {
            Ok(bytes) => {
                let drain = Drain::parse(&bytes);
                if drain.expired_at(now) {
                    DrainState::Expired(drain)
                } else {
                    DrainState::Drained(drain)
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => match self.check_dir() {
                Ok(()) => DrainState::NotDrained,
                Err(why) => DrainState::Unknown(why),
            },
            Err(e) => DrainState::Unknown(format!(
                "cannot read drain record {}: {e}",
                self.path.display()
            )),
        }
    }

    fn check_dir(&self) -> Result<(), String> {
        match fs::metadata(&self.dir) {
            Ok(meta) if meta.is_dir() => Ok(()),
            Ok(_) => Err(format!(
                "state directory {} is not a directory",
                self.dir.display()
            )),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(format!(
                "state directory {} does not exist: create it (the package does) or pass --state-dir",
                self.dir.display()
            )),
            Err(e) => Err(format!(
                "cannot read state directory {}: {e}",
                self.dir.display()
            )),
        }
    }

    /// Replaces the record atomically: temporary file, fsync, rename, fsync of the directory.
    /// On any failure the previous record, if any, is left as it was.
    pub fn write(&self, record: &DrainRecord) -> Result<(), DrainError> {
        let fail = |source| DrainError::Write {
            dir: self.dir.clone(),
            source,
        };
        if !self.dir.is_dir() {
            // Readable by the daemon's user whatever the operator's umask.
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&self.dir)
                .and_then(|()| fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o755)))
                .map_err(fail)?;
        }
        let mut json = serde_json::to_vec_pretty(record).map_err(|e| fail(e.into()))?;
        json.push(b'\n');
        let tmp = self.dir.join(format!(".drain.{}.tmp", std::process::id()));
        // The directory belongs to the daemon's user while root writes here: remove whatever
        // has the temporary name (a leftover, or a planted symlink) and create it exclusively,
        // which never follows a symlink.
        let _ = fs::remove_file(&tmp);
        let result = (|| {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&tmp)?;
            // Whatever the operator's umask: the daemon runs as another user and must read it.
            file.set_permissions(fs::Permissions::from_mode(0o644))?;
            file.write_all(&json)?;
            file.sync_all()?;
            fs::rename(&tmp, &self.path)?;
            File::open(&self.dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map_err(fail)
    }

    /// Removes the record. Returns what was there, `None` if nothing was.
    pub fn remove(&self) -> Result<Option<Drain>, DrainError> {
        let previous = self.current();
        match fs::remove_file(&self.path) {
            Ok(()) => {
                let _ = File::open(&self.dir).and_then(|d| d.sync_all());
                Ok(Some(previous.unwrap_or_else(|| Drain::parse(b""))))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(DrainError::Remove {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// The record on disk now, for the commands that report what they replaced.
    pub fn current(&self) -> Option<Drain> {
        fs::read(&self.path).ok().map(|bytes| Drain::parse(&bytes))
    }
}

/// Who drains: the person behind sudo, else the user running the command.
fn operator() -> String {
    ["SUDO_USER", "USER", "LOGNAME"]
        .iter()
        .filter_map(|var| std::env::var(var).ok())
        .find(|name| !name.is_empty())
        .unwrap_or_else(user_of_this_process)
}

fn user_of_this_process() -> String {
    let Ok(uid) = fs::metadata("/proc/self").map(|m| m.uid()) else {
        return "unknown".into();
    };
    let name = fs::read_to_string("/etc/passwd").ok().and_then(|passwd| {
        passwd.lines().find_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            (fields.nth(1)?.parse::<u32>().ok()? == uid).then(|| name.to_owned())
        })
    });
    name.unwrap_or_else(|| format!("uid {uid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> SystemTime {
        humantime::parse_rfc3339(rfc3339).expect("valid time")
    }

    #[test]
    fn no_file_in_an_existing_directory_is_not_drained() {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        assert_eq!(file.state(SystemTime::now()), DrainState::NotDrained);
    }

    #[test]
    fn a_missing_state_directory_fails_closed_and_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let DrainState::Unknown(why) = DrainFile::new(&missing).state(SystemTime::now()) else {
            panic!("a missing state directory must not count as undrained");
        };
        assert!(
            why.contains(&*missing.to_string_lossy()) && why.contains("does not exist"),
            "{why}"
        );
    }

    #[test]
    fn written_record_round_trips_and_expires() {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        let now = at("2026-11-22T10:00:00Z");
        let record = DrainRecord::new("upgrade".into(), Some(Duration::from_secs(1800)), now);
        assert_eq!(record.since, "2026-11-22T10:00:00Z");
        assert_eq!(record.until.as_deref(), Some("2026-11-22T10:30:00Z"));
        file.write(&record).unwrap();
        let DrainState::Drained(drain) = file.state(at("2026-11-22T10:29:59Z")) else {
            panic!("drained before `until`");
        };
        assert_eq!(drain.record.as_ref(), Some(&record));
        assert!(matches!(
            file.state(at("2026-11-22T10:30:00Z")),
            DrainState::Expired(_)
        ));
        let mode = fs::metadata(file.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "the daemon's user must be able to read it");
        let leftovers: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left behind");
    }

    #[test]
    fn an_empty_or_garbled_file_still_drains() {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        fs::write(file.path(), "").unwrap();
        let DrainState::Drained(drain) = file.state(SystemTime::now()) else {
            panic!("`touch drain` must drain");
        };
        assert!(drain.record.is_none());
        assert!(
            drain.describe().contains("still counts as drained"),
            "{}",
            drain.describe()
        );
        fs::write(
            file.path(),
            r#"{"reason":"r","by":"b","since":"2026-01-01T00:00:00Z","until":"soon"}"#,
        )
        .unwrap();
        let DrainState::Drained(drain) = file.state(SystemTime::now()) else {
            panic!("a bad `until` must not undrain");
        };
        assert_eq!(drain.record.as_ref().map(|r| r.reason.as_str()), Some("r"));
        assert!(drain.problem.as_deref().unwrap_or("").contains("until"));
    }

    #[test]
    fn an_unreadable_record_fails_closed() {
        if fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0) == 0 {
            // root reads through mode 000; use a directory in place of the file instead.
            let dir = tempfile::tempdir().unwrap();
            let file = DrainFile::new(dir.path());
            fs::create_dir(file.path()).unwrap();
            let DrainState::Unknown(why) = file.state(SystemTime::now()) else {
                panic!("an unreadable record must fail closed");
            };
            assert!(why.contains("cannot read drain record"), "{why}");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        fs::write(file.path(), "{}").unwrap();
        fs::set_permissions(file.path(), fs::Permissions::from_mode(0o000)).unwrap();
        assert!(matches!(
            file.state(SystemTime::now()),
            DrainState::Unknown(_)
        ));
    }

    #[test]
    fn undrain_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        file.write(&DrainRecord::new("x".into(), None, SystemTime::now()))
            .unwrap();
        assert!(file.remove().unwrap().is_some());
        assert!(file.remove().unwrap().is_none());
        assert_eq!(file.state(SystemTime::now()), DrainState::NotDrained);
    }
}
