//! A log line for an event that may repeat thousands of times a second (a shed connection, a
//! refused one, a failed accept): the first at once, then at most one per period with the count.

use std::time::{Duration, Instant};

/// Counts an event that may repeat thousands of times a second, and says when it is time to
/// log it again: at the first occurrence, then at most once per period, with the count since.
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    last: Option<Instant>,
    count: u64,
}

impl Throttle {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            count: 0,
        }
    }

    /// Records one event; `Some(n)` when it should be logged, `n` counting this one.
    pub fn hit(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < self.every)
        {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}
