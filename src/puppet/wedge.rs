//! A wedged pool: no JRuby free and, for longer than `--wedged-after`, no borrow has
//! succeeded while borrows timed out (`borrow-timeout`) or were refused (`max-queued-requests`).
//! "Busy is never out" holds for a pool that compiles slowly, so that a load spike on every
//! master takes none of them out; a pool that only fails its requests is no moment of load
//! (e5ddf73 answered `200 OK - busy` for 84 s of a pool whose every JRuby was stuck). It is out,
//! saying why, until a borrow succeeds again or a JRuby is free.

use std::time::{Duration, Instant, SystemTime};

use crate::puppet::pool::{Pool, Unready};
use crate::settings::duration::format_duration;

/// The counters that tell a borrow that succeeded from one that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counters {
    borrows: u64,
    timeouts: u64,
    refusals: u64,
}

/// Follows the pool's counters from probe to probe.
#[derive(Debug)]
pub struct WedgeWatch {
    limit: Duration,
    last: Option<Counters>,
    /// Since when no borrow succeeded while borrows failed, on both clocks, with the counters
    /// then.
    stalled: Option<(Instant, SystemTime, Counters)>,
}

impl WedgeWatch {
    /// A watch that puts a pool out after `limit` of failures only; `0s` never does.
    pub fn new(limit: Duration) -> Self {
        Self {
            limit,
            last: None,
            stalled: None,
        }
    }

    /// Another Puppet Server process, or none: nothing carries over.
    pub fn restarted(&mut self) {
        self.last = None;
        self.stalled = None;
    }

    /// The pool at a probe: why it is out, when it is wedged for longer than the limit.
    pub fn observe(&mut self, pool: &Pool, now: Instant, wall: SystemTime) -> Option<Unready> {
        let counters = Counters {
            borrows: pool.borrows,
            timeouts: pool.borrow_timeouts,
            refusals: pool.queue_limit_hits,
        };
        let before = self.last.replace(counters)?;
        // Fewer than before: another Puppet Server process counts from zero.
        let went_back = counters.borrows < before.borrows
            || counters.timeouts < before.timeouts
            || counters.refusals < before.refusals;
        if went_back || counters.borrows > before.borrows || pool.free > 0 {
            self.stalled = None;
            return None;
        }
        let failed = counters.timeouts > before.timeouts || counters.refusals > before.refusals;
        if failed && self.stalled.is_none() {
            self.stalled = Some((now, wall, before));
        }
        let (began, since, then) = self.stalled?;
        let lasted = now.saturating_duration_since(began);
        if self.limit.is_zero() || lasted <= self.limit {
            return None;
        }
        Some(Unready::Wedged {
            since: crate::puppet::timestamp::clock(since)
                .unwrap_or_else(|| "a time this host's clock puts outside 1970 to 9999".into()),
            timeouts: counters.timeouts - then.timeouts,
            refusals: counters.refusals - then.refusals,
            lasted: format_duration(Duration::from_secs(lasted.as_secs())),
            limit: format_duration(self.limit),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(60);

    fn pool(free: u32, borrows: u64, timeouts: u64, refusals: u64) -> Pool {
        Pool {
            size: 2,
            free,
            borrowed: 2 - free,
            waiting: 3,
            average_free: 0.0,
            average_wait_ms: 0,
            average_borrow_ms: 0,
            queue_limit_hits: refusals,
            borrow_timeouts: timeouts,
            borrows,
            lock: "not-in-use".into(),
            lock_since: None,
            multithreaded: false,
        }
    }

    #[test]
    fn failures_without_a_success_for_longer_than_the_limit_are_out_until_a_borrow() {
        let mut w = WedgeWatch::new(LIMIT);
        let t0 = Instant::now();
        let wall = SystemTime::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(w.observe(&pool(0, 10, 0, 0), at(0), wall), None);
        assert_eq!(
            w.observe(&pool(0, 10, 1, 0), at(10), wall),
            None,
            "it begins"
        );
        assert_eq!(w.observe(&pool(0, 10, 1, 2), at(60), wall), None, "within");
        let out = w.observe(&pool(0, 10, 1, 2), at(71), wall).expect("out");
        let text = out.to_string();
        assert!(
            text.contains("1 borrow timed out and 2 refused")
                && text.contains("(61s): longer than --wedged-after 1m"),
            "{text}"
        );
        assert!(
            w.observe(&pool(0, 10, 1, 2), at(90), wall).is_some(),
            "still"
        );
        assert_eq!(
            w.observe(&pool(0, 11, 1, 2), at(91), wall),
            None,
            "a borrow"
        );
    }

    #[test]
    fn a_slow_pool_a_free_jruby_a_restart_or_no_limit_is_never_out() {
        let t0 = Instant::now();
        let wall = SystemTime::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Slow: borrows succeed beside the failures.
        let mut w = WedgeWatch::new(LIMIT);
        for (i, s) in (0..10u64).enumerate() {
            assert_eq!(
                w.observe(&pool(0, 10 + s, s, s), at(s * 30), wall),
                None,
                "{i}"
            );
        }
        // A JRuby free ends it.
        let mut w = WedgeWatch::new(LIMIT);
        w.observe(&pool(0, 10, 0, 0), at(0), wall);
        w.observe(&pool(0, 10, 1, 0), at(1), wall);
        assert_eq!(w.observe(&pool(1, 10, 1, 0), at(100), wall), None);
        // Counters from zero: another process.
        let mut w = WedgeWatch::new(LIMIT);
        w.observe(&pool(0, 10, 0, 0), at(0), wall);
        w.observe(&pool(0, 10, 1, 0), at(1), wall);
        assert_eq!(w.observe(&pool(0, 0, 0, 0), at(100), wall), None);
        // Off.
        let mut w = WedgeWatch::new(Duration::ZERO);
        w.observe(&pool(0, 10, 0, 0), at(0), wall);
        w.observe(&pool(0, 10, 1, 0), at(1), wall);
        assert_eq!(w.observe(&pool(0, 10, 2, 0), at(1000), wall), None);
    }
}
