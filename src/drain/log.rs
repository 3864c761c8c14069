//! The drain event log, `STATE_DIR/drain-events.log`: who drained what, when. One JSON object
//! per line, appended by whoever changes the drain record, in the same critical section (the
//! flock of the state directory), so the log and the record never disagree on order.
//!
//! Each event is one `write(2)` of a whole line of at most [`LINE_LIMIT`] bytes with `O_APPEND`;
//! a short write (a full disk) is cut back off, so readers only ever see whole lines. At
//! [`ROTATE_AT`] bytes the log becomes `drain-events.log.1` (one old file kept). The file is
//! mode 0660 with the state directory's group (`pmcheck`): the root-run commands and the
//! daemon both append, nobody else reads.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::drain::holders::{Holder, Kind};
use crate::drain::tenure::Stamp;
use crate::safe_file::{Access, Examined, Links, not_regular, open_shared};

/// The log's name in the state directory.
pub const LOG_NAME: &str = "drain-events.log";
/// The one old log kept after a rotation.
pub const OLD_NAME: &str = "drain-events.log.1";
/// The longest line written: a reason is at most 256 characters, so an event fits with room.
pub const LINE_LIMIT: usize = 4096;
/// The size at which the log is rotated: two files of 1 MiB hold thousands of events.
pub const ROTATE_AT: u64 = 1 << 20;

/// What happened to the drain record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// `pmcheck drain`.
    Drain,
    /// `pmcheck undrain`.
    Undrain,
    /// A `drain --for` lapsed (written by the daemon when it sees it).
    Expire,
    /// `pmcheck cycle` took hold of the node.
    CycleDrain,
    /// `pmcheck cycle` let go of the node.
    CycleUndrain,
    /// `pmcheck cycle` stopped with its command failed: the node stays drained.
    CycleStopped,
    /// A drain refused by the last-server guard.
    Refused,
    /// Puppet Server's unit began to stop (`pmcheck on-stop`): the node is held drained.
    StopDrain,
    /// Puppet Server's unit started again (`pmcheck on-start`): the stop's hold is let go.
    StopUndrain,
}

impl Action {
    /// Every action, in declaration order (an action's place is its number): the metric's
    /// fixed label values.
    pub const ALL: [Action; 9] = [
        Action::Drain,
        Action::Undrain,
        Action::Expire,
        Action::CycleDrain,
        Action::CycleUndrain,
        Action::CycleStopped,
        Action::Refused,
        Action::StopDrain,
        Action::StopUndrain,
    ];

    /// The action's name, as in the log, the metric and the journal.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Drain => "drain",
            Action::Undrain => "undrain",
            Action::Expire => "expire",
            Action::CycleDrain => "cycle_drain",
            Action::CycleUndrain => "cycle_undrain",
            Action::CycleStopped => "cycle_stopped",
            Action::Refused => "refused",
            Action::StopDrain => "stop_drain",
            Action::StopUndrain => "stop_undrain",
        }
    }
}

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// When it happened (RFC 3339, UTC).
    pub at: Stamp,
    /// What happened.
    pub action: Action,
    /// Who did it (`alice via sudo`; `pmcheck` for an expiry the daemon saw).
    pub who: String,
    /// The drain's reason, the cycle's command, or why a drain was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Since when the holder held the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Stamp>,
    /// The end of a `drain --for`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Stamp>,
    /// The holder concerned (`drain`, `cycle pid 123`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

impl Event {
    /// `action` of `holder`, now, by whoever runs this process.
    pub fn of(action: Action, holder: &Holder, now: SystemTime) -> Self {
        Self {
            reason: Some(holder.what.clone()),
            since: Some(holder.tenure.since.clone()),
            until: holder.tenure.until.clone(),
            holder: Some(match (holder.kind, &holder.process) {
                (Kind::Drain, _) => "drain".to_owned(),
                (Kind::Stop, _) => "stop".to_owned(),
                (_, Some(p)) => format!("cycle pid {}", p.pid),
                (_, None) => "cycle".to_owned(),
            }),
            ..Self::bare(action, now)
        }
    }

    /// `action` when the record names no holder (written by hand).
    pub fn bare(action: Action, now: SystemTime) -> Self {
        Self {
            at: Stamp::seconds(now),
            action,
            who: crate::drain::holders::operator(),
            reason: None,
            since: None,
            until: None,
            holder: None,
        }
    }

    /// A drain refused by the last-server guard: `why` says which load balancer refused it.
    pub fn refused(reason: &str, why: &str, now: SystemTime) -> Self {
        Self {
            reason: Some(format!(
                "{}; {}",
                crate::text::one_line(reason, 256),
                crate::text::one_line(why, 1024)
            )),
            ..Self::bare(Action::Refused, now)
        }
    }

