//! The daemon's side of the drain event log: it reads the events the commands append as it
//! watches the drain record, counts them by action for `/metrics`, and logs each with
//! structured fields (as journal fields under systemd). It writes one event itself: the end of
//! a `drain --for`, which no command is there to see.

use std::collections::HashSet;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use crate::drain::file::DrainFile;
use crate::drain::holders::Kind;
use crate::drain::log::{Action, DrainLog, Event, Follower};
use crate::drain::record::DrainState;
use crate::drain::watch::{Directory, Drains};
use crate::journal;

/// Events seen by the daemon, by action: `pmcheck_drain_events_total{action}`.
#[derive(Debug, Default)]
pub struct EventCounts([AtomicU64; Action::ALL.len()]);

impl EventCounts {
    /// Counts one event.
    pub fn count(&self, action: Action) {
        self.0[index(action)].fetch_add(1, Ordering::Relaxed);
    }

    /// Each action with its count, in [`Action::ALL`]'s order.
    pub fn each(&self) -> [(Action, u64); Action::ALL.len()] {
        Action::ALL.map(|a| (a, self.0[index(a)].load(Ordering::Relaxed)))
    }
}

fn index(action: Action) -> usize {
    Action::ALL.iter().position(|&a| a == action).unwrap_or(0)
}

/// What the reader keeps between looks.
struct Audit {
    file: DrainFile,
    follower: Follower,
    /// The `--for` drains whose end is logged already (since, until).
    expired: HashSet<(String, String)>,
    /// Whether stderr is the journal: then events go there as native entries.
    journal: bool,
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
        journal: journal::stderr_is_journal(),
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
                        "{} line(s) of {} are not drain events (written by hand, or damaged); left out",
                        news.unreadable,
                        DrainLog::new(self.file.dir()).path().display()
                    );
                }
                for event in news.events {
                    counts.count(event.action);
                    self.report(&event);
                }
            }
            Err(e) => {
                let said = e.to_string();
                if self.failing.as_deref() != Some(&said) {
                    tracing::warn!(
                        "cannot read the drain event log {}: {said}; drain events are not counted meanwhile",
                        DrainLog::new(self.file.dir()).path().display()
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
        for holder in record.holders() {
            let Some(until) = holder.until.clone() else {
                continue;
            };
            if holder.kind != Kind::Drain || !holder.expired_at(now) {
                continue;
            }
            let key = (holder.since.clone(), until);
            if self.expired.contains(&key) || self.logged_before(&key) {
                self.expired.insert(key);
                continue;
            }
            let mut event = Event::of(Action::Expire, &holder, now);
            event.who = format!("{} (pmcheck serve: the --for ended)", event.who);
            match self.file.log(&[event]) {
                Ok(lost) => {
                    for e in lost {
                        tracing::warn!("{e}");
                    }
                }
                Err(e) => tracing::warn!("the end of a --for drain was not logged: {e}"),
            }
            self.expired.insert(key);
        }
    }

    fn logged_before(&self, (since, until): &(String, String)) -> bool {
        let log = DrainLog::new(self.file.dir());
        log.tail(32).is_ok_and(|events| {
            events.iter().any(|e| {
                e.action == Action::Expire
                    && e.since.as_ref() == Some(since)
                    && e.until.as_ref() == Some(until)
            })
        })
    }

    /// One event in the daemon's log: as a native journal entry with its fields when stderr
    /// is the journal (a failure there falls back to stderr), else a tracing line.
    fn report(&self, event: &Event) {
        if self.journal {
            match send_to_journal(Path::new(journal::SOCKET), event) {
                Ok(()) => return,
                Err(e) => tracing::warn!("cannot send a drain event to the journal: {e}"),
            }
        }
        tracing::info!(
            action = event.action.as_str(),
            who = %event.who,
            reason = event.reason.as_deref().unwrap_or(""),
            since = event.since.as_deref().unwrap_or(""),
            until = event.until.as_deref().unwrap_or(""),
            holder = event.holder.as_deref().unwrap_or(""),
            at = %event.at,
            "drain event: {}",
            event.describe()
        );
    }
}

/// `event` as a journal entry: `ACTION=drain`, `WHO=`, `REASON=`, `SINCE=`, `UNTIL=`,
/// `HOLDER=`, `EVENT_TIME=`, with `MESSAGE` for a person.
pub fn send_to_journal(socket: &Path, event: &Event) -> std::io::Result<()> {
    let message = format!("drain event: {}", event.describe());
    let mut fields = vec![
        ("MESSAGE", message.as_str()),
        ("PRIORITY", "6"),
        ("SYSLOG_IDENTIFIER", "pmcheck"),
        ("ACTION", event.action.as_str()),
        ("WHO", event.who.as_str()),
        ("EVENT_TIME", event.at.as_str()),
    ];
    let optional = [
        ("REASON", &event.reason),
        ("SINCE", &event.since),
        ("UNTIL", &event.until),
        ("HOLDER", &event.holder),
    ];
    fields.extend(
        optional
            .iter()
            .filter_map(|(k, v)| v.as_deref().map(|v| (*k, v))),
    );
    journal::send(socket, fields)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::holders::Holder;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn an_event_reaches_the_journal_as_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket");
        let journald = UnixDatagram::bind(&path).unwrap();
        let holder = Holder::drain("kernel 6.1".into(), None, SystemTime::now());
        send_to_journal(&path, &Event::of(Action::Drain, &holder, SystemTime::now())).unwrap();
        let mut buf = vec![0; 4096];
        let n = journald.recv(&mut buf).unwrap();
        let text = String::from_utf8_lossy(&buf[..n]);
        for field in [
            "ACTION=drain\n",
            "REASON=kernel 6.1\n",
            "HOLDER=drain\n",
            "WHO=",
        ] {
            assert!(text.contains(field), "{field} in {text}");
        }
        assert!(!text.contains("UNTIL="), "no --for, no UNTIL: {text}");
    }

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
