//! The daemon's journal of its verdict: one line per change, never one per probe.
//!
//! A change is a new verdict, a new set of drain holders, or a new class of Puppet Server's
//! state (ready, warming, paused, each way of not being ready, each error). Numbers that move
//! with every probe (free JRubies, how long a pause or a wedge has lasted, a report's age) are
//! in the line that announces a change, and in `status`, but never make a line of their own:
//! a drained node with compiles in flight once wrote one warning per probe (86,400 a day).

use std::borrow::Cow;

use crate::drain::record::DrainState;
use crate::health::decision::Decision;
use crate::health::verdict::Verdict;
use crate::puppet::pool::{Load, Unready};
use crate::puppet::report::ProbeOutcome;

/// What was last announced.
#[derive(Debug, Default)]
pub(crate) struct VerdictLog(Option<Key>);

/// What a line announces a change of.
#[derive(Debug, PartialEq, Eq)]
struct Key {
    verdict: Verdict,
    /// The drain record's holders, or why the record cannot be read.
    drain: String,
    /// Puppet Server's state, by class.
    puppet: Cow<'static, str>,
}

impl Key {
    fn of(decision: &Decision<'_>) -> Self {
        let drain = match decision.drain {
            DrainState::NotDrained => String::new(),
            DrainState::Drained(d) => format!("{:?}", d.record.as_ref().map(|r| r.holders())),
            DrainState::Expired(d) => {
                format!("expired {:?}", d.record.as_ref().map(|r| r.holders()))
            }
            DrainState::Unknown(why) => why.to_string(),
        };
        Self {
            verdict: decision.verdict,
            drain,
            puppet: puppet_class(decision.probe.map(|p| &p.outcome)),
        }
    }
}

/// Puppet Server's state without the numbers that move: a busy pool and a free one are both
/// ready (on a small pool they trade places twice per agent run).
fn puppet_class(outcome: Option<&ProbeOutcome>) -> Cow<'static, str> {
    match outcome {
        None => "no probe yet".into(),
        Some(ProbeOutcome::Healthy(None | Some(Load::Warm | Load::Busy))) => "ready".into(),
        Some(ProbeOutcome::Healthy(Some(Load::Warming))) => "warming".into(),
        Some(ProbeOutcome::Healthy(Some(Load::Paused))) => "paused".into(),
        Some(ProbeOutcome::NotReady(Unready::State(state))) => format!("state {state}").into(),
        Some(ProbeOutcome::NotReady(Unready::RoutesMissing)) => "routes missing".into(),
        Some(ProbeOutcome::NotReady(Unready::Locked { .. })) => "locked".into(),
        Some(ProbeOutcome::NotReady(Unready::NoInstance { .. })) => "no instance".into(),
        Some(ProbeOutcome::NotReady(Unready::Wedged { .. })) => "wedged".into(),
        Some(ProbeOutcome::NotReady(Unready::PausedTooLong { .. })) => "paused too long".into(),
        Some(ProbeOutcome::NotReady(Unready::Unreported { .. })) => "pool unreported".into(),
        Some(ProbeOutcome::Unhealthy(e)) => format!("down: {e}").into(),
        Some(ProbeOutcome::CannotTell(e)) => format!("unknown: {e}").into(),
    }
}