    /// The event on one line for a person.
    pub fn describe(&self) -> String {
        let mut line = format!("{} {} by {}", self.at, self.action.as_str(), self.who);
        if let Some(holder) = &self.holder {
            line.push_str(&format!(" ({holder})"));
        }
        if let Some(reason) = &self.reason {
            line.push_str(&format!(": {reason}"));
        }
        if let Some(since) = &self.since {
            line.push_str(&format!(" since {since}"));
        }
        if let Some(until) = &self.until {
            line.push_str(&format!(" until {until}"));
        }
        crate::text::one_line(&line, LINE_LIMIT).into_owned()
    }

    /// The event as one line of JSON with its newline, at most [`LINE_LIMIT`] bytes: a reason
    /// too long for it (only a hand-made one can be) is cut.
    fn line(&self) -> Vec<u8> {
        let mut event = self.clone();
        loop {
            let mut json = serde_json::to_vec(&event).unwrap_or_default();
            json.push(b'\n');
            let over = json.len().saturating_sub(LINE_LIMIT);
            let Some(reason) = event.reason.as_mut().filter(|_| over > 0) else {
                return json;
            };
            let keep = reason.len().saturating_sub(over + 8);
            let cut = (0..=keep).rev().find(|&i| reason.is_char_boundary(i));
            reason.truncate(cut.unwrap_or(0));
            reason.push('…');
        }
    }
}

/// What the caller says about the event log: an event lost, or kept in a log that cannot rotate.
#[derive(Debug, Error)]
pub enum LogError {
    /// The event could not be appended: it is lost (the drain record was still changed).
    #[error("the drain event log {path} did not record this {action} event (it is lost; the drain record itself was changed): {source}{hint}", action = action.as_str(), hint = hint(source, path))]
    Lost {
        /// The log.
        path: PathBuf,
        /// The event's action.
        action: Action,
        /// What the system said.
        source: io::Error,
    },
    /// The event was appended, but the log is past its size and was not rotated: losing no
    /// event matters more than the size.
    #[error("the drain event log is past {} KiB and cannot rotate: {} is {what} where the old log belongs; remove it or move it aside, and the next event rotates the log (this {action} event was recorded)", ROTATE_AT / 1024, old.display(), action = action.as_str())]
    NotRotated {
        /// [`OLD_NAME`] in the state directory.
        old: PathBuf,
        /// What stands there (`a directory`).
        what: &'static str,
        /// The event's action.
        action: Action,
    },
}

fn hint(e: &io::Error, path: &Path) -> String {
    let dir = path.parent().unwrap_or(Path::new("/")).display();
    match e.raw_os_error() {
        Some(code) if code == nix::errno::Errno::ENOSPC as i32 => {
            format!("; the file system of {dir} is full: free space there")
        }
        Some(code) if code == nix::errno::Errno::EFBIG as i32 => {
            format!("; a file size limit stops the write: raise it (ulimit -f) or free {dir}")
        }
        _ if e.kind() == io::ErrorKind::PermissionDenied => format!(
            "; run the command as root, or give {} group pmcheck and mode 0660",
            path.display()
        ),
        _ => String::new(),
    }
}

/// The event log of one state directory.
#[derive(Debug, Clone)]
pub struct DrainLog {
    dir: PathBuf,
    path: PathBuf,
}

impl DrainLog {
    /// Where the rotated log is kept ([`OLD_NAME`]).
    pub(crate) fn old_path(&self) -> PathBuf {
        self.dir.join(OLD_NAME)
    }

    /// The log in `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.to_owned(),
            path: state_dir.join(LOG_NAME),
        }
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `event`. The caller holds the state directory's lock (rotation renames).
    /// [`LogError::NotRotated`] comes back with the event appended all the same.
    pub fn append(&self, event: &Event) -> Result<(), LogError> {
        let fail = |source| LogError::Lost {
            path: self.path.clone(),
            action: event.action,
            source,
        };
        let line = event.line();
        let unrotated = self.rotate(line.len() as u64).map_err(fail)?;
        // Mode 0660 with the state directory's group: whoever creates it, the other side
        // can still append.
        let refused = |_| io::Error::other("not a regular file: remove it");
        let opened = open_shared(&self.dir, &self.path, Access::Append, refused);
        let mut file = opened.map_err(fail)?;
        let start = file.metadata().map_err(fail)?.len();
        write_whole(&mut file, start, &line).map_err(fail)?;
        match unrotated {
            Some(what) => Err(LogError::NotRotated {
                old: self.dir.join(OLD_NAME),
                what,
                action: event.action,
            }),
            None => Ok(()),
        }
    }

    /// Renames the log to [`OLD_NAME`] when `more` bytes would take it past [`ROTATE_AT`],
    /// unless something other than a regular file stands there (a rename would fail, or replace
    /// a link): then what it is.
    fn rotate(&self, more: u64) -> io::Result<Option<&'static str>> {
        match fs::symlink_metadata(&self.path) {
            Ok(meta) if meta.len() + more > ROTATE_AT => {
                let old = self.dir.join(OLD_NAME);
                match fs::symlink_metadata(&old) {
                    Ok(meta) if !meta.is_file() => return Ok(not_regular(&meta)),
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
                fs::rename(&self.path, old).map(|()| None)
            }
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(None),
        }
    }

    /// The last `n` events, oldest first, from the log and the old log after it. Reads only the
    /// tail (at most `n` lines' worth); lines that are not events are left out.
    pub fn tail(&self, n: usize) -> io::Result<Vec<Event>> {
        let newer = tail_of(&self.path, n)?;
        let mut events = tail_of(&self.old_path(), n - newer.len())?;
        events.extend(newer);
        Ok(events)
    }
}

