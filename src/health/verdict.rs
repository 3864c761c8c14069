//! The verdict: what HAProxy is told, decided from the drain record and the latest probe.
//!
//! The rules, in order: a drain state that cannot be read is UNKNOWN (fail closed); a drain is
//! DRAINED; no finished probe yet is STARTING (never healthy before a real check); a probe too
//! old to trust is UNKNOWN; a failed probe is DOWN; otherwise OK. Only OK answers 200.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::health::drain::{Drain, DrainState};
use crate::puppet::probe::ProbeReport;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Word {
    Ok,
    Drained,
    Down,
    Starting,
    Unknown,
}

impl Word {
    pub fn as_str(self) -> &'static str {
        match self {
            Word::Ok => "OK",
            Word::Drained => "DRAINED",
            Word::Down => "DOWN",
            Word::Starting => "STARTING",
            Word::Unknown => "UNKNOWN",
        }
    }

    /// The HTTP status HAProxy acts on.
    pub fn status(self) -> u16 {
        if self == Word::Ok { 200 } else { 503 }
    }

    /// The status line's reason phrase, which HAProxy shows in its check info.
    pub fn reason_phrase(self) -> &'static str {
        match self {
            Word::Ok => "OK",
            Word::Drained => "Drained",
            Word::Down => "Puppet Server Down",
            Word::Starting => "Starting",
            Word::Unknown => "Health Unknown",
        }
    }
}

const RUNNING: &str = "Puppet Server is running";
const NO_PROBE_YET: &str = "no probe of Puppet Server has finished yet";

/// A decision with everything it was made from.
#[derive(Debug, Clone)]
pub struct Verdict<'a> {
    pub word: Word,
    pub reason: Cow<'a, str>,
    pub drain: &'a DrainState,
    pub probe: Option<&'a ProbeReport>,
    /// How old the probe report is.
    pub age: Option<Duration>,
}

