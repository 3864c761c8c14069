//! A pause: a JRuby pool that could compile since this Puppet Server process started, and for
//! a moment cannot. Some moments hit every compile master at once (Puppet Enterprise's file
//! sync locks every pool at each code deploy; deploy hooks flush every pool through the admin
//! API; a multithreaded JRuby is replaced when it reaches `max-requests-per-instance`), and
//! requests wait in Puppet Server's queue meanwhile and succeed. Answering them NOTREADY would
//! take every master out together: a pause is answered OK at the floor weight, for at most
//! `--pause-grace`.
//!
//! "Since this process started" is what the probe can see: the pool was ready at a probe, and
//! no probe since has found the port closed or the server starting or stopping (a restart and
//! a HUP reload both close the port for seconds), and the JVM's `start-time-ms` is the same
//! as when the pool was ready (a restart between two probes would change it; a reload keeps
//! the JVM, which is why the refused connection is the rule and the start time the check).

use std::time::{Duration, Instant, SystemTime};

use crate::puppet::pool::Unready;
use crate::puppet::timestamp;
use crate::settings::duration::format_duration;

/// What holds the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseCause {
    /// The pool lock is `:acquired` (file sync during a code deploy).
    Locked,
    /// No instance exists: a flush refilling it (or a multithreaded JRuby being replaced).
    Refilling,
}

/// A pause in force, as the answer shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pause {
    /// What holds the pool.
    pub cause: PauseCause,
    /// When pmcheck first saw it.
    pub since: SystemTime,
    /// How long it has lasted at this probe.
    pub lasted: Duration,
    /// One multithreaded JRuby, whose replacement is the refill.
    pub multithreaded: bool,
    /// The latest probe got no answer within its deadline: Puppet Server is busy making
    /// JRubies (measured: a refill can stall the status API for seconds on a small machine).
    pub unanswered: bool,
}

impl Pause {
    /// `paused: JRuby pool locked since 12:00:01Z (3s)`: the reason an operator reads.
    pub fn describe(&self) -> String {
        let what = match (self.cause, self.multithreaded) {
            (PauseCause::Locked, _) => "JRuby pool locked",
            (PauseCause::Refilling, false) => "JRuby pool refilling after a flush",
            (PauseCause::Refilling, true) => "the multithreaded JRuby being replaced",
        };
        // A time it cannot write (a clock before 1970) is left out: never a panic.
        let since =
            timestamp::clock(self.since).map_or_else(String::new, |c| format!(" since {c}"));
        let slow = if self.unanswered {
            "; Puppet Server's status API is slow to answer meanwhile"
        } else {
            ""
        };
        format!(
            "paused: {what}{since} ({}){slow}",
            format_duration(Duration::from_secs(self.lasted.as_secs()))
        )
    }
}

/// When Puppet Server says the pause began: a lock's `last-change-time`, if it parses and is
/// not in the future. Nothing says when a refill began. A probe with no history (`check`,
/// inetd) grants a pause only from this: "since now" would be new at every poll, and a pool
/// that stays empty would be answered OK forever.
pub fn began(why: &Unready, wall: SystemTime) -> Option<SystemTime> {
    match why {
        Unready::Locked { since: Some(since) } => timestamp::parse(since).filter(|t| *t <= wall),
        _ => None,
    }
}

/// Follows the pool from probe to probe to tell a pause from a start.
#[derive(Debug)]
pub struct PauseWatch {
    grace: Duration,
    /// Ready since the last sign of a (re)start; with the JVM's start time then, when known.
    ready: Option<Option<u64>>,
    /// The pause under way: when it began, on both clocks, what holds it, and whether the
    /// JRuby is multithreaded.
    paused: Option<(Instant, SystemTime, PauseCause, bool)>,
}