/// The last `n` events of one file; none when it does not exist.
fn tail_of(path: &Path, n: usize) -> io::Result<Vec<Event>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut file = match Examined::at(path, Links::Refuse).and_then(|e| e.open(path, Access::Read))
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let want = (n as u64)
        .saturating_mul(LINE_LIMIT as u64)
        .min(ROTATE_AT * 2);
    let start = len.saturating_sub(want);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.take(want).read_to_end(&mut bytes)?;
    // Unless reading from the start, the first line may be cut: drop it.
    let whole = match bytes.iter().position(|&b| b == b'\n') {
        _ if start == 0 => &bytes[..],
        Some(i) => &bytes[i + 1..],
        None => &[],
    };
    let events = parse(whole).0;
    let skip = events.len().saturating_sub(n);
    Ok(events.into_iter().skip(skip).collect())
}

/// The events in `bytes` (whole lines only), and how many lines were not events.
pub fn parse(bytes: &[u8]) -> (Vec<Event>, usize) {
    let mut bad = 0;
    let events = bytes
        .split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .filter_map(|line| {
            let event = serde_json::from_slice(line).ok();
            bad += usize::from(event.is_none());
            event
        })
        .collect();
    (events, bad)
}

/// The end of a file an event is appended to: what went of a line that failed is taken back.
trait Tail: Write {
    fn take_back(&mut self, to: u64) -> io::Result<()>;
}

impl Tail for File {
    fn take_back(&mut self, to: u64) -> io::Result<()> {
        self.set_len(to)
    }
}

