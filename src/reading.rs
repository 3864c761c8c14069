//! The daemon's slow readings: what is read every so often off the poll path (certificate
//! dates, deploy records, file sync), whose latest value a scrape and the operator's JSON show.
//! Never part of the verdict. One loop for every reading ([`refresh`]); file reads go to the
//! blocking pool ([`off_workers`]).

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The latest reading, shared with whoever shows it; `None` before the first.
pub type Latest<T> = RwLock<Option<Arc<T>>>;

/// A reading slower than this is said in the log (a hung file system): the previous reading
/// stays shown, and no second read starts beside the stuck one.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Reads now and every `every`, publishing each reading into `latest`, until `shutdown`
/// (which never waits for a read under way). A read that gives `None` leaves the last shown.
pub async fn refresh<T>(
    every: Duration,
    mut read: impl AsyncFnMut() -> Option<T>,
    latest: Arc<Latest<T>>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let now = tokio::select! {
            now = read() => now,
            () = &mut shutdown => return,
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
/// shutdown never waits on it (the runtime leaves the thread behind). `None` when the read
/// panicked.
pub async fn off_workers<T, F>(read: F) -> Option<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let mut reading = tokio::task::spawn_blocking(read);
    let mut said = false;
    loop {
        tokio::select! {
            done = &mut reading => return done.ok(),
            () = tokio::time::sleep(DEADLINE), if !said => {
                tracing::warn!(
                    deadline_s = DEADLINE.as_secs(),
                    "a file read is taking too long (a hung file system?); the previous reading stays shown"
                );
                said = true;
            }
        }
    }
}
