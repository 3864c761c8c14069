//! The drain record as the daemon sees it: looked at in the background every quarter second and
//! at once on SIGHUP, re-read only when it changed, and published for every poll to borrow.
//!
//! The file system calls run on tokio's blocking pool under a deadline, so a drain path that
//! blocks (a FIFO, a hung NFS mount) costs one parked thread and a 503 UNKNOWN, never the poll
//! path, the prober or shutdown.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::drain::{DrainFile, DrainState, Look, Unreadable};
use crate::identity::FileStamp;

/// How often the file is looked at: a drain reaches the answers this fast, well inside one
/// HAProxy check interval.
pub const EVERY: Duration = Duration::from_millis(250);
/// How long one look may take before the state counts as unknown.
pub const DEADLINE: Duration = Duration::from_secs(1);

/// The latest drain state, shared between the watcher and every poll.
pub type Drains = watch::Receiver<Arc<DrainState>>;

/// One look at the file off the runtime's workers, bounded by [`DEADLINE`]. A look that has
/// not come back yet is awaited again rather than started twice, so a hung file system holds
/// one blocking thread, not one per attempt.
pub struct Watcher {
    file: Arc<DrainFile>,
    known: Option<FileStamp>,
    pending: Option<tokio::task::JoinHandle<Option<Look>>>,
}

impl Watcher {
    pub fn new(file: DrainFile) -> Self {
        Self {
            file: Arc::new(file),
            known: None,
            pending: None,
        }
    }

    pub fn file(&self) -> &DrainFile {
        &self.file
    }

    /// The state now, or `None` when the file has not changed since the last look.
    pub async fn look(&mut self, force: bool) -> Option<DrainState> {
        if force {
            self.known = None;
        }
        let mut job = self.pending.take().unwrap_or_else(|| {
            let (file, known) = (Arc::clone(&self.file), self.known);
            tokio::task::spawn_blocking(move || file.look(known, SystemTime::now()))
        });
        match tokio::time::timeout(DEADLINE, &mut job).await {
            Ok(Ok(Some(look))) => {
                self.known = look.stamp;
                Some(look.state)
            }
            Ok(Ok(None)) => None,
            Ok(Err(panicked)) => {
                self.known = None;
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
        match looked {
            Some(state) => {
                if force {
                    tracing::info!(
                        "re-read the drain record {}: {}",
                        watcher.file().path().display(),
                        summary(&state)
                    );
                }
                let state = state.at(now).unwrap_or(state);
                publish.send_replace(Arc::new(state));
            }
            // Unchanged on disk; a `--for` drain may still have run out.
            None => {
                let expired = publish.borrow().at(now);
                if let Some(expired) = expired {
                    publish.send_replace(Arc::new(expired));
                }
            }
        }
        force = false;
        tokio::select! {
            () = tokio::time::sleep(EVERY) => {}
            changed = reload.changed() => force = changed.is_ok(),
            () = &mut shutdown => return,
        }
    }
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
    match watcher.look(true).await {
        Some(state) => state,
        None => DrainState::Unknown(watcher.file().hung(DEADLINE)),
    }
}
