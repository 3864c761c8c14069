//! The agent-check weight: the share of new agents a node asks HAProxy for, in percent of its
//! configured weight.
//!
//! `weight = min(pool, ramp)`, never below [`FLOOR`] (0 would mean drain):
//! - pool: `100 x (free - waiting) / size` from Puppet Server's JRuby pool: a warm idle node
//!   gets 100, a warming one the share of its instances that exist, a busy one less and less;
//! - ramp: after the node comes back (a restart, a reload, an undrain, a failure that ended),
//!   from `FLOOR` to 100 linearly over `--slow-start`, because `balance leastconn` would
//!   otherwise send every new agent to the node with no connections, onto cold JRubies.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::health::verdict::Verdict;
use crate::puppet::pool::Pool;

/// The lowest weight pmcheck reports: a busy node keeps a trickle of new agents.
pub const FLOOR: u8 = 10;

/// The weight the pool allows.
pub fn of_pool(pool: &Pool) -> u8 {
    if pool.size == 0 {
        return FLOOR;
    }
    let spare = u64::from(pool.free.saturating_sub(pool.waiting));
    let pct = (spare * 100 / u64::from(pool.size)).min(100) as u8;
    pct.max(FLOOR)
}

/// The weight `elapsed` into a ramp of length `over`.
pub fn ramp(elapsed: Duration, over: Duration) -> u8 {
    if elapsed >= over {
        return 100;
    }
    let span = f64::from(100 - FLOOR);
    let done = elapsed.as_secs_f64() / over.as_secs_f64();
    (f64::from(FLOOR) + span * done).floor() as u8
}

/// Where a node stands on its way back into the pool, as the verdicts seen so far tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejoin {
    /// Serving since pmcheck started, or for longer than a ramp: no ramp.
    Steady,
    /// Out of the pool: the latest verdict seen was not OK.
    Out,
    /// Back in the pool since then: the ramp runs from there.
    Since(Instant),
}

/// Why the weight is what it is, for the operator (`pmcheck status`, the JSON answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cause", rename_all = "kebab-case")]
pub enum WeightCause {
    /// All of it: warm and idle, or no pool numbers to go by.
    Full,
    /// The pool's free share: busy or warming.
    Pool,
    /// The ramp after coming back, full in this long.
    Ramp {
        /// Milliseconds until the ramp reaches 100%.
        full_in_ms: u64,
    },
    /// Paused: the floor, as every other paused master.
    Paused,
    /// Not OK: the floor (and a drain's agent line carries no weight at all).
    NotOk,
}

impl Rejoin {
    /// The weight and why.
    pub fn weigh(
        self,
        verdict: Verdict,
        pool: Option<&Pool>,
        now: Instant,
        over: Duration,
    ) -> (u8, WeightCause) {
        if verdict != Verdict::Ok {
            return (FLOOR, WeightCause::NotOk);
        }
        let pool = pool.map_or(100, of_pool);
        let elapsed = match self {
            Rejoin::Steady => over,
            // OK now, but the tracker has not seen it yet: the ramp starts now.
            Rejoin::Out => Duration::ZERO,
            Rejoin::Since(back) => now.saturating_duration_since(back),
        };
        let ramp = ramp(elapsed, over);
        let weight = pool.min(ramp).max(FLOOR);
        let cause = if ramp < 100 && ramp <= pool {
            WeightCause::Ramp {
                full_in_ms: crate::text::ms(over.saturating_sub(elapsed)),
            }
        } else if pool < 100 {
            WeightCause::Pool
        } else {
            WeightCause::Full
        };
        (weight, cause)
    }
}

/// Follows the verdicts to know when a node came back. A first OK (pmcheck started on a
/// serving node) starts no ramp: HAProxy never took the node out.
#[derive(Debug)]
pub struct Tracker {
    state: Rejoin,
    over: Duration,
}

impl Tracker {
    /// A tracker for ramps of length `over`.
    pub fn new(over: Duration) -> Self {
        Self {
            state: Rejoin::Steady,
            over,
        }
    }

    /// A tracker that resumes a ramp `elapsed` into its length at `now`: the one a previous
    /// daemon began (`STATE_DIR/ramp`).
    pub fn resuming(over: Duration, elapsed: Duration, now: Instant) -> Self {
        let back = now.checked_sub(elapsed);
        let state = back.map_or(Rejoin::Steady, Rejoin::Since);
        Self { state, over }
    }

