//! The daemon's slow readings: files read every so often off the async workers (certificate
//! dates, deploy records), whose latest value a scrape and the operator's JSON show. Never on
//! the poll path, and never part of the verdict.

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The latest reading, shared with whoever shows it; `None` before the first.
pub type Latest<T> = RwLock<Option<Arc<T>>>;

/// Reads now and every `every` on the blocking pool (a hung file system stalls this reader
/// only), publishing each reading into `latest`, until `shutdown`.
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
        if let Ok(now) = tokio::task::spawn_blocking(read.clone()).await
            && let Ok(mut slot) = latest.write()
        {
            *slot = Some(Arc::new(now));
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}