impl PauseWatch {
    /// A watch allowing pauses of up to `grace`; it has seen nothing yet, so the first
    /// unready pool is not a pause (pmcheck may have started with Puppet Server).
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            ready: None,
            paused: None,
        }
    }

    /// Puppet Server refused a connection, or says it is starting or stopping: a new process,
    /// or a reload. Its pool must be ready again before an unready one counts as a pause.
    pub fn restarted(&mut self) {
        self.ready = None;
        self.paused = None;
    }

    /// The start time of the JVM whose pool was ready (ms since the epoch), when it was asked.
    pub fn started(&self) -> Option<u64> {
        self.ready.flatten()
    }

    /// Whether the pool was ready before: then the JVM's start time is worth asking for.
    pub fn was_ready(&self) -> bool {
        self.ready.is_some()
    }

    /// Whether an unready pool now would begin a pause: the start time decides it.
    pub fn would_begin(&self) -> bool {
        self.was_ready() && self.paused.is_none()
    }

    /// The pool can compile; `jvm_start` is the JVM's start time when asked for it (once per
    /// process: only while the watch has not seen the pool ready).
    pub fn ready(&mut self, jvm_start: Option<u64>) {
        self.paused = None;
        if self.ready.is_none() {
            self.ready = Some(jvm_start);
        }
    }

    /// The pool cannot compile because of `why`: a pause while within the grace, else why not.
    /// `jvm_start` is asked for at the pause's beginning ([`Self::would_begin`]).
    pub fn unready(
        &mut self,
        why: Unready,
        jvm_start: Option<u64>,
        now: Instant,
        wall: SystemTime,
    ) -> Result<Pause, Unready> {
        let (cause, multithreaded) = match &why {
            Unready::Locked { .. } => (PauseCause::Locked, false),
            Unready::NoInstance { multithreaded, .. } => (PauseCause::Refilling, *multithreaded),
            _ => {
                self.restarted();
                return Err(why);
            }
        };
        // `--pause-grace 0s`: no pause at all, a flush is NOTREADY at once.
        let Some(start_when_ready) = self.ready.filter(|_| !self.grace.is_zero()) else {
            return Err(why);
        };
        // Another JVM than the one that was ready: a restart the probes did not see.
        if let (Some(then), Some(now_start)) = (start_when_ready, jvm_start)
            && then != now_start
        {
            self.restarted();
            return Err(why);
        }
        // A lock says when it was taken: the pause began then (a one-shot `check` of a lock
        // held for an hour must not call it new), never later than now.
        let taken = began(&why, wall);
        let under = *self.paused.get_or_insert_with(|| match taken {
            Some(t) => {
                let ago = wall.duration_since(t).unwrap_or_default();
                (now.checked_sub(ago).unwrap_or(now), t, cause, multithreaded)
            }
            None => (now, wall, cause, multithreaded),
        });
        self.judge(under, now, false)
    }

    /// A pause under way goes on, within the same grace (the time does not start again),
    /// while the pool's status is missing, or while no answer comes within the probe's deadline
    /// (`unanswered`: Puppet Server is busy making JRubies). `None` when no pause is under way:
    /// then a timeout is what it always was.
    pub fn goes_on(&self, now: Instant, unanswered: bool) -> Option<Result<Pause, Unready>> {
        Some(self.judge(self.paused?, now, unanswered))
    }

    fn judge(
        &self,
        (began, since, cause, multithreaded): (Instant, SystemTime, PauseCause, bool),
        now: Instant,
        unanswered: bool,
    ) -> Result<Pause, Unready> {
        let pause = Pause {
            cause,
            since,
            lasted: now.saturating_duration_since(began),
            multithreaded,
            unanswered,
        };
        if pause.lasted > self.grace {
            return Err(Unready::PausedTooLong {
                pause: pause.describe(),
                grace: format_duration(self.grace),
            });
        }
        Ok(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(60);

    fn locked() -> Unready {
        Unready::Locked { since: None }
    }

    fn empty() -> Unready {
        Unready::NoInstance {
            size: 2,
            multithreaded: false,
        }
    }

    #[test]
    fn an_unready_pool_never_ready_before_is_not_a_pause() {
        let mut w = PauseWatch::new(GRACE);
        let t0 = Instant::now();
        assert_eq!(
            w.unready(locked(), None, t0, SystemTime::now()),
            Err(locked()),
            "a lock during start-up"
        );
        assert_eq!(
            w.unready(empty(), None, t0, SystemTime::now()),
            Err(empty())
        );
    }

    #[test]
    fn a_lock_or_a_refill_after_ready_is_a_pause_until_the_grace() {
        let mut w = PauseWatch::new(GRACE);
        w.ready(Some(1000));
        let t0 = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(43201);
        assert!(w.would_begin());
        let p = w.unready(locked(), Some(1000), t0, wall).unwrap();
        assert_eq!(
            p.describe(),
            "paused: JRuby pool locked since 12:00:01Z (0s)"
        );
        let p = w
            .unready(
                locked(),
                None,
                t0 + Duration::from_secs(3),
                SystemTime::now(),
            )
            .unwrap();
        assert_eq!(p.since, wall, "the pause began at its first probe");
        assert_eq!(
            p.describe(),
            "paused: JRuby pool locked since 12:00:01Z (3s)"
        );
        assert!(!w.would_begin());
        match w.unready(locked(), None, t0 + GRACE + Duration::from_secs(1), wall) {
            Err(Unready::PausedTooLong { pause, grace }) => {
                assert_eq!(pause, "paused: JRuby pool locked since 12:00:01Z (61s)");
                assert_eq!(grace, "1m");
            }
            other => panic!("{other:?}"),
        }
        // Ready again: the next pause has a grace of its own.
        w.ready(None);
        let p = w
            .unready(empty(), Some(1000), t0 + GRACE * 2, wall)
            .unwrap();
        assert_eq!(p.cause, PauseCause::Refilling);
        assert_eq!(p.lasted, Duration::ZERO);
    }

    #[test]
    fn a_refused_connection_or_a_new_jvm_ends_the_pool_readiness() {
        let mut w = PauseWatch::new(GRACE);
        w.ready(Some(1000));
        w.restarted();
        let now = Instant::now();
        assert_eq!(
            w.unready(empty(), None, now, SystemTime::now()),
            Err(empty())
        );
        w.ready(Some(1000));
        assert_eq!(
            w.unready(empty(), Some(2000), now, SystemTime::now()),
            Err(empty()),
            "another JVM: a restart between two probes"
        );
        assert!(!w.was_ready());
        // A server that does not say its start time: the refused connection alone decides.
        w.ready(None);
        assert!(
            w.unready(empty(), Some(2000), now, SystemTime::now())
                .is_ok()
        );
    }

    #[test]
    fn starting_and_stopping_end_the_readiness_too() {
        let mut w = PauseWatch::new(GRACE);
        w.ready(None);
        let now = Instant::now();
        let starting = Unready::State("stopping".into());
        assert_eq!(
            w.unready(starting.clone(), None, now, SystemTime::now()),
            Err(starting)
        );
        assert!(!w.was_ready());
    }

    #[test]
    fn a_multithreaded_refill_says_so_and_no_grace_means_no_pause() {
        let mut w = PauseWatch::new(GRACE);
        w.ready(None);
        let mt = Unready::NoInstance {
            size: 3,
            multithreaded: true,
        };
        let wall = SystemTime::UNIX_EPOCH;
        let p = w.unready(mt.clone(), None, Instant::now(), wall).unwrap();
        assert_eq!(
            p.describe(),
            "paused: the multithreaded JRuby being replaced since 00:00:00Z (0s)"
        );
        let mut none = PauseWatch::new(Duration::ZERO);
        none.ready(None);
        assert_eq!(
            none.unready(mt.clone(), None, Instant::now(), wall),
            Err(mt),
            "--pause-grace 0s: NOTREADY at once"
        );
    }

    #[test]
    fn no_answer_during_a_pause_keeps_it_within_the_grace() {
        let mut w = PauseWatch::new(GRACE);
        let t0 = Instant::now();
        assert_eq!(
            w.goes_on(t0, true),
            None,
            "no pause: a timeout stays a timeout"
        );
        w.ready(None);
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(43201);
        w.unready(empty(), None, t0, wall).unwrap();
        let p = w
            .goes_on(t0 + Duration::from_secs(2), true)
            .unwrap()
            .unwrap();
        assert_eq!(
            p.describe(),
            "paused: JRuby pool refilling after a flush since 12:00:01Z (2s); Puppet Server's \
             status API is slow to answer meanwhile"
        );
        assert!(matches!(
            w.goes_on(t0 + GRACE + Duration::from_secs(1), true),
            Some(Err(Unready::PausedTooLong { .. }))
        ));
    }

    #[test]
    fn a_lock_began_when_puppet_server_says_it_was_taken() {
        let mut w = PauseWatch::new(GRACE);
        w.ready(None);
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(43210);
        let locked_at = |t: &str| Unready::Locked {
            since: Some(t.to_owned()),
        };
        let now = Instant::now();
        let p = w
            .unready(locked_at("1970-01-01T12:00:01.500Z"), None, now, wall)
            .unwrap();
        assert_eq!(
            p.describe(),
            "paused: JRuby pool locked since 12:00:01Z (8s)"
        );
        // Held for longer than the grace before anyone looked: not a moment.
        let mut w = PauseWatch::new(GRACE);
        w.ready(None);
        assert!(matches!(
            w.unready(locked_at("1970-01-01T11:00:00Z"), None, now, wall),
            Err(Unready::PausedTooLong { .. })
        ));
        // A time in the future (clocks apart) counts from now.
        let mut w = PauseWatch::new(GRACE);
        w.ready(None);
        let p = w
            .unready(locked_at("1970-01-01T13:00:00Z"), None, now, wall)
            .unwrap();
        assert_eq!(p.lasted, Duration::ZERO);
    }

    /// The audit: a time humantime cannot write (before 1970, after 9999) panicked here, and
    /// every answer after was UNKNOWN. Such a time is left out of the words.
    #[test]
    fn a_pause_at_any_time_is_described_without_panic() {
        let epoch = SystemTime::UNIX_EPOCH;
        for since in [
            epoch - Duration::from_secs(1800),
            epoch + Duration::from_secs(253_402_300_800),
            epoch + Duration::from_secs(u64::from(u32::MAX) * 1000),
        ] {
            let p = Pause {
                cause: PauseCause::Locked,
                since,
                lasted: Duration::from_secs(3),
                multithreaded: false,
                unanswered: false,
            };
            assert_eq!(p.describe(), "paused: JRuby pool locked (3s)", "{since:?}");
        }
    }

    /// OpenVox's lock times carry the JVM zone's offset: read as UTC, a lock taken in Paris
    /// would be an hour in the future and a one-shot check (inetd mode) could grant no pause.
    #[test]
    fn a_lock_time_with_an_offset_begins_the_pause_at_the_same_moment() {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(43210);
        let taken = SystemTime::UNIX_EPOCH + Duration::from_millis(43_201_500);
        for since in [
            "1970-01-01T12:00:01.500Z",
            "1970-01-01T12:00:01.5Z",
            "1970-01-01T13:00:01.500+01:00",
            "1970-01-01T13:00:01.500000000+01:00",
            "1970-01-01T07:00:01.500-05:00",
        ] {
            let why = Unready::Locked {
                since: Some(since.to_owned()),
            };
            assert_eq!(began(&why, wall), Some(taken), "{since}");
        }
    }
}
