//! The decision: the verdict with its reason and weight, from the drain record and the latest probe.
//!
//! The rules, in order: a drain state that cannot be read is UNKNOWN (fail closed); a drain is
//! DRAINED; no finished probe yet is STARTING (never healthy before a real check); a probe too
//! old to trust is UNKNOWN; a probe that could not be made is UNKNOWN; a failed probe is DOWN;
//! a Puppet Server that cannot compile yet is NOTREADY; otherwise OK, busy, paused or not. Only
//! OK answers 200: a busy node stays in the pool (taking it out would move its load onto the
//! others until all fall over) and asks for less through the agent check's weight; a paused
//! one ([`crate::puppet::pause`]) asks for the floor, as every other paused master does.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use crate::drain::holders::Holder;
use crate::drain::record::{Drain, DrainRecord, DrainState};
use crate::health::Now;
use crate::health::answer::{Answer, DrainAnswer, ProbeAnswer, ProbeState, json_line};
use crate::health::hold;
use crate::health::verdict::Verdict;
use crate::health::weight::{FLOOR, Rejoin, WeightCause};
use crate::puppet::pool::Load;
use crate::puppet::report::{ProbeOutcome, ProbeReport};
use crate::settings::duration::format_duration;

const RUNNING: &str = "Puppet Server is running";

/// The state a drain that holds nothing now is decided with: a held drain
/// ([`crate::health::hold`]), or a stop's hold once Puppet Server started again.
pub static NOT_DRAINED: DrainState = DrainState::NotDrained;
const NO_PROBE_YET: &str = "no probe of Puppet Server has finished yet";
/// How an UNKNOWN for an unreadable drain record begins: `status` finds its drain line in it.
pub const DRAIN_UNKNOWN: &str = "cannot tell whether this node is drained: ";

/// The daemon's settings that shape an answer.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// Past this age a probe report no longer counts (the prober must be stuck).
    pub stale_after: Duration,
    /// The HTTP status of a drained answer: 503, or 404 for `http-check disable-on-404`.
    pub drained_status: u16,
    /// How long a node that came back takes to ramp its weight up.
    pub slow_start: Duration,
    /// The daemon answers HAProxy's agent check (`--agent-listen`): without it no weight is sent.
    pub agent_check: bool,
}

impl Rules {
    /// For one-off answers (`check`, `inetd`): no report goes stale, drains are 503, no ramp.
    pub const ONCE: Rules = Rules {
        stale_after: Duration::MAX,
        drained_status: 503,
        slow_start: Duration::ZERO,
        agent_check: false,
    };
}

/// A verdict with its reason and everything it was decided from.
#[derive(Debug, Clone)]
pub struct Decision<'a> {
    /// What HAProxy is told.
    pub verdict: Verdict,
    /// The HTTP status: 200 for OK, the drained status for DRAINED, 503 otherwise.
    pub status: u16,
    /// The agent-check weight in percent ([`crate::health::weight`]).
    pub weight: u8,
    /// Why the weight is what it is.
    pub weight_cause: WeightCause,
    /// Why, in one line.
    pub reason: Cow<'a, str>,
    /// The drain state it was decided from.
    pub drain: &'a DrainState,
    /// The probe report it was decided from, if any has finished.
    pub probe: Option<&'a ProbeReport>,
    /// How old the probe report is.
    pub age: Option<Duration>,
}