    /// Takes the verdict of `now` into account and says where the node stands.
    pub fn observe(&mut self, verdict: Verdict, now: Instant) -> Rejoin {
        self.state = match (self.state, verdict) {
            // No probe yet says nothing about the node.
            (state, Verdict::Starting) => state,
            (Rejoin::Out, Verdict::Ok) if self.over.is_zero() => Rejoin::Steady,
            (Rejoin::Out, Verdict::Ok) => Rejoin::Since(now),
            (Rejoin::Since(back), Verdict::Ok)
                if now.saturating_duration_since(back) >= self.over =>
            {
                Rejoin::Steady
            }
            (state, Verdict::Ok) => state,
            (_, _) => Rejoin::Out,
        };
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(size: u32, free: u32, borrowed: u32, waiting: u32) -> Pool {
        Pool {
            size,
            free,
            borrowed,
            waiting,
            average_free: 0.0,
            average_wait_ms: 0,
            average_borrow_ms: 0,
            queue_limit_hits: 0,
            borrow_timeouts: 0,
            borrows: 0,
            lock: "not-in-use".into(),
            lock_since: None,
            multithreaded: false,
        }
    }

    /// Pool states as Puppet Server reported them (size, free, borrowed, waiting) and the
    /// weight each must give.
    #[test]
    fn the_pool_sets_the_weight() {
        let cases = [
            ((4, 4, 0, 0), 100, "warm and idle"),
            ((1, 1, 0, 0), 100, "the captured 2-core server, idle"),
            ((4, 1, 0, 0), 25, "warming: one of four instances exists"),
            ((2, 1, 0, 0), 50, "warming: one of two"),
            ((4, 3, 1, 0), 75, "one compile running"),
            ((4, 1, 3, 0), 25, "three compiles running"),
            ((2, 0, 2, 0), FLOOR, "saturated: the floor, never 0"),
            (
                (1, 0, 1, 1),
                FLOOR,
                "two concurrent runs on one instance (measured)",
            ),
            ((4, 2, 2, 5), FLOOR, "more waiting than free"),
            ((0, 0, 0, 0), FLOOR, "a pool of no size"),
        ];
        for ((size, free, borrowed, waiting), want, what) in cases {
            assert_eq!(
                of_pool(&pool(size, free, borrowed, waiting)),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn the_ramp_runs_from_the_floor_to_full() {
        let over = Duration::from_secs(60);
        assert_eq!(ramp(Duration::ZERO, over), FLOOR);
        assert_eq!(ramp(Duration::from_secs(30), over), 55);
        assert_eq!(ramp(Duration::from_secs(59), over), 98);
        assert_eq!(ramp(over, over), 100);
        assert_eq!(ramp(Duration::from_secs(3600), over), 100);
        assert_eq!(ramp(Duration::ZERO, Duration::ZERO), 100, "0s turns it off");
    }

    #[test]
    fn a_node_ramps_only_after_coming_back() {
        let over = Duration::from_secs(60);
        let t0 = Instant::now();
        let mut tracker = Tracker::new(over);
        assert_eq!(tracker.observe(Verdict::Starting, t0), Rejoin::Steady);
        assert_eq!(
            tracker.observe(Verdict::Ok, t0),
            Rejoin::Steady,
            "pmcheck started on a serving node: HAProxy never took it out"
        );
        assert_eq!(tracker.observe(Verdict::Drained, t0), Rejoin::Out);
        let back = t0 + Duration::from_secs(5);
        assert_eq!(tracker.observe(Verdict::Ok, back), Rejoin::Since(back));
        let state = tracker.observe(Verdict::Ok, back + Duration::from_secs(30));
        assert_eq!(
            state
                .weigh(Verdict::Ok, None, back + Duration::from_secs(30), over)
                .0,
            55
        );
        assert_eq!(
            tracker.observe(Verdict::Ok, back + over),
            Rejoin::Steady,
            "the ramp ends"
        );
        assert_eq!(tracker.observe(Verdict::Down, back + over), Rejoin::Out);
        assert_eq!(tracker.observe(Verdict::Starting, back + over), Rejoin::Out);
    }

    #[test]
    fn the_weight_is_the_lower_of_pool_and_ramp_and_the_floor_when_not_ok() {
        let over = Duration::from_secs(60);
        let now = Instant::now();
        let busy = pool(4, 1, 3, 0);
        let back = Rejoin::Since(now - Duration::from_secs(54));
        assert_eq!(
            back.weigh(Verdict::Ok, Some(&busy), now, over).0,
            25,
            "pool"
        );
        let warm = pool(4, 4, 0, 0);
        assert_eq!(
            back.weigh(Verdict::Ok, Some(&warm), now, over).0,
            91,
            "ramp"
        );
        assert_eq!(
            Rejoin::Out.weigh(Verdict::Ok, Some(&warm), now, over).0,
            FLOOR,
            "OK before the tracker saw it: the ramp starts now"
        );
        assert_eq!(
            Rejoin::Steady.weigh(Verdict::Down, None, now, over).0,
            FLOOR
        );
        assert_eq!(Rejoin::Steady.weigh(Verdict::Ok, None, now, over).0, 100);
    }
}