impl<'a> Verdict<'a> {
    /// Applies the rules. `stale_after` is the age past which a probe report no longer counts.
    pub fn decide(
        drain: &'a DrainState,
        probe: Option<&'a ProbeReport>,
        now: Instant,
        stale_after: Duration,
    ) -> Self {
        let age = probe.map(|p| now.saturating_duration_since(p.finished));
        // Puppet Server's side, for the reasons that also mention the drain.
        let puppet = || -> Cow<'a, str> {
            match probe {
                Some(p) if p.ok => RUNNING.into(),
                Some(p) if p.inconclusive => {
                    format!("Puppet Server's health is unknown: {}", p.detail).into()
                }
                Some(p) => format!("Puppet Server is down: {}", p.detail).into(),
                None => NO_PROBE_YET.into(),
            }
        };
        // The common answers borrow their reason: a poll allocates little more than its body.
        let (word, reason): (Word, Cow<'a, str>) = match (drain, probe, age) {
            (DrainState::Unknown(why), _, _) => (
                Word::Unknown,
                format!("cannot tell whether this node is drained: {why}").into(),
            ),
            (DrainState::Drained(d), _, _) => (
                Word::Drained,
                format!("{}; {}", d.describe(), puppet()).into(),
            ),
            (_, None, _) => (Word::Starting, NO_PROBE_YET.into()),
            (_, Some(_), Some(age)) if age > stale_after => (
                Word::Unknown,
                format!(
                    "the latest probe of Puppet Server is {} old (limit {}): the prober is stuck",
                    crate::cli::format_duration(Duration::from_millis(age.as_millis() as u64)),
                    crate::cli::format_duration(stale_after)
                )
                .into(),
            ),
            (_, Some(p), _) if p.inconclusive => (
                Word::Unknown,
                format!("cannot probe Puppet Server: {}", p.detail).into(),
            ),
            (_, Some(p), _) if !p.ok => (Word::Down, p.detail.as_str().into()),
            (DrainState::Expired(d), _, _) => (
                Word::Ok,
                format!("{RUNNING}; drain expired: {}", d.describe()).into(),
            ),
            _ => (Word::Ok, RUNNING.into()),
        };
        Self {
            word,
            reason,
            drain,
            probe,
            age,
        }
    }

    /// The one-line body for people and curl.
    pub fn text(&self) -> String {
        let mut body = String::with_capacity(self.word.as_str().len() + self.reason.len() + 4);
        let _ = writeln!(body, "{} - {}", self.word.as_str(), self.reason);
        body
    }

    /// The JSON body for `Accept: application/json` and `pmcheck status`.
    pub fn json(&self) -> String {
        #[derive(Serialize)]
        struct Body<'b> {
            verdict: Word,
            status: u16,
            reason: &'b str,
            drain: Option<DrainJson<'b>>,
            probe: ProbeJson<'b>,
        }
        #[derive(Serialize)]
        struct DrainJson<'b> {
            reason: Option<&'b str>,
            by: Option<&'b str>,
            since: Option<&'b str>,
            until: Option<&'b str>,
            expired: bool,
            problem: Option<&'b str>,
        }
        #[derive(Serialize)]
        struct ProbeJson<'b> {
            ok: bool,
            detail: &'b str,
            latency_ms: Option<u64>,
            age_ms: Option<u64>,
            endpoint: Option<&'b str>,
        }
        let drain_json = |d: &'a Drain, expired: bool| DrainJson {
            reason: d.record.as_ref().map(|r| r.reason.as_str()),
            by: d.record.as_ref().map(|r| r.by.as_str()),
            since: d.record.as_ref().map(|r| r.since.as_str()),
            until: d.record.as_ref().and_then(|r| r.until.as_deref()),
            expired,
            problem: d.problem.as_deref(),
        };
        let body = Body {
            verdict: self.word,
            status: self.word.status(),
            reason: &self.reason,
            drain: match self.drain {
                DrainState::Drained(d) => Some(drain_json(d, false)),
                DrainState::Expired(d) => Some(drain_json(d, true)),
                DrainState::NotDrained | DrainState::Unknown(_) => None,
            },
            probe: match self.probe {
                Some(p) => ProbeJson {
                    ok: p.ok,
                    detail: &p.detail,
                    latency_ms: Some(p.latency.as_millis() as u64),
                    age_ms: self.age.map(|a| a.as_millis() as u64),
                    endpoint: Some(&p.endpoint),
                },
                None => ProbeJson {
                    ok: false,
                    detail: "no probe has finished yet",
                    latency_ms: None,
                    age_ms: None,
                    endpoint: None,
                },
            },
        };
        let mut json = serde_json::to_string(&body).unwrap_or_else(|e| {
            format!(r#"{{"verdict":"UNKNOWN","status":503,"reason":"cannot render JSON: {e}"}}"#)
        });
        json.push('\n');
        json
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::drain::DrainRecord;
    use std::time::SystemTime;

    const STALE: Duration = Duration::from_secs(5);

    fn report(ok: bool, finished: Instant) -> ProbeReport {
        ProbeReport {
            ok,
            inconclusive: false,
            detail: if ok {
                "running".into()
            } else {
                "connection to 127.0.0.1:8140 refused".into()
            },
            latency: Duration::from_millis(12),
            finished,
            endpoint: "https://node:8140/status/v1/simple/server".into(),
        }
    }

    fn drained(until: Option<&str>) -> Drain {
        let record = DrainRecord {
            reason: "upgrading".into(),
            by: "alice".into(),
            since: "2026-11-22T10:00:00Z".into(),
            until: until.map(str::to_owned),
        };
        let text = serde_json::to_string(&record).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("drain"), text).unwrap();
        match crate::health::drain::DrainFile::new(dir.path()).state(SystemTime::now()) {
            DrainState::Drained(d) | DrainState::Expired(d) => d,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn healthy_and_undrained_is_the_only_200() {
        let now = Instant::now();
        let ok = report(true, now);
        let v = Verdict::decide(&DrainState::NotDrained, Some(&ok), now, STALE);
        assert_eq!((v.word, v.word.status()), (Word::Ok, 200));
        assert_eq!(v.text(), "OK - Puppet Server is running\n");
    }

    #[test]
    fn no_probe_yet_is_starting() {
        let v = Verdict::decide(&DrainState::NotDrained, None, Instant::now(), STALE);
        assert_eq!((v.word, v.word.status()), (Word::Starting, 503));
    }

    #[test]
    fn failed_probe_is_down_with_its_detail() {
        let now = Instant::now();
        let bad = report(false, now);
        let v = Verdict::decide(&DrainState::NotDrained, Some(&bad), now, STALE);
        assert_eq!(v.word, Word::Down);
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
        let mut report = report(false, now);
        report.inconclusive = true;
        report.detail = "cannot read hostprivkey /k.pem: Permission denied".into();
        let v = Verdict::decide(&DrainState::NotDrained, Some(&report), now, STALE);
        assert_eq!((v.word, v.word.status()), (Word::Unknown, 503));
        assert_eq!(
            v.reason,
            "cannot probe Puppet Server: cannot read hostprivkey /k.pem: Permission denied"
        );
    }

    #[test]
    fn stale_probe_is_unknown() {
        let then = Instant::now();
        let ok = report(true, then);
        let v = Verdict::decide(
            &DrainState::NotDrained,
            Some(&ok),
            then + STALE + Duration::from_millis(1),
            STALE,
        );
        assert_eq!(v.word, Word::Unknown);
        assert!(v.reason.contains("old"), "{}", v.reason);
        let v = Verdict::decide(&DrainState::NotDrained, Some(&ok), then + STALE, STALE);
        assert_eq!(v.word, Word::Ok, "exactly at the limit still counts");
    }

    #[test]
    fn drain_beats_health_and_says_who_why_and_since_when() {
        let now = Instant::now();
        let ok = report(true, now);
        let state = DrainState::Drained(drained(None));
        let v = Verdict::decide(&state, Some(&ok), now, STALE);
        assert_eq!(v.word, Word::Drained);
        let text = v.text();
        assert!(
            text.starts_with("DRAINED - upgrading (by alice since 2026-11-22T10:00:00Z)"),
            "{text}"
        );
        assert!(text.contains("Puppet Server is running"), "{text}");
        let json: serde_json::Value = serde_json::from_str(&v.json()).unwrap();
        assert_eq!(json["verdict"], "DRAINED");
        assert_eq!(json["drain"]["by"], "alice");
        assert_eq!(json["probe"]["ok"], true);
    }

    #[test]
    fn unreadable_drain_state_fails_closed_even_when_healthy() {
        let now = Instant::now();
        let ok = report(true, now);
        let state = DrainState::Unknown(crate::health::drain::Unreadable::Read {
            path: "/x/drain".into(),
            source: std::sync::Arc::new(std::io::ErrorKind::PermissionDenied.into()),
        });
        let v = Verdict::decide(&state, Some(&ok), now, STALE);
        assert_eq!((v.word, v.word.status()), (Word::Unknown, 503));
        assert!(v.reason.contains("/x/drain"), "{}", v.reason);
    }

    #[test]
    fn expired_drain_no_longer_counts_but_is_mentioned() {
        let now = Instant::now();
        let ok = report(true, now);
        let state = DrainState::Expired(drained(Some("2026-11-22T10:30:00Z")));
        let v = Verdict::decide(&state, Some(&ok), now, STALE);
        assert_eq!(v.word, Word::Ok);
        assert!(v.reason.contains("drain expired"), "{}", v.reason);
        let json: serde_json::Value = serde_json::from_str(&v.json()).unwrap();
        assert_eq!(json["drain"]["expired"], true);
    }

    #[test]
    fn json_has_the_promised_fields() {
        let now = Instant::now();
        let ok = report(true, now);
        let v = Verdict::decide(
            &DrainState::NotDrained,
            Some(&ok),
            now + Duration::from_millis(250),
            STALE,
        );
        let json: serde_json::Value = serde_json::from_str(&v.json()).unwrap();
        assert_eq!(json["verdict"], "OK");
        assert_eq!(json["drain"], serde_json::Value::Null);
        assert_eq!(json["probe"]["latency_ms"], 12);
        assert_eq!(json["probe"]["age_ms"], 250);
        assert_eq!(
            json["probe"]["endpoint"],
            "https://node:8140/status/v1/simple/server"
        );
    }
}
