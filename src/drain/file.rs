//! The drain record on disk: `STATE_DIR/drain`, read with every refusal of what is not a small
//! regular file, written atomically (a reader sees the old record or the new one, never half),
//! and changed only under the state directory's lock ([`crate::drain::lock`]).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nix::fcntl::Flock;
use thiserror::Error;

use crate::accounts::{group_name, user_name};
use crate::drain::lock::{self, LockError};
use crate::drain::log::{DrainLog, Event, LogError};
use crate::drain::record::{Drain, DrainRecord, DrainState, RECORD_LIMIT, Unreadable};
use crate::file_stamp::FileStamp;
use crate::safe_file::{Access, Examined, Links};

/// Why `drain` or `undrain` could not change the record.
#[derive(Debug, Error)]
pub enum DrainError {
    /// Writing the record failed; nothing was changed.
    #[error("cannot write the drain record in {dir}: {source}{hint}", hint = fix_hint(source, dir))]
    Write {
        /// The state directory.
        dir: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The state directory's lock cannot be opened; nothing was changed.
    #[error(
        "cannot change the drain record in {dir}: cannot open its lock {}: {source}{hint}",
        dir.join(lock::NAME).display(), hint = fix_hint(source, dir)
    )]
    Lock {
        /// The state directory.
        dir: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// Another process held the state directory's lock for the whole wait; nothing was
    /// changed.
    #[error("cannot change the drain record: {0}")]
    Locked(#[source] LockError),
    /// Removing the record failed.
    #[error("cannot remove the drain record {path}: {source}{hint}", hint = fix_hint(source, path.parent().unwrap_or(Path::new("/"))))]
    Remove {
        /// The drain record's path.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
}

/// How to get past a failed write or removal, by what the system said.
fn fix_hint(e: &io::Error, dir: &Path) -> String {
    match e.kind() {
        io::ErrorKind::PermissionDenied => format!(
            "; run the command as root (sudo){}; another --state-dir would not help: the \
             daemon reads only its own",
            owners(dir)
        ),
        io::ErrorKind::ReadOnlyFilesystem => format!(
            "; {} is on a read-only file system: remount it read-write, or give the daemon and \
             the commands another --state-dir",
            dir.display()
        ),
        io::ErrorKind::IsADirectory | io::ErrorKind::DirectoryNotEmpty => format!(
            "; {}/drain is a directory, not a record: remove it by hand (rmdir), then drain again",
            dir.display()
        ),
        _ => "; choose another directory with --state-dir".to_owned(),
    }
}

/// ", or as user U or a member of group G (they own DIR)": who else may write the directory,
/// from its owner, group and mode bits.
fn owners(dir: &Path) -> String {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(meta) = fs::metadata(dir) else {
        return String::new();
    };
    let user = user_name(meta.uid());
    // The group, when it may write the directory.
    let group = (meta.mode() & 0o020 != 0).then(|| group_name(meta.gid()));
    let group = group.map_or(String::new(), |g| format!(" or a member of group {g}"));
    format!(", or as user {user}{group} (they own {})", dir.display())
}

/// What one look at the drain file found: its stamp, for telling whether it changed since.
pub struct Look {
    /// The file's stamp; `None` when there is no file to stamp.
    pub stamp: Option<FileStamp>,
    /// What it says.
    pub state: DrainState,
}

/// The drain record of one state directory.
#[derive(Debug, Clone)]
pub struct DrainFile {
    dir: PathBuf,
    path: PathBuf,
}

impl DrainFile {
    /// The record `drain` in `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.to_owned(),
            path: state_dir.join("drain"),
        }
    }

    /// The record's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The drain state now. Never fails: what cannot be read is [`DrainState::Unknown`].
    pub fn state(&self, now: SystemTime) -> DrainState {
        self.read_state(now).state
    }

    /// Looks at the file; `None` when its stamp equals `known` (nothing changed, nothing read).
    /// Blocking: the daemon calls it off its workers, with a deadline ([`crate::drain::watch`]).
    pub fn look(&self, known: Option<FileStamp>, now: SystemTime) -> Option<Look> {
        let unchanged = known.is_some()
            && fs::symlink_metadata(&self.path)
                .is_ok_and(|meta| Some(FileStamp::from_metadata(&meta)) == known);
        (!unchanged).then(|| self.read_state(now))
    }

    fn read_state(&self, now: SystemTime) -> Look {
        let unknown = |stamp, why| Look {
            stamp,
            state: DrainState::Unknown(why),
        };
        let meta = match fs::symlink_metadata(&self.path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let state = (self.check_dir())
                    .map_or_else(DrainState::Unknown, |()| DrainState::NotDrained);
                return Look { stamp: None, state };
            }
            Err(e) => return unknown(None, self.read_error(e)),
        };
        if let Err(why) = self.refuse(&meta) {
            return unknown(Some(FileStamp::from_metadata(&meta)), why);
        }
        match self.read() {
            Ok((stamp, bytes)) => Look {
                stamp: Some(stamp),
                state: DrainState::of(Drain::parse(&bytes), now),
            },
            Err(why) => unknown(None, why),
        }
    }

    /// The reason for a read that did not come back within `after`.
    pub fn hung(&self, after: Duration) -> Unreadable {
        Unreadable::Hung {
            path: self.path.clone(),
            after,
        }
    }

    fn read_error(&self, e: io::Error) -> Unreadable {
        Unreadable::Read {
            path: self.path.clone(),
            source: Arc::new(e),
        }
    }

    /// Anything but a small regular file is refused before it is opened: opening a FIFO
    /// blocks, a device may be endless (`/dev/zero`), and a link may lead anywhere.
    fn refuse(&self, meta: &fs::Metadata) -> Result<(), Unreadable> {
        let path = self.path.clone();
        if meta.file_type().is_symlink() {
            return Err(Unreadable::Symlink { path });
        }
        match crate::safe_file::not_regular(meta) {
            Some(kind) => Err(Unreadable::NotRegular { path, kind }),
            None if meta.len() > RECORD_LIMIT => Err(Unreadable::TooLarge {
                path,
                len: meta.len(),
            }),
            None => Ok(()),
        }
    }

    /// Examines the path without following links or opening it, opens that file only if it is
    /// a small regular one, and reads at most the limit.
    fn read(&self) -> Result<(FileStamp, Vec<u8>), Unreadable> {
        let examined =
            Examined::at(&self.path, Links::Refuse).map_err(|e| match e.raw_os_error() {
                Some(code) if code == nix::errno::Errno::ELOOP as i32 => Unreadable::Symlink {
                    path: self.path.clone(),
                },
                _ => self.read_error(e),
            })?;
        self.refuse(&examined.meta)?;
        let mut file = (examined.open(&self.path, Access::Read)).map_err(|e| self.read_error(e))?;
        let meta = file.metadata().map_err(|e| self.read_error(e))?;
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        (&mut file)
            .take(RECORD_LIMIT + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| self.read_error(e))?;
        if bytes.len() as u64 > RECORD_LIMIT {
            return Err(Unreadable::TooLarge {
                path: self.path.clone(),
                len: bytes.len() as u64,
            });
        }
        Ok((FileStamp::from_metadata(&meta), bytes))
    }

    fn check_dir(&self) -> Result<(), Unreadable> {
        let dir = self.dir.clone();
        match fs::metadata(&self.dir) {
            Ok(meta) if meta.is_dir() => Ok(()),
            Ok(_) => Err(Unreadable::StateDirNotDir { dir }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Unreadable::NoStateDir { dir }),
            Err(e) => Err(Unreadable::StateDir {
                dir,
                source: Arc::new(e),
            }),
        }
    }

    /// Creates the state directory (mode 0755, readable by the daemon's user whatever the umask)
    /// when it is missing.
    pub fn create_dir(&self) -> io::Result<()> {
        if self.dir.is_dir() {
            return Ok(());
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&self.dir)?;
        fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o755))
    }

    /// Replaces the record atomically: temporary file, fsync, rename, fsync of the directory.
    /// On any failure the previous record, if any, is left as it was.
    pub fn write(&self, record: &DrainRecord) -> Result<(), DrainError> {
        let fail = |e| self.write_error(e);
        self.create_dir().map_err(fail)?;
        self.sweep_leftovers();
        let json = serde_json::to_string_pretty(record).map_err(|e| fail(e.into()))? + "\n";
        self.replace(&self.path, json.as_bytes()).map_err(fail)
    }

    /// Replaces `path` in the state directory with `bytes`, mode 0644, atomically: temporary
    /// file, fsync, rename, fsync of the directory; on failure `path` is left as it was.
    pub(crate) fn replace(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
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
            file.write_all(bytes)?;
            file.sync_all()?;
            fs::rename(&tmp, path)?;
            open_dir(&self.dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Removes the record. Returns what was there, `None` if nothing was.
    pub fn remove(&self) -> Result<Option<Drain>, DrainError> {
        self.sweep_leftovers();
        let previous = self.current();
        // An empty directory someone made there goes too; a full one is theirs to empty.
        let removed = fs::remove_file(&self.path).or_else(|e| match e.kind() {
            io::ErrorKind::IsADirectory => fs::remove_dir(&self.path),
            _ => Err(e),
        });
        match removed {
            Ok(()) => {
                let _ = open_dir(&self.dir).and_then(|d| d.sync_all());
                Ok(Some(previous.unwrap_or_else(|| Drain::parse(b""))))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(DrainError::Remove {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// Whether anything (a record, a link, a FIFO...) stands at the record's path.
    pub fn occupied(&self) -> bool {
        fs::symlink_metadata(&self.path).is_ok()
    }

    /// The record's path with the state directory's symbolic links resolved, as a daemon and a
    /// command that name it differently can compare it; as given when it cannot be resolved.
    pub fn resolved(&self) -> PathBuf {
        fs::canonicalize(&self.dir).map_or_else(|_| self.path.clone(), |dir| dir.join("drain"))
    }

    /// The record on disk now, for the commands that report what they replaced.
    pub fn current(&self) -> Option<Drain> {
        match self.state(SystemTime::now()) {
            DrainState::Drained(d) | DrainState::Expired(d) => Some(d),
            DrainState::NotDrained | DrainState::Unknown(_) => None,
        }
    }

    /// Removes the temporary files of `drain` commands that died mid-write (`kill -9`, power
    /// loss): `.drain.PID.tmp` whose process is gone.
    pub fn sweep_leftovers(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix(".drain."))
                .and_then(|n| n.strip_suffix(".tmp"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    /// Takes the state directory's lock, waiting at most [`lock::WAIT`] on this thread: for
    /// the daemon's blocking pool. Commands use [`DrainFile::locked`].
    pub fn lock(&self) -> Result<Locked<'_>, DrainError> {
        self.create_dir().map_err(|e| self.write_error(e))?;
        self.holding(lock::acquire(self.dir(), lock::WAIT))
    }

    /// [`DrainFile::lock`] on the runtime's timer: a command's Ctrl-C drops the wait at
    /// once, with nothing changed.
    pub async fn locked(&self) -> Result<Locked<'_>, DrainError> {
        self.create_dir().map_err(|e| self.write_error(e))?;
        self.holding(lock::acquire_async(self.dir(), lock::WAIT).await)
    }

    fn holding(&self, lock: Result<Flock<File>, LockError>) -> Result<Locked<'_>, DrainError> {
        let lock = lock.map_err(|e| match e {
            LockError::Open(source) => DrainError::Lock {
                dir: self.dir().to_path_buf(),
                source,
            },
            held @ LockError::Held { .. } => DrainError::Locked(held),
        })?;
        self.sweep_leftovers();
        Ok(Locked {
            file: self,
            _lock: lock,
        })
    }

    fn write_error(&self, source: io::Error) -> DrainError {
        DrainError::Write {
            dir: self.dir().to_path_buf(),
            source,
        }
    }
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

/// The state directory's lock, held: the record and the event log change only through it,
/// and it is released when this is dropped.
pub struct Locked<'a> {
    file: &'a DrainFile,
    _lock: Flock<File>,
}

impl<'a> Locked<'a> {
    /// The drain record this lock guards.
    pub fn file(&self) -> &'a DrainFile {
        self.file
    }

    /// Reads the record, decides and applies `change`, so that no other pmcheck command
    /// changes it in between, and appends the events `change` returns to the event log in the
    /// same critical section once the change is made. A failed append does not undo the
    /// change (the record is what keeps agents away): it comes back for the caller to say.
    pub fn update_logged<T>(
        self,
        change: impl FnOnce(Option<Drain>) -> (Change, Vec<Event>, T),
    ) -> Result<(T, Vec<LogError>), DrainError> {
        let file = self.file;
        let (change, events, result) = change(file.current());
        match change {
            Change::Keep => {}
            Change::Write(record) => file.write(&record)?,
            Change::Remove => {
                file.remove()?;
            }
        }
        Ok((result, self.log(&events)))
    }

    /// Appends `events` to the event log: for what is logged without changing the record (a
    /// refused drain, an expiry the daemon saw).
    pub fn log(&self, events: &[Event]) -> Vec<LogError> {
        let log = DrainLog::new(&self.file.dir);
        events.iter().filter_map(|e| log.append(e).err()).collect()
    }
}

/// Opens the state directory to sync it: `O_DIRECTORY` refuses anything else before it is
/// opened (a device put in its place does not have its `open()` run).
fn open_dir(dir: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC).bits())
        .open(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::holders::{Holder, Kind};
    use crate::drain::record::{DrainProblem, REASON_LIMIT, parse_reason};
    use crate::drain::tenure::{Stamp, Tenure};
    use crate::text;
    use proptest::prelude::*;
    use std::os::unix::fs::MetadataExt;

    fn at(rfc3339: &str) -> SystemTime {
        humantime::parse_rfc3339(rfc3339).expect("valid time")
    }

    fn unknown(state: DrainState) -> String {
        match state {
            DrainState::Unknown(why) => why.to_string(),
            other => panic!("expected an unknown state (fail closed), got {other:?}"),
        }
    }

    #[test]
    fn no_file_in_an_existing_directory_is_not_drained() {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        assert!(matches!(
            file.state(SystemTime::now()),
            DrainState::NotDrained
        ));
    }

    #[test]
    fn a_missing_state_directory_fails_closed_and_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let why = unknown(DrainFile::new(&missing).state(SystemTime::now()));
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
        let record = DrainRecord::held_by(vec![Holder::drain(
            "upgrade".into(),
            Some(Duration::from_secs(1800)),
            now,
        )])
        .unwrap();
        assert_eq!(record.since().as_str(), "2026-11-22T10:00:00Z");
        let until = record.until().map(Stamp::as_str);
        assert_eq!(until, Some("2026-11-22T10:30:00.000Z"));
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
        assert_eq!(drain.record.as_ref().map(|r| r.reason()), Some("r"));
        assert!(matches!(drain.problem, Some(DrainProblem::BadUntil(_))));
    }

    #[test]
    fn an_unreadable_record_fails_closed() {
        if fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0) == 0 {
            // root reads through mode 000: see the FIFO and directory tests instead.
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        fs::write(file.path(), "{}").unwrap();
        fs::set_permissions(file.path(), fs::Permissions::from_mode(0o000)).unwrap();
        let why = unknown(file.state(SystemTime::now()));
        assert!(why.contains("cannot read drain record"), "{why}");
    }

    #[test]
    fn what_is_not_a_small_regular_file_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        fs::create_dir(file.path()).unwrap();
        let why = unknown(file.state(SystemTime::now()));
        assert!(why.contains("is a directory, not a regular file"), "{why}");
        fs::remove_dir(file.path()).unwrap();

        nix::unistd::mkfifo(file.path(), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let opens = crate::safe_file::Opens::of(file.path());
        let why = unknown(file.state(SystemTime::now()));
        assert!(why.contains("FIFO"), "a FIFO is named: {why}");
        assert_eq!(opens.count(), 0, "the FIFO was opened");
        fs::remove_file(file.path()).unwrap();

        std::os::unix::fs::symlink("/dev/zero", file.path()).unwrap();
        let why = unknown(file.state(SystemTime::now()));
        assert!(why.contains("symbolic link"), "{why}");
        fs::remove_file(file.path()).unwrap();

        let _socket = std::os::unix::net::UnixListener::bind(file.path()).unwrap();
        let why = unknown(file.state(SystemTime::now()));
        assert!(why.contains("a socket"), "{why}");
        fs::remove_file(file.path()).unwrap();

        fs::write(file.path(), vec![b' '; RECORD_LIMIT as usize + 1]).unwrap();
        let why = unknown(file.state(SystemTime::now()));
        assert!(why.contains("more than the 8192"), "{why}");
    }

    #[test]
    fn a_look_reads_only_what_changed_even_when_size_and_mtime_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        let record = |reason: &str| {
            format!(r#"{{"reason":"{reason}","by":"b","since":"2026-01-01T00:00:00Z"}}"#)
        };
        fs::write(file.path(), record("first")).unwrap();
        let look = file
            .look(None, SystemTime::now())
            .expect("a first look reads");
        assert!(
            file.look(look.stamp, SystemTime::now()).is_none(),
            "unchanged: not read"
        );
        let mtime = fs::metadata(file.path()).unwrap().modified().unwrap();
        let mut f = OpenOptions::new().write(true).open(file.path()).unwrap();
        f.write_all(record("again").as_bytes()).unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        let look = file
            .look(look.stamp, SystemTime::now())
            .expect("an in-place rewrite with the old size and mtime is a change");
        let DrainState::Drained(drain) = look.state else {
            panic!("drained");
        };
        assert_eq!(drain.record.unwrap().reason(), "again");
    }

    #[test]
    fn a_hand_written_record_is_shown_on_one_bounded_line() {
        let reason = format!("line one\r\nline two {}", "x".repeat(2000));
        let bytes = serde_json::to_vec(&serde_json::json!({
            "reason": reason,
            "by": "mallory\u{1b}[2J",
            "since": "2026-01-01T00:00:00Z",
        }))
        .unwrap();
        let drain = Drain::parse(&bytes);
        let record = drain.record.unwrap();
        assert!(record.reason().starts_with("line one line two xxx"));
        assert!(record.reason().chars().count() <= REASON_LIMIT + 3);
        assert_eq!(record.by(), "mallory\\u{1b}[2J");
    }

    #[test]
    fn reasons_are_checked_with_a_way_out() {
        assert_eq!(
            parse_reason("kernel 6.1 upgrade").unwrap(),
            "kernel 6.1 upgrade"
        );
        let long = parse_reason(&"x".repeat(REASON_LIMIT + 1)).unwrap_err();
        assert!(
            long.contains("257 characters") && long.contains("256"),
            "{long}"
        );
        assert!(parse_reason("a\nb").unwrap_err().contains("one line"));
        assert!(parse_reason("  ").unwrap_err().contains("empty"));
    }

    #[test]
    fn leftovers_of_dead_drain_commands_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let leftover = dir.path().join(format!(".drain.{dead}.tmp"));
        let alive = dir.path().join(format!(
            ".drain.{}.tmp",
            std::os::unix::process::parent_id()
        ));
        fs::write(&leftover, "{").unwrap();
        fs::write(&alive, "{").unwrap();
        file.write(
            &DrainRecord::held_by(vec![Holder::drain("x".into(), None, SystemTime::now())])
                .unwrap(),
        )
        .unwrap();
        assert!(!leftover.exists(), "a dead command's file is removed");
        assert!(alive.exists(), "a live command's file is left alone");
    }

    #[test]
    fn writing_over_a_directory_says_so_and_not_run_as_root() {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        fs::create_dir(file.path()).unwrap();
        fs::write(file.path().join("x"), "").unwrap();
        let e = file
            .write(
                &DrainRecord::held_by(vec![Holder::drain("x".into(), None, SystemTime::now())])
                    .unwrap(),
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a directory") && !e.contains("root"), "{e}");
    }

    #[test]
    fn undrain_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        file.write(
            &DrainRecord::held_by(vec![Holder::drain("x".into(), None, SystemTime::now())])
                .unwrap(),
        )
        .unwrap();
        assert!(file.remove().unwrap().is_some());
        assert!(file.remove().unwrap().is_none());
        assert!(matches!(
            file.state(SystemTime::now()),
            DrainState::NotDrained
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Any bytes drain the node (someone put them there), and what is shown is one line.
        #[test]
        fn any_file_content_drains_and_shows_one_bounded_line(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let drain = Drain::parse(&bytes);
            let shown = drain.describe();
            prop_assert!(!shown.contains('\n') && !shown.contains('\r'), "{shown:?}");
            prop_assert!(shown.len() < 2000);
        }

        #[test]
        fn any_record_round_trips_its_one_line_fields(reason in "[^\\p{Cc}]{1,256}", by in "[a-z]{1,32}") {
            let tenure = Tenure { by, since: Stamp::read("2026-01-01T00:00:00Z"), until: None };
            let holder = Holder { tenure: tenure.clone(), ..Holder::drain(reason.clone(), None, SystemTime::now()) };
            let record = DrainRecord::held_by(vec![holder]).unwrap();
            let bytes = serde_json::to_vec(&record).unwrap();
            let parsed = Drain::parse(&bytes).record.unwrap();
            prop_assert_eq!(parsed.first().tenure.clone(), tenure);
            prop_assert_eq!(parsed.reason(), text::one_line(&reason, REASON_LIMIT).into_owned());
        }
    }

    #[test]
    fn a_record_without_holders_is_one_operators_drain() {
        let record = DrainRecord::held_by(vec![Holder::drain(
            "kernel".into(),
            None,
            SystemTime::now(),
        )])
        .unwrap();
        let holders = record.holders();
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
        let both = DrainRecord::held_by(vec![cycle.clone(), drain.clone()]).unwrap();
        assert_eq!(both.reason(), "kernel");
        assert_eq!(both.until(), None, "a cycle's drain never expires under it");
        assert_eq!(both.holders()[1], cycle);
        let alone = DrainRecord::held_by(vec![drain.clone()]).unwrap();
        assert_eq!(alone.until(), drain.tenure.until.as_ref());
        assert_eq!(DrainRecord::held_by(Vec::new()), None);
        assert!(cycle.is_me() && cycle.running());
        assert!(cycle.describe().starts_with(&format!(
            "cycle pid {} (pmcheck cycle: true, by ",
            std::process::id()
        )));
        assert!(drain.tenure.expired_at(now + Duration::from_secs(61)));
    }
}