impl VerdictLog {
    /// Logs `decision` when it announces a change; says at which level, if it did: info while
    /// serving or drained by an operator's act (nothing to act on), else a warning (out of the
    /// pool for a reason an operator must look at).
    pub(crate) fn note(&mut self, decision: &Decision<'_>) -> Option<tracing::Level> {
        // Until the first probe has finished there is nothing to say.
        decision.probe?;
        let key = Key::of(decision);
        if self.0.as_ref() == Some(&key) {
            return None;
        }
        self.0 = Some(key);
        let verdict = decision.verdict.as_str();
        let reason = &decision.reason;
        // A drained node sends no weight: the agent line says `drain`.
        let weight = (decision.verdict == Verdict::Ok).then_some(decision.weight);
        let drain = match decision.drain {
            DrainState::Drained(d) => Some(d.describe()),
            _ => None,
        };
        if matches!(decision.verdict, Verdict::Ok | Verdict::Drained) {
            tracing::info!(verdict, %reason, weight, drain, "verdict changed");
            Some(tracing::Level::INFO)
        } else {
            tracing::warn!(verdict, %reason, weight, "verdict changed");
            Some(tracing::Level::WARN)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant, SystemTime};

    use super::*;
    use crate::drain::file::DrainFile;
    use crate::drain::record::DrainRecord;
    use crate::health::Now;
    use crate::health::decision::Rules;
    use crate::health::weight::Rejoin;
    use crate::puppet::pause::{Pause, PauseCause};
    use crate::puppet::pool::Pool;
    use crate::puppet::probe_error::ProbeError;
    use crate::puppet::report::ProbeReport;
    use tracing::Level;

    /// Reports never go stale here: a minute of probes is made in microseconds.
    const RULES: Rules = Rules::ONCE;

    fn pool(free: u32) -> Pool {
        Pool {
            size: 4,
            free,
            borrowed: 4 - free,
            waiting: u32::from(free == 0),
            average_free: f64::from(free),
            average_wait_ms: 0,
            average_borrow_ms: 900,
            queue_limit_hits: 0,
            borrow_timeouts: 0,
            borrows: 100,
            lock: "not-in-use".into(),
            lock_since: None,
            multithreaded: false,
        }
    }

    /// The i-th probe of a busy pool: compiles come and go, the numbers move every time.
    fn busy(i: u32) -> ProbeReport {
        let free = i % 5;
        let load = if free == 0 { Load::Busy } else { Load::Warm };
        let report = ProbeReport::with_pool(
            ProbeOutcome::Healthy(Some(load)),
            Some(pool(free)),
            Duration::from_millis(5),
            None,
        );
        assert!(
            report.detail().contains(&format!("{free} of 4")),
            "{}",
            report.detail()
        );
        report
    }

    /// The i-th probe of a pool paused for a code deploy, the pause growing by a second.
    fn paused(i: u32) -> ProbeReport {
        let pause = Pause {
            cause: PauseCause::Locked,
            since: SystemTime::now(),
            lasted: Duration::from_secs(u64::from(i)),
            multithreaded: false,
            unanswered: false,
        };
        ProbeReport::paused(Some(pool(0)), pause, Duration::from_millis(5), None)
    }

    /// Lines written over a minute of probes (`probe(i)` each), and the loudest.
    fn a_minute(drain: &DrainState, probe: impl Fn(u32) -> ProbeReport) -> (usize, Vec<Level>) {
        let mut log = VerdictLog::default();
        let mut lines = Vec::new();
        let mut reasons = std::collections::BTreeSet::new();
        for i in 0..60 {
            let report = probe(i);
            let now = Now {
                at: Instant::now(),
                wall: SystemTime::now(),
            };
            let decision = Decision::decide(drain, Some(&report), Rejoin::Steady, now, &RULES);
            reasons.insert(decision.reason.to_string());
            lines.extend(log.note(&decision));
        }
        (reasons.len(), lines)
    }

    fn drained() -> (tempfile::TempDir, DrainState) {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        let now = SystemTime::now();
        file.write(
            &DrainRecord::held_by(vec![crate::drain::holders::Holder::drain(
                "kernel 6.1".into(),
                None,
                now,
            )])
            .unwrap(),
        )
        .unwrap();
        let state = file.state(now);
        assert!(matches!(state, DrainState::Drained(_)));
        (dir, state)
    }

    #[test]
    fn a_minute_of_probes_writes_one_line_idle_busy_drained_or_paused() {
        let (_dir, drained) = drained();
        let idle = |_| busy(1);
        for (case, drain, probe, loudness) in [
            (
                "idle",
                &DrainState::NotDrained,
                &idle as &dyn Fn(u32) -> ProbeReport,
                Level::INFO,
            ),
            ("busy", &DrainState::NotDrained, &busy, Level::INFO),
            ("drained and busy", &drained, &busy, Level::INFO),
            ("drained and paused", &drained, &paused, Level::INFO),
        ] {
            let (reasons, lines) = a_minute(drain, probe);
            assert_eq!(lines, [loudness], "{case}: one line, at info");
            if case != "idle" {
                assert!(reasons > 1, "{case}: the reason moved ({reasons} texts)");
            }
        }
    }

    #[test]
    fn each_change_of_class_is_one_line_and_trouble_is_a_warning() {
        let (_dir, drained) = drained();
        let refused = |_| {
            let addr = "127.0.0.1:8140".parse().unwrap();
            ProbeReport::new(
                ProbeOutcome::Unhealthy(ProbeError::Refused { addr }),
                Duration::from_millis(1),
                None,
            )
        };
        // Ready, paused, ready again, down, drained: five changes, five lines.
        let sequence: Vec<(&DrainState, ProbeReport)> = (0..50)
            .map(|i| match i {
                0..10 => (&DrainState::NotDrained, busy(i)),
                10..20 => (&DrainState::NotDrained, paused(i)),
                20..30 => (&DrainState::NotDrained, busy(i)),
                30..40 => (&DrainState::NotDrained, refused(i)),
                _ => (&drained, busy(i)),
            })
            .collect();
        let mut log = VerdictLog::default();
        let lines: Vec<Level> = sequence
            .iter()
            .filter_map(|(drain, report)| {
                let now = Now {
                    at: Instant::now(),
                    wall: SystemTime::now(),
                };
                log.note(&Decision::decide(
                    drain,
                    Some(report),
                    Rejoin::Steady,
                    now,
                    &RULES,
                ))
            })
            .collect();
        use Level as L;
        assert_eq!(lines, [L::INFO, L::INFO, L::INFO, L::WARN, L::INFO]);
    }
}
