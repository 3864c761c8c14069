//! The daemon's side of the drain event log: it reads the events the commands append as it
//! watches the drain record, counts them by action for `/metrics`, and logs each with
//! structured fields (as journal fields under systemd). It writes one event itself: the end of
//! a `drain --for`, which no command is there to see.

use std::collections::HashSet;
use std::fs;
use std::future::Future;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use crate::drain::file::DrainFile;
use crate::drain::holders::Kind;
use crate::drain::log::{Action, DrainLog, Event, ROTATE_AT, parse};
use crate::drain::record::DrainState;
use crate::drain::tenure::Stamp;
use crate::drain::watch::{Directory, Drains};
use crate::safe_file::{Access, Examined, Links};

/// Events seen by the daemon, by action: `pmcheck_drain_events_total{action}`.
#[derive(Debug, Default)]
pub struct EventCounts([AtomicU64; Action::ALL.len()]);

impl EventCounts {
    /// Counts one event.
    pub fn count(&self, action: Action) {
        self.0[action as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Each action with its count, in [`Action::ALL`]'s order.
    pub fn each(&self) -> [(Action, u64); Action::ALL.len()] {
        Action::ALL.map(|a| (a, self.0[a as usize].load(Ordering::Relaxed)))
    }
}

/// What the reader keeps between looks.
struct Audit {
    file: DrainFile,
    follower: Follower,
    /// The `--for` drains whose end is logged already (since, until).
    expired: HashSet<(Stamp, Stamp)>,
    /// The last read error, said once until it changes.
    failing: Option<String>,
}

/// Reads and reports new events until `shutdown`: at every change of the published drain
/// state, and at every change in the state directory (a refused drain changes nothing else).
pub async fn run(
    file: DrainFile,
    mut drains: Drains,
    mut directory: Directory,
    counts: Arc<EventCounts>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut audit = Some(Audit {
        follower: Follower::new(DrainLog::new(file.dir())),
        file,
        expired: HashSet::new(),
        failing: None,
    });
    loop {
        let state = Arc::clone(&drains.borrow_and_update());
        let Some(mut current) = audit.take() else {
            return;
        };
        let counts = Arc::clone(&counts);
        // Off the workers: the state directory may sit on a slow file system.
        let job = tokio::task::spawn_blocking(move || {
            current.look(&state, &counts);
            current
        });
        tokio::select! {
            done = job => audit = done.ok(),
            () = &mut shutdown => return,
        }
        tokio::select! {
            changed = drains.changed() => if changed.is_err() { return },
            () = directory.changed() => {}
            () = &mut shutdown => return,
        }
    }
}

impl Audit {
    fn look(&mut self, state: &DrainState, counts: &EventCounts) {
        if let DrainState::Expired(drain) = state {
            self.log_expiry(drain);
        }
        match self.follower.read() {
            Ok(news) => {
                self.failing = None;
                if news.unreadable > 0 {
                    tracing::warn!(
                        lines = news.unreadable,
                        drain_log = %self.follower.log.path().display(),
                        "lines of the drain event log are not drain events (written by hand, or damaged); left out"
                    );
                }
                for event in news.events {
                    counts.count(event.action);
                    // Under systemd `ACTION=drain`, `WHO=`, `REASON=`, `SINCE=`, `UNTIL=`,
                    // `HOLDER=` and `EVENT_TIME=` in the journal (`crate::logging`), so
                    // `journalctl -u pmcheck ACTION=drain` selects the drains.
                    tracing::info!(
                        action = event.action.as_str(),
                        who = %event.who,
                        reason = event.reason.as_deref(),
                        since = event.since.as_ref().map(Stamp::as_str),
                        until = event.until.as_ref().map(Stamp::as_str),
                        holder = event.holder.as_deref(),
                        event_time = %event.at,
                        "drain event"
                    );
                }
            }
            Err(e) => {
                let said = e.to_string();
                if self.failing.as_deref() != Some(&said) {
                    tracing::warn!(
                        drain_log = %self.follower.log.path().display(),
                        error = %said,
                        "cannot read the drain event log; drain events are not counted meanwhile"
                    );
                    self.failing = Some(said);
                }
            }
        }
    }

    /// Appends the end of a `drain --for` once: this process remembers what it logged, and
    /// the log's tail tells a restarted daemon what an earlier one did.
    fn log_expiry(&mut self, drain: &crate::drain::record::Drain) {
        let Some(record) = &drain.record else {
            return;
        };
        let now = SystemTime::now();
        let lapsed =
            (record.holders().iter()).filter(|h| h.kind == Kind::Drain && h.tenure.expired_at(now));
        for holder in lapsed {
            let Some(until) = holder.tenure.until.clone() else {
                continue;
            };
            let key = (holder.tenure.since.clone(), until);
            if !self.expired.contains(&key) && !self.logged_before(&key) {
                let mut event = Event::of(Action::Expire, holder, now);
                event.who = format!("{} (pmcheck serve: the --for ended)", event.who);
                match self.file.lock().map(|locked| locked.log(&[event])) {
                    Ok(lost) => {
                        for e in lost {
                            tracing::warn!(error = %e, "logging the end of a --for drain");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the end of a --for drain was not logged")
                    }
                }
            }
            self.expired.insert(key);
        }
    }

    fn logged_before(&self, (since, until): &(Stamp, Stamp)) -> bool {
        (self.follower.log.tail(32)).is_ok_and(|events| {
            events.iter().any(|e| {
                e.action == Action::Expire
                    && e.since.as_ref() == Some(since)
                    && e.until.as_ref() == Some(until)
            })
        })
    }
}

/// Follows the log for the daemon: the events appended since the last read, across a rotation.
#[derive(Debug)]
pub struct Follower {
    log: DrainLog,
    /// The inode and the offset read up to; inode 0 when there was no log.
    at: (u64, u64),
}

/// What one read of the log brought.
#[derive(Debug, Default)]
pub struct News {
    /// The new events.
    pub events: Vec<Event>,
    /// Lines that were not events (written by hand, or damaged).
    pub unreadable: usize,
}

impl Follower {
    /// Follows `log` from its end now: events from before the daemon started are not news.
    pub fn new(log: DrainLog) -> Self {
        let at = fs::metadata(log.path()).map_or((0, 0), |m| (m.ino(), m.len()));
        Self { log, at }
    }

    /// The events appended since the last call, at most 1 MiB a call.
    pub fn read(&mut self) -> io::Result<News> {
        let mut news = News::default();
        let now = match fs::metadata(self.log.path()) {
            Ok(meta) => (meta.ino(), meta.len()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(news),
            Err(e) => return Err(e),
        };
        let (ino, offset) = self.at;
        if ino != now.0 && ino != 0 {
            // Rotated: the rest of the old file first, if it is the one we read.
            let old = self.log.old_path();
            if fs::metadata(&old).is_ok_and(|m| m.ino() == ino) {
                self.take(&old, offset, &mut news)?;
            }
        }
        let from = if ino == now.0 && offset <= now.1 {
            offset
        } else {
            0
        };
        let read = self.take(self.log.path(), from, &mut news)?;
        self.at = (now.0, from + read);
        Ok(news)
    }

    /// Reads the whole lines of `path` from `offset`; returns the bytes consumed.
    fn take(&self, path: &Path, offset: u64, news: &mut News) -> io::Result<u64> {
        let mut file = Examined::at(path, Links::Refuse)?.open(path, Access::Read)?;
        file.seek(SeekFrom::Start(offset))?;
        let mut bytes = Vec::new();
        file.take(ROTATE_AT).read_to_end(&mut bytes)?;
        let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let (mut events, bad) = parse(&bytes[..end]);
        news.events.append(&mut events);
        news.unreadable += bad;
        Ok(end as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_kept_by_action() {
        let counts = EventCounts::default();
        counts.count(Action::Refused);
        counts.count(Action::Refused);
        counts.count(Action::Drain);
        let each = counts.each();
        assert_eq!(each[0], (Action::Drain, 1));
        assert_eq!(each[6], (Action::Refused, 2));
    }
}