impl<'a> Decision<'a> {
    /// Applies the rules; `rejoin` says where the node stands on its way back, for the weight.
    pub fn decide(
        drain: &'a DrainState,
        probe: Option<&'a ProbeReport>,
        rejoin: Rejoin,
        now: Now,
        rules: &Rules,
    ) -> Self {
        // A record whose every holder lapsed or is a stop's that Puppet Server has started
        // after holds nothing: the node returns on this fresh answer.
        let drain = match drain {
            DrainState::Drained(d)
                if d.record.as_ref().is_some_and(|r| {
                    hold::live(r.holders(), started(probe), now.wall)
                        .next()
                        .is_none()
                }) =>
            {
                &NOT_DRAINED
            }
            drain => drain,
        };
        let age = probe.map(|p| now.at.saturating_duration_since(p.finished));
        let outcome = probe.map(|p| (&p.outcome, p.detail()));
        // Puppet Server's side, for the reasons that also mention the drain.
        let puppet = || -> Cow<'a, str> {
            match outcome {
                Some((ProbeOutcome::Healthy(None), _)) => RUNNING.into(),
                Some((ProbeOutcome::Healthy(Some(_)), detail)) => detail.into(),
                Some((ProbeOutcome::NotReady(_), detail)) => {
                    format!("Puppet Server is not ready: {detail}").into()
                }
                Some((ProbeOutcome::CannotTell(_), detail)) => {
                    format!("Puppet Server's health is unknown: {detail}").into()
                }
                Some((ProbeOutcome::Unhealthy(_), detail)) => {
                    format!("Puppet Server is down: {detail}").into()
                }
                None => NO_PROBE_YET.into(),
            }
        };
        // The common answers borrow their reason: a poll allocates little more than its body.
        let (verdict, reason): (Verdict, Cow<'a, str>) = match (drain, outcome, age) {
            (DrainState::Unknown(why), _, _) => {
                (Verdict::Unknown, format!("{DRAIN_UNKNOWN}{why}").into())
            }
            (DrainState::Drained(d), _, _) => (
                Verdict::Drained,
                format!("{}; {}", d.summary(now.wall), puppet()).into(),
            ),
            (_, None, _) => (Verdict::Starting, NO_PROBE_YET.into()),
            (_, Some(_), Some(age)) if age > rules.stale_after => (
                Verdict::Unknown,
                format!(
                    "the latest probe of Puppet Server is {} old (limit {}): the prober is stuck",
                    format_duration(Duration::from_millis(age.as_millis() as u64)),
                    format_duration(rules.stale_after)
                )
                .into(),
            ),
            (_, Some((ProbeOutcome::CannotTell(_), detail)), _) => (
                Verdict::Unknown,
                format!("cannot probe Puppet Server: {detail}").into(),
            ),
            (_, Some((ProbeOutcome::Unhealthy(_), detail)), _) => (Verdict::Down, detail.into()),
            (_, Some((ProbeOutcome::NotReady(_), detail)), _) => (Verdict::NotReady, detail.into()),
            (DrainState::Expired(d), _, _) => (
                Verdict::Ok,
                format!("{}; drain expired: {}", puppet(), d.describe()).into(),
            ),
            _ => (Verdict::Ok, puppet()),
        };
        let status = match verdict {
            Verdict::Drained => rules.drained_status,
            other => other.status(),
        };
        let pool = probe.and_then(|p| p.pool.as_ref());
        // A pause asks for the floor: every paused master sits there, so load stays spread.
        let paused = matches!(
            probe.map(|p| &p.outcome),
            Some(ProbeOutcome::Healthy(Some(Load::Paused)))
        );
        let (weight, weight_cause) = if paused {
            (FLOOR, WeightCause::Paused)
        } else {
            rejoin.weigh(verdict, pool, now.at, rules.slow_start)
        };
        Self {
            verdict,
            status,
            weight,
            weight_cause,
            reason,
            drain,
            probe,
            age,
        }
    }

    /// The holders of `drain` that hold the node at `now` ([`hold::live`]).
    pub fn holders<'d>(
        &self,
        drain: &'d Drain,
        now: SystemTime,
    ) -> impl Iterator<Item = &'d Holder> {
        let holders = drain.record.as_ref().map_or(&[][..], DrainRecord::holders);
        hold::live(holders, started(self.probe), now)
    }

    /// Whether `body` is this decision's [`Self::text`], byte for byte (one format, kept here):
    /// a kept-alive connection sends its last answer again while this holds.
    pub fn is_text(&self, body: &[u8]) -> bool {
        let verdict = self.verdict.as_str().as_bytes();
        let reason = self.reason.as_bytes();
        body.len() == verdict.len() + 3 + reason.len() + 1
            && body.starts_with(verdict)
            && body[verdict.len()..].starts_with(b" - ")
            && body[verdict.len() + 3..body.len() - 1] == *reason
            && body.ends_with(b"\n")
    }

    /// The one-line body for people and curl.
    pub fn text(&self) -> String {
        let verdict = self.verdict.as_str();
        let mut body = String::with_capacity(verdict.len() + 3 + self.reason.len() + 1);
        body.push_str(verdict);
        body.push_str(" - ");
        body.push_str(&self.reason);
        body.push('\n');
        body
    }

    /// The answer, borrowing from this decision.
    pub fn answer(&self) -> Answer<'_> {
        let drain = |d: &'a Drain, expired: bool| {
            let record = d.record.as_ref();
            DrainAnswer {
                reason: (record.map(|r| r.reason()).or(d.note())).map(Cow::Borrowed),
                by: record.map(|r| r.by().into()),
                since: record.map(|r| r.since().as_str().into()),
                until: record.and_then(|r| r.until()).map(|u| u.as_str().into()),
                expired,
                problem: d.problem.as_ref().map(|p| Cow::Owned(p.to_string())),
            }
        };
        Answer {
            verdict: self.verdict,
            status: self.status,
            reason: Cow::Borrowed(&self.reason),
            drain: match self.drain {
                DrainState::Drained(d) => Some(drain(d, false)),
                DrainState::Expired(d) => Some(drain(d, true)),
                DrainState::NotDrained | DrainState::Unknown(_) => None,
            },
            weight: self.weight,
            weight_cause: self.weight_cause,
            load: match self.probe.map(|p| &p.outcome) {
                Some(ProbeOutcome::Healthy(load)) => *load,
                _ => None,
            },
            pool: self.probe.and_then(|p| p.pool.as_ref()).map(Cow::Borrowed),
            probe: match self.probe {
                Some(p) => ProbeAnswer {
                    ok: p.outcome.is_healthy(),
                    outcome: match &p.outcome {
                        ProbeOutcome::Healthy(_) => ProbeState::Healthy,
                        ProbeOutcome::NotReady(_) => ProbeState::NotReady,
                        ProbeOutcome::Unhealthy(_) => ProbeState::Unhealthy,
                        ProbeOutcome::CannotTell(_) => ProbeState::CannotTell,
                    },
                    detail: p.detail().into(),
                    latency_ms: Some(p.latency.as_millis() as u64),
                    age_ms: self.age.map(|a| a.as_millis() as u64),
                    endpoint: p.endpoint.as_deref().map(Cow::from),
                    // Puppet Server's word: a time humantime cannot write is left out.
                    started: (p.started).and_then(|t| {
                        crate::puppet::timestamp::write(t, humantime::format_rfc3339_millis)
                    }),
                },
                None => ProbeAnswer {
                    detail: "no probe has finished yet".into(),
                    ..ProbeAnswer::default()
                },
            },
        }
    }

    /// The JSON body for `Accept: application/json` and `pmcheck status`.
    pub fn json(&self) -> String {
        json_line(&self.answer())
    }
}

