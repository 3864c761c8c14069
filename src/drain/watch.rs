//! The drain record as the daemon sees it: looked at in the background as soon as the state
//! directory reports a change (inotify: a `pmcheck drain` is answered at once), when a
//! `drain --for` runs out, and on SIGHUP; re-read only when it changed, and published for every
//! poll to borrow. While the directory's events are not heard (no inotify, no directory yet, a
//! look that hangs, a state that is unknown) it is looked at every quarter second instead.
//! An idle daemon with a drain record on a local disk therefore wakes for nothing here.
//!
//! The file system calls run on tokio's blocking pool under a deadline, so a drain path that
//! blocks (a FIFO, a hung NFS mount) costs one parked thread and a 503 UNKNOWN, never the poll
//! path, the prober or shutdown.

use std::future::Future;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::sync::watch;

use crate::drain::file::{DrainFile, Look};
use crate::drain::record::{DrainState, Unreadable};
use crate::file_stamp::FileStamp;

/// How often the file is looked at while the directory's events are not heard: a drain reaches
/// the answers this fast, well inside one HAProxy check interval.
pub const EVERY: Duration = Duration::from_millis(250);
/// How long one look may take before the state counts as unknown.
pub const DEADLINE: Duration = Duration::from_secs(1);

/// The latest drain state, shared between the watcher and every poll.
pub type Drains = watch::Receiver<Arc<DrainState>>;

/// The longest sleep towards a `drain --for`'s end: the sleep runs on the monotonic clock and
/// the end is a wall-clock date, so a clock step delays the expiry by this much at most.
const EXPIRY_RECHECK: Duration = Duration::from_secs(5);

/// "The state directory changed", for whatever else reads a file in it (the event log's
/// audit): its events while they are heard, a tick every [`EVERY`] while they are not.
#[derive(Debug, Clone)]
pub struct Directory {
    events: watch::Receiver<u64>,
    watching: Arc<AtomicBool>,
}

