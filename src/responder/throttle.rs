//! A log line for an event that may repeat thousands of times a second (a shed connection, a
//! refused one, a failed accept): the first at once, then at most one per period with the count.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often a repeating event is logged at most.
pub const EVERY: Duration = Duration::from_secs(10);

/// Counts an event that may repeat thousands of times a second, and says when it is time to
/// log it again: at the first occurrence, then at most once per [`EVERY`], with the count since.
#[derive(Debug, Default)]
pub struct Throttle(Mutex<(Option<Instant>, u64)>);

impl Throttle {
    /// Records one event; `Some(n)` when it should be logged, `n` counting this one.
    pub fn hit(&self, now: Instant) -> Option<u64> {
        let mut guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (last, count) = &mut *guard;
        *count += 1;
        if last.is_some_and(|last| now.saturating_duration_since(last) < EVERY) {
            return None;
        }
        *last = Some(now);
        Some(std::mem::take(count))
    }
}
