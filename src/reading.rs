//! The daemon's slow readings: files read every so often off the async workers (certificate
//! dates, deploy records), whose latest value a scrape and the operator's JSON show. Never on
//! the poll path, and never part of the verdict.

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The latest reading, shared with whoever shows it; `None` before the first.
pub type Latest<T> = RwLock<Option<Arc<T>>>;

/// A reading slower than this is said in the log (a hung file system): the previous reading
/// stays shown, and no second read starts beside the stuck one.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Reads now and every `every`, publishing each reading into `latest`, until `shutdown`.
pub async fn refresh<T, F>(
    every: Duration,
    read: F,
    latest: Arc<Latest<T>>,
    shutdown: impl Future<Output = ()>,
) where
    T: Send + Sync + 'static,
    F: Fn() -> T + Clone + Send + 'static,
{
    tokio::pin!(shutdown);
    loop {
        let Some(now) = off_workers(read.clone(), &mut shutdown).await else {
            return;
        };
        if let (Some(now), Ok(mut slot)) = (now, latest.write()) {
            *slot = Some(Arc::new(now));
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// Runs `read` on the blocking pool: a file system that hangs stalls this reader only, and
/// shutdown never waits on it (the runtime leaves the thread behind). `None` at shutdown;
/// `Some(None)` when the read panicked.
pub async fn off_workers<T, F>(
    read: F,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Option<Option<T>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let mut reading = tokio::task::spawn_blocking(read);
    let mut said = false;
    loop {
        tokio::select! {
            () = shutdown.as_mut() => return None,
            done = &mut reading => return Some(done.ok()),
            () = tokio::time::sleep(DEADLINE), if !said => {
                tracing::warn!(
                    "a file read is taking longer than {}s (a hung file system?); the previous reading stays shown",
                    DEADLINE.as_secs()
                );
                said = true;
            }
        }
    }
}