impl Directory {
    /// Resolves at the directory's next change, or after [`EVERY`] while its events are not heard.
    pub async fn changed(&mut self) {
        if self.watching.load(Ordering::Acquire) && self.events.changed().await.is_ok() {
            return;
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// One look at the file off the runtime's workers, bounded by [`DEADLINE`]. A look that has
/// not come back yet is awaited again rather than started twice, so a hung file system holds
/// one blocking thread, not one per attempt.
pub struct Watcher {
    file: Arc<DrainFile>,
    /// [`DrainFile::look`]; a test puts a file system that hangs in its place.
    read: Reader,
    known: Option<FileStamp>,
    pending: Option<tokio::task::JoinHandle<Job>>,
    /// Counts the state directory's events, sent by the thread that reads them.
    changes: Arc<watch::Sender<u64>>,
    /// The watcher's own view of that count.
    events: watch::Receiver<u64>,
    /// Whether that thread runs; a look sets it up (again) while it does not.
    watching: Arc<AtomicBool>,
    /// Whether to watch for events at all: not for one look (`pmcheck inetd`).
    watch: bool,
}

type Reader = Arc<dyn Fn(&DrainFile, Option<FileStamp>, SystemTime) -> Option<Look> + Send + Sync>;

/// What a look on the blocking pool brings back.
struct Job {
    look: Option<Look>,
    /// Whether this look tried to set up the watch, and what it got.
    watch: Option<Option<Inotify>>,
}

/// Watches `dir` for anything that can change the record in it, or the directory itself going.
fn watch_dir(dir: &Path) -> Option<Inotify> {
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC).ok()?;
    let what = AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF;
    inotify.add_watch(dir, what).ok()?;
    Some(inotify)
}

/// Reads the events on a thread of its own and wakes the watcher at each; ends when the
/// directory goes. A thread, not tokio's `AsyncFd`: since tokio 1.54 its safe constructor is
/// deprecated as unsound (tokio #8587) and its replacement, `AsyncFd::register`, is `unsafe`,
/// which this crate forbids. The thread blocks in `read`, costing nothing while nothing changes.
fn forward_events(inotify: Inotify, watcher: &Watcher) {
    let (changes, watching) = (Arc::clone(&watcher.changes), Arc::clone(&watcher.watching));
    let wake = move || changes.send_modify(|n| *n = n.wrapping_add(1));
    let gone =
        AddWatchFlags::IN_IGNORED | AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF;
    // `watching` is cleared before the last wake-up, so the look it causes sets up a new watch
    // (checking `watching` after the wake-up could still see the old thread as running).
    let forward = move || {
        loop {
            match inotify.read_events() {
                Ok(events) if events.iter().any(|e| e.mask.intersects(gone)) => break,
                Ok(_) => wake(),
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => break,
            }
        }
        watching.store(false, Ordering::Release);
        wake();
    };
    if std::thread::Builder::new()
        .name("drain-events".into())
        .spawn(forward)
        .is_err()
    {
        // Nothing hears the events: the watcher looks every quarter second, and the next look
        // tries again.
        watcher.watching.store(false, Ordering::Release);
        tracing::debug!(every = ?EVERY, "no thread for the state directory's events; looking at intervals");
    }
}

impl Watcher {
    /// Watches `file`; the first look sets up the inotify watch.
    pub fn new(file: DrainFile) -> Self {
        let (changes, events) = watch::channel(0);
        Self {
            file: Arc::new(file),
            read: Arc::new(DrainFile::look),
            known: None,
            pending: None,
            changes: Arc::new(changes),
            events,
            watching: Arc::new(AtomicBool::new(false)),
            watch: true,
        }
    }

    /// Resolves when the state directory reports a change (never while nothing watches it).
    pub async fn changed(&mut self) {
        if self.events.changed().await.is_err() {
            // The watcher holds the sender: unreachable, but never a busy loop.
            std::future::pending::<()>().await;
        }
    }

    /// The directory's changes, for another reader of its files.
    pub fn directory(&self) -> Directory {
        Directory {
            events: self.changes.subscribe(),
            watching: Arc::clone(&self.watching),
        }
    }

    /// Whether every change of the record will wake the watcher: its directory's events are
    /// read and no look is left hanging.
    fn hears_changes(&self) -> bool {
        self.watching.load(Ordering::Acquire) && self.pending.is_none()
    }

    /// The record watched.
    pub fn file(&self) -> &DrainFile {
        &self.file
    }

    /// The state now, or `None` when the file has not changed since the last look.
    pub async fn look(&mut self, force: bool) -> Option<DrainState> {
        if force {
            self.known = None;
        }
        let mut job = self.pending.take().unwrap_or_else(|| {
            let (file, known, read) = (Arc::clone(&self.file), self.known, Arc::clone(&self.read));
            // Claimed now, so that only one look sets the watch up.
            let watch = self.watch && !self.watching.swap(true, Ordering::AcqRel);
            tokio::task::spawn_blocking(move || Job {
                watch: watch.then(|| watch_dir(file.dir())),
                look: read(&file, known, SystemTime::now()),
            })
        });
        match tokio::time::timeout(DEADLINE, &mut job).await {
            Ok(Ok(Job { look, watch })) => {
                match watch {
                    Some(Some(events)) => forward_events(events, self),
                    // No directory to watch yet: try again at the next look.
                    Some(None) => self.watching.store(false, Ordering::Release),
                    None => {}
                }
                let look = look?;
                self.known = look.stamp;
                Some(look.state)
            }
            Ok(Err(panicked)) => {
                self.known = None;
                self.watching.store(false, Ordering::Release);
                Some(DrainState::Unknown(Unreadable::Read {
                    path: self.file.path().to_owned(),
                    source: Arc::new(io::Error::other(panicked.to_string())),
                }))
            }
            Err(_) => {
                // Whatever it brings back later, it must be taken as news.
                self.known = None;
                self.pending = Some(job);
                Some(DrainState::Unknown(self.file.hung(DEADLINE)))
            }
        }
    }
}

/// Publishes the drain state until `shutdown`; `reload` (SIGHUP) forces a fresh read.
pub async fn run(
    mut watcher: Watcher,
    publish: watch::Sender<Arc<DrainState>>,
    mut reload: watch::Receiver<()>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut force = false;
    loop {
        let looked = tokio::select! {
            looked = watcher.look(force) => looked,
            () = &mut shutdown => return,
        };
        let now = SystemTime::now();
        let news = match looked {
            Some(state) => {
                if force {
                    tracing::info!(
                        drain_file = %watcher.file().path().display(),
                        drain = %summary(&state),
                        "re-read the drain record"
                    );
                }
                Some(state.at(now).unwrap_or(state))
            }
            // Unchanged on disk; a `--for` drain may still have run out.
            None => publish.borrow().at(now),
        };
        if let Some(state) = news {
            publish.send_replace(Arc::new(state));
        }
        force = false;
        let next = next_look(&watcher, &publish.borrow(), SystemTime::now());
        tokio::select! {
            () = watcher.changed() => {}
            // Forever when there is no next look to make.
            () = tokio::time::sleep(next.unwrap_or_default()), if next.is_some() => {}
            changed = reload.changed() => force = changed.is_ok(),
            () = &mut shutdown => return,
        }
    }
}

/// How long the watcher may rest before it must look without an event: not at all while it
/// cannot hear changes or cannot tell the state, until a `drain --for` runs out, else forever.
fn next_look(watcher: &Watcher, state: &DrainState, now: SystemTime) -> Option<Duration> {
    if !watcher.hears_changes() || matches!(state, DrainState::Unknown(_)) {
        return Some(EVERY);
    }
    let DrainState::Drained(drain) = state else {
        return None;
    };
    let left = drain.until()?.duration_since(now).unwrap_or_default();
    Some(left.min(EXPIRY_RECHECK))
}

fn summary(state: &DrainState) -> String {
    match state {
        DrainState::NotDrained => "not drained".to_owned(),
        DrainState::Drained(d) => format!("drained: {}", d.describe()),
        DrainState::Expired(d) => format!("expired: {}", d.describe()),
        DrainState::Unknown(why) => format!("unknown: {why}"),
    }
}

/// Reads the state once within [`DEADLINE`], for a single poll (`pmcheck inetd`).
pub async fn read_once(file: DrainFile) -> DrainState {
    let mut watcher = Watcher::new(file);
    // One look: no events to wait for.
    watcher.watch = false;
    (watcher.look(true).await).unwrap_or_else(|| DrainState::Unknown(watcher.file().hung(DEADLINE)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::record::{Drain, DrainRecord};

    #[tokio::test]
    async fn a_drain_written_is_heard_of_at_once_and_read_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut watcher = Watcher::new(DrainFile::new(dir.path()));
        assert!(matches!(
            watcher.look(false).await,
            Some(DrainState::NotDrained)
        ));
        let file = DrainFile::new(dir.path());
        file.write(
            &DrainRecord::held_by(vec![crate::drain::holders::Holder::drain(
                "now".into(),
                None,
                SystemTime::now(),
            )])
            .unwrap(),
        )
        .unwrap();
        tokio::time::timeout(Duration::from_secs(5), watcher.changed())
            .await
            .expect("the state directory's events wake the watcher");
        let Some(DrainState::Drained(drain)) = watcher.look(false).await else {
            panic!("the new record is read");
        };
        assert_eq!(drain.record.unwrap().reason(), "now");
        assert!(
            watcher.look(false).await.is_none(),
            "unchanged: not read again"
        );
        assert!(
            watcher.look(true).await.is_some(),
            "a reload reads it again"
        );
    }

    /// An idle daemon wakes for nothing: while the directory's events are heard the watcher
    /// rests until a change, or until a `drain --for` runs out; while they are not, it looks
    /// every quarter second.
    #[tokio::test]
    async fn the_watcher_rests_while_it_hears_changes() {
        let dir = tempfile::tempdir().unwrap();
        let mut watcher = Watcher::new(DrainFile::new(dir.path()));
        let now = SystemTime::now();
        assert_eq!(
            next_look(&watcher, &DrainState::NotDrained, now),
            Some(EVERY),
            "no watch yet"
        );
        watcher.look(false).await;
        assert!(watcher.hears_changes(), "the first look sets the watch up");
        assert_eq!(next_look(&watcher, &DrainState::NotDrained, now), None);
        let drained = |lasting| {
            let record = DrainRecord::held_by(vec![crate::drain::holders::Holder::drain(
                "upgrade".into(),
                lasting,
                now,
            )])
            .unwrap();
            DrainState::Drained(Drain::parse(&serde_json::to_vec(&record).unwrap()))
        };
        assert_eq!(next_look(&watcher, &drained(None), now), None);
        // The record keeps whole seconds.
        let rest = next_look(&watcher, &drained(Some(Duration::from_secs(2))), now);
        assert!(
            rest.is_some_and(|r| (Duration::from_secs(1)..=Duration::from_secs(3)).contains(&r)),
            "wakes when the drain runs out: {rest:?}"
        );
        assert_eq!(
            next_look(&watcher, &drained(Some(Duration::from_secs(3600))), now),
            Some(EXPIRY_RECHECK),
            "a clock step delays the end by little"
        );
        let unknown = DrainState::Unknown(watcher.file().hung(DEADLINE));
        assert_eq!(
            next_look(&watcher, &unknown, now),
            Some(EVERY),
            "fail closed, look again"
        );
    }

    /// A file system that hangs until the test lets it go, as a dead NFS server does. (Real
    /// time: tokio's paused clock does not move while a blocking task runs.)
    #[tokio::test]
    async fn a_hung_file_system_is_unknown_and_holds_one_thread_only() {
        use std::sync::atomic::AtomicUsize;
        let dir = tempfile::tempdir().unwrap();
        let (release, hold) = std::sync::mpsc::channel::<()>();
        // Lets the file system go however the test ends, or the runtime would wait for it.
        struct Release(std::sync::mpsc::Sender<()>);
        impl Drop for Release {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        let release = Release(release);
        let hold = std::sync::Mutex::new(hold);
        let calls = Arc::new(AtomicUsize::new(0));
        let mut watcher = Watcher::new(DrainFile::new(dir.path()));
        let counted = Arc::clone(&calls);
        watcher.read = Arc::new(move |file, known, now| {
            counted.fetch_add(1, Ordering::SeqCst);
            let _ = hold.lock().unwrap().recv();
            file.look(known, now)
        });
        for _ in 0..2 {
            let Some(DrainState::Unknown(why)) = watcher.look(false).await else {
                panic!("a look that does not come back is unknown (fail closed)");
            };
            assert!(
                why.to_string().contains("has not finished after 1s"),
                "{why}"
            );
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "the hung look is awaited, not repeated"
        );
        drop(release);
        assert!(matches!(
            watcher.look(false).await,
            Some(DrainState::NotDrained)
        ));
    }

    #[tokio::test]
    async fn a_state_directory_that_comes_back_is_watched_again() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        let mut watcher = Watcher::new(DrainFile::new(&dir));
        watcher.look(false).await;
        std::fs::remove_dir(&dir).unwrap();
        tokio::time::timeout(Duration::from_secs(5), watcher.changed())
            .await
            .expect("the directory's removal is an event");
        assert!(matches!(
            watcher.look(false).await,
            Some(DrainState::Unknown(Unreadable::NoStateDir { .. }))
        ));
        std::fs::create_dir(&dir).unwrap();
        watcher.look(false).await;
        // The thread for the old directory has ended; the look just made set up a new watch.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !watcher.watching.load(Ordering::Acquire) {
            assert!(std::time::Instant::now() < deadline);
            watcher.look(false).await;
        }
        // Wake-ups left from the old directory must not pass for new events.
        while tokio::time::timeout(Duration::from_millis(50), watcher.changed())
            .await
            .is_ok()
        {}
        std::fs::write(dir.join("drain"), "").unwrap();
        tokio::time::timeout(Duration::from_secs(5), watcher.changed())
            .await
            .expect("events from the new directory");
    }
}