/// When the Puppet Server that the latest probe found healthy started, when known.
fn started(probe: Option<&ProbeReport>) -> Option<SystemTime> {
    probe.filter(|p| p.outcome.is_healthy())?.started
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::record::DrainRecord;
    use crate::drain::tenure::{Stamp, Tenure};
    use crate::puppet::identity::IdentityError;
    use crate::puppet::probe_error::ProbeError;
    use std::time::{Instant, SystemTime};

    /// A moment whose monotonic part the test chose.
    fn at(at: Instant) -> Now {
        Now {
            at,
            wall: SystemTime::now(),
        }
    }

    const STALE: Duration = Duration::from_secs(5);
    const RULES: Rules = Rules {
        stale_after: STALE,
        ..Rules::ONCE
    };

    fn report(outcome: ProbeOutcome, finished: Instant) -> ProbeReport {
        let mut report = ProbeReport::new(
            outcome,
            Duration::from_millis(12),
            Some("https://node:8140/status/v1/simple/server".into()),
        );
        report.finished = finished;
        report
    }

    fn healthy(finished: Instant) -> ProbeReport {
        report(ProbeOutcome::Healthy(None), finished)
    }

    fn refused(finished: Instant) -> ProbeReport {
        let addr = "127.0.0.1:8140".parse().unwrap();
        report(
            ProbeOutcome::Unhealthy(ProbeError::Refused { addr }),
            finished,
        )
    }

    fn drained(until: Option<&str>) -> Drain {
        drained_by(Holder {
            tenure: Tenure {
                by: "alice".into(),
                since: Stamp::read("2026-11-22T10:00:00Z"),
                until: until.map(Stamp::read),
            },
            ..Holder::drain("upgrading".into(), None, SystemTime::now())
        })
    }

    fn drained_by(holder: Holder) -> Drain {
        let record = DrainRecord::held_by(vec![holder]).unwrap();
        let text = serde_json::to_string(&record).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("drain"), text).unwrap();
        match crate::drain::file::DrainFile::new(dir.path()).state(SystemTime::now()) {
            DrainState::Drained(d) | DrainState::Expired(d) => d,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn healthy_and_undrained_is_the_only_200() {
        let now = Instant::now();
        let ok = healthy(now);
        let v = Decision::decide(
            &DrainState::NotDrained,
            Some(&ok),
            Rejoin::Steady,
            at(now),
            &RULES,
        );
        assert_eq!((v.verdict, v.verdict.status()), (Verdict::Ok, 200));
        assert_eq!(v.text(), "OK - Puppet Server is running\n");
    }

    #[test]
    fn busy_is_still_200_and_not_ready_is_503() {
        use crate::puppet::pool::{Load, Unready};
        let now = Instant::now();
        let busy = report(ProbeOutcome::Healthy(Some(Load::Busy)), now);
        let v = Decision::decide(
            &DrainState::NotDrained,
            Some(&busy),
            Rejoin::Steady,
            at(now),
            &RULES,
        );
        assert_eq!((v.verdict, v.status), (Verdict::Ok, 200));
        let locked = report(ProbeOutcome::NotReady(Unready::Locked { since: None }), now);
        let v = Decision::decide(
            &DrainState::NotDrained,
            Some(&locked),
            Rejoin::Steady,
            at(now),
            &RULES,
        );
        assert_eq!(
            (v.verdict, v.status, v.weight),
            (Verdict::NotReady, 503, 10)
        );
        assert!(
            v.text()
                .starts_with("NOTREADY - Puppet Server's JRuby pool is locked")
        );
        let drained = DrainState::Drained(drained(None));
        let rules = Rules {
            drained_status: 404,
            ..RULES
        };
        let v = Decision::decide(&drained, Some(&locked), Rejoin::Steady, at(now), &rules);
        assert_eq!((v.verdict, v.status), (Verdict::Drained, 404));
        assert!(v.reason.ends_with("; Puppet Server is not ready: Puppet Server's JRuby pool is locked: nothing compiles"), "{}", v.reason);
    }

    #[test]
    fn no_probe_yet_is_starting() {
        let v = Decision::decide(
            &DrainState::NotDrained,
            None,
            Rejoin::Steady,
            at(Instant::now()),
            &RULES,
        );
        assert_eq!((v.verdict, v.verdict.status()), (Verdict::Starting, 503));
    }

    #[test]
    fn failed_probe_is_down_with_its_detail() {
        let now = Instant::now();
        let bad = refused(now);
        let v = Decision::decide(
            &DrainState::NotDrained,
            Some(&bad),
            Rejoin::Steady,
            at(now),
            &RULES,
        );
        assert_eq!(v.verdict, Verdict::Down);
        assert!(
            v.text()
                .starts_with("DOWN - connection to 127.0.0.1:8140 refused"),
            "{}",
            v.text()
        );
    }

    #[test]
    fn a_probe_that_could_not_be_made_is_unknown_not_down() {
        let now = Instant::now();
        let unreadable = IdentityError::Read {
            setting: "hostprivkey",
            path: "/k.pem".into(),
            source: std::io::ErrorKind::PermissionDenied.into(),
        };
        let report = report(ProbeOutcome::CannotTell(unreadable.into()), now);
        let v = Decision::decide(
            &DrainState::NotDrained,
            Some(&report),
            Rejoin::Steady,
            at(now),
            &RULES,
        );
        assert_eq!((v.verdict, v.verdict.status()), (Verdict::Unknown, 503));
        assert_eq!(
            v.reason,
            "cannot probe Puppet Server: cannot read hostprivkey /k.pem: permission denied (run \
             pmcheck as a user that may read it, such as a member of group puppet)"
        );
    }

    #[test]
    fn stale_probe_is_unknown() {
        let then = Instant::now();
        let ok = healthy(then);
        let v = Decision::decide(
            &DrainState::NotDrained,
            Some(&ok),
            Rejoin::Steady,
            at(then + STALE + Duration::from_millis(1)),
            &RULES,
        );
        assert_eq!(v.verdict, Verdict::Unknown);
        assert!(v.reason.contains("old"), "{}", v.reason);
        let v = Decision::decide(
            &DrainState::NotDrained,
            Some(&ok),
            Rejoin::Steady,
            at(then + STALE),
            &RULES,
        );
        assert_eq!(v.verdict, Verdict::Ok, "exactly at the limit still counts");
    }

    #[test]
    fn drain_beats_health_and_says_who_why_and_since_when() {
        let now = Instant::now();
        let ok = healthy(now);
        let state = DrainState::Drained(drained(None));
        let v = Decision::decide(&state, Some(&ok), Rejoin::Steady, at(now), &RULES);
        assert_eq!(v.verdict, Verdict::Drained);
        let text = v.text();
        assert!(
            text.starts_with("DRAINED - upgrading (by alice 2026-11-22T10:00Z)"),
            "{text}"
        );
        assert!(text.contains("Puppet Server is running"), "{text}");
        let answer = Answer::from_json(&v.json()).unwrap();
        assert_eq!(answer.verdict, Verdict::Drained);
        assert_eq!(answer.drain.unwrap().by.as_deref(), Some("alice"));
        assert!(answer.probe.ok);
    }

    #[test]
    fn unreadable_drain_state_fails_closed_even_when_healthy() {
        let now = Instant::now();
        let ok = healthy(now);
        let state = DrainState::Unknown(crate::drain::record::Unreadable::Read {
            path: "/x/drain".into(),
            source: std::sync::Arc::new(std::io::ErrorKind::PermissionDenied.into()),
        });
        let v = Decision::decide(&state, Some(&ok), Rejoin::Steady, at(now), &RULES);
        assert_eq!((v.verdict, v.verdict.status()), (Verdict::Unknown, 503));
        assert!(v.reason.contains("/x/drain"), "{}", v.reason);
    }

    #[test]
    fn expired_drain_no_longer_counts_but_is_mentioned() {
        let now = Instant::now();
        let ok = healthy(now);
        let state = DrainState::Expired(drained(Some("2026-11-22T10:30:00Z")));
        let v = Decision::decide(&state, Some(&ok), Rejoin::Steady, at(now), &RULES);
        assert_eq!(v.verdict, Verdict::Ok);
        assert!(v.reason.contains("drain expired"), "{}", v.reason);
        let answer = Answer::from_json(&v.json()).unwrap();
        assert!(answer.drain.unwrap().expired);
    }

    #[test]
    fn json_has_the_promised_fields() {
        let now = Instant::now();
        let ok = healthy(now);
        let v = Decision::decide(
            &DrainState::NotDrained,
            Some(&ok),
            Rejoin::Steady,
            at(now + Duration::from_millis(250)),
            &RULES,
        );
        // The wire format, byte for byte: scripts and monitoring read these names.
        let json = v.json();
        assert_eq!(
            json,
            "{\"verdict\":\"OK\",\"status\":200,\"reason\":\"Puppet Server is running\",\
             \"drain\":null,\"probe\":{\"ok\":true,\"outcome\":\"healthy\",\"detail\":\"running\",\"latency_ms\":12,\
             \"age_ms\":250,\"endpoint\":\"https://node:8140/status/v1/simple/server\"},\
             \"weight\":100,\"weight_cause\":{\"cause\":\"full\"},\"load\":null,\"pool\":null}\n"
        );
        assert_eq!(Answer::from_json(&json).unwrap(), v.answer());
    }
}