/// Writes `line` whole after `start`, however many writes it takes (a write may take part of
/// it and the next the rest), or fails, taking back what went: a full disk or a size limit
/// never leaves half a line, and the next event starts a line of its own.
fn write_whole(out: &mut impl Tail, start: u64, line: &[u8]) -> io::Result<()> {
    out.write_all(line).inspect_err(|_| {
        let _ = out.take_back(start);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::audit::Follower;
    use std::os::unix::fs::MetadataExt as _;
    use std::time::Duration;

    #[test]
    fn an_action_is_its_place_in_all() {
        for (i, action) in Action::ALL.into_iter().enumerate() {
            assert_eq!(action as usize, i, "{action:?}");
        }
    }

    /// A file that takes at most `per_write` bytes a write, and fails once it holds `room`.
    struct Short {
        data: Vec<u8>,
        per_write: usize,
        room: usize,
    }

    impl Write for Short {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = buf
                .len()
                .min(self.per_write)
                .min(self.room - self.data.len());
            if n == 0 && !buf.is_empty() {
                return Err(io::Error::from_raw_os_error(
                    nix::errno::Errno::ENOSPC as i32,
                ));
            }
            self.data.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Tail for Short {
        fn take_back(&mut self, to: u64) -> io::Result<()> {
            self.data.truncate(usize::try_from(to).unwrap());
            Ok(())
        }
    }

    /// c8a278e reported ENOSPC and took the line back when a second write completed it.
    #[test]
    fn a_line_written_in_parts_is_kept_and_one_that_cannot_be_is_taken_back() {
        let line = b"{\"action\":\"drain\"}\n";
        let mut parts = Short {
            data: b"old\n".to_vec(),
            per_write: 3,
            room: 100,
        };
        write_whole(&mut parts, 4, line).unwrap();
        assert_eq!(parts.data, [b"old\n".as_slice(), line].concat());
        let mut full = Short {
            data: b"old\n".to_vec(),
            per_write: 3,
            room: 10,
        };
        let error = write_whole(&mut full, 4, line).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(nix::errno::Errno::ENOSPC as i32));
        assert_eq!(full.data, b"old\n", "no half line left behind");
    }

    fn event(reason: &str) -> Event {
        let holder = Holder::drain(
            reason.into(),
            Some(Duration::from_secs(60)),
            SystemTime::now(),
        );
        Event::of(Action::Drain, &holder, SystemTime::now())
    }

    #[test]
    fn events_round_trip_and_the_tail_reads_the_last_n() {
        let dir = tempfile::tempdir().unwrap();
        let log = DrainLog::new(dir.path());
        assert!(log.tail(5).unwrap().is_empty(), "no log: no events");
        for i in 0..10 {
            log.append(&event(&format!("r{i}"))).unwrap();
        }
        let tail = log.tail(3).unwrap();
        let reasons: Vec<_> = tail.iter().filter_map(|e| e.reason.as_deref()).collect();
        assert_eq!(reasons, ["r7", "r8", "r9"]);
        assert_eq!(tail[0].holder.as_deref(), Some("drain"));
        assert!(tail[0].until.is_some());
        let mode = fs::metadata(log.path()).unwrap().mode() & 0o777;
        assert_eq!(mode, crate::safe_file::SHARED_MODE);
    }

    #[test]
    fn a_line_never_passes_the_limit() {
        let mut e = event("x");
        e.reason = Some("é".repeat(LINE_LIMIT));
        let line = e.line();
        assert!(line.len() <= LINE_LIMIT, "{}", line.len());
        assert!(serde_json::from_slice::<Event>(&line).is_ok());
    }

    #[test]
    fn the_log_rotates_at_its_size_and_the_tail_spans_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let log = DrainLog::new(dir.path());
        let one = event("x").line().len() as u64;
        let fit = ROTATE_AT / one;
        fs::write(log.path(), vec![b'\n'; (ROTATE_AT - fit * one) as usize]).unwrap();
        for _ in 0..fit {
            log.append(&event("x")).unwrap();
        }
        assert!(!dir.path().join(OLD_NAME).exists(), "not past the size yet");
        log.append(&event("after")).unwrap();
        assert!(fs::metadata(dir.path().join(OLD_NAME)).unwrap().len() <= ROTATE_AT);
        assert_eq!(fs::metadata(log.path()).unwrap().len(), one + 4);
        let tail = log.tail(2).unwrap();
        assert_eq!(tail[0].reason.as_deref(), Some("x"));
        assert_eq!(tail[1].reason.as_deref(), Some("after"));
    }

    /// The audit: a directory at drain-events.log.1 failed every rotation, and every event
    /// after was lost. Anything but a regular file there (a link too) stops the rotation, not
    /// the events: each is appended past the limit, and the caller is told what to fix.
    #[test]
    fn an_odd_file_at_the_old_name_stops_the_rotation_not_the_events() {
        for (odd, what) in [("dir", "a directory"), ("link", "a symbolic link")] {
            let dir = tempfile::tempdir().unwrap();
            let log = DrainLog::new(dir.path());
            let old = dir.path().join(OLD_NAME);
            match odd {
                "dir" => fs::create_dir(&old).unwrap(),
                _ => std::os::unix::fs::symlink("elsewhere", &old).unwrap(),
            }
            fs::write(log.path(), vec![b'\n'; ROTATE_AT as usize]).unwrap();
            for reason in ["after", "again"] {
                let e = log.append(&event(reason)).unwrap_err().to_string();
                assert!(
                    e.contains(&format!(
                        "{} is {what} where the old log belongs",
                        old.display()
                    )) && e.contains("remove it or move it aside")
                        && e.contains("was recorded"),
                    "{odd}: {e}"
                );
            }
            let tail = log.tail(2).unwrap();
            let reasons: Vec<_> = tail.iter().filter_map(|e| e.reason.as_deref()).collect();
            assert_eq!(reasons, ["after", "again"], "{odd}");
            assert!(fs::metadata(log.path()).unwrap().len() > ROTATE_AT, "{odd}");
            assert!(!fs::symlink_metadata(&old).unwrap().is_file(), "{odd}");
        }
    }

    #[test]
    fn the_follower_sees_new_events_once_across_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let log = DrainLog::new(dir.path());
        log.append(&event("before")).unwrap();
        let mut follower = Follower::new(log.clone());
        assert!(follower.read().unwrap().events.is_empty(), "old news");
        log.append(&event("a")).unwrap();
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(log.path())
            .unwrap();
        f.write_all(b"not json\n{\"half").unwrap();
        let news = follower.read().unwrap();
        assert_eq!(news.events.len(), 1);
        assert_eq!(news.unreadable, 1);
        f.write_all(b"\"\n").unwrap();
        fs::rename(log.path(), dir.path().join(OLD_NAME)).unwrap();
        log.append(&event("b")).unwrap();
        let news = follower.read().unwrap();
        let reasons: Vec<_> = news
            .events
            .iter()
            .filter_map(|e| e.reason.as_deref())
            .collect();
        assert_eq!(reasons, ["b"]);
        assert_eq!(news.unreadable, 1, "the rest of the old file, then the new");
        assert!(follower.read().unwrap().events.is_empty());
    }
}
