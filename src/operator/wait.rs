//! `drain --wait`, `undrain --wait` and the waits of `cycle`: ask the running daemon a few times
//! a second until what it reports says the goal is reached.
//!
//! The daemon knows what each load balancer was told ([`crate::responder::pollers`]), the
//! agent connections to Puppet Server ([`crate::puppet::traffic`]) and the JRuby pool; this
//! module only reads its JSON answer, so it needs no privileges and no settings of its own.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{IsTerminal, Write};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::health::answer::{Answer, PollerAnswer, ToldAnswer};
use crate::health::verdict::Verdict;
use crate::operator::status::{self, StatusError};
use crate::puppet::pool::Load;
use crate::settings::duration::format_duration;

/// A poller counts while it keeps its own rhythm: silent for less than three of its intervals
/// between polls, within these bounds. A load balancer checking every 2 s counts until it has
/// been silent 6 s; a one-off curl stops counting 5 s after its poll; none counts after a
/// minute of silence (a load balancer taken out of service, a check turned off).
pub const SILENCE: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(60));
/// How often the daemon is asked.
const EVERY: Duration = Duration::from_millis(250);
/// How often a line is repeated when nothing changes and the output is not a terminal.
const REPEAT: Duration = Duration::from_secs(10);

/// What to wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goal {
    /// Safe to stop Puppet Server: every recent poller has acted on DRAINED, no agent
    /// connection is left and no JRuby instance is borrowed.
    Drained,
    /// Back in rotation: every recent poller has been told OK often enough to act on it.
    Undrained,
    /// Puppet Server can compile again: a probe made after `since` found it running with its
    /// pool full (warm or busy, not warming).
    Healthy {
        /// When the command that restarted it ended.
        since: Instant,
    },
}

/// How to wait.
#[derive(Debug, Clone)]
pub struct Wait {
    /// The daemon's HTTP address.
    pub url: String,
    /// Give up after this long.
    pub timeout: Duration,
    /// How many answers in a row an HTTP-checking poller needs (HAProxy's `fall`/`rise`).
    pub polls: u32,
}

/// Why a wait ended without reaching its goal.
#[derive(Debug, Error)]
pub enum WaitError {
    /// The daemon did not answer the first question.
    #[error("{0}; only the daemon knows what the load balancers were told (--url)")]
    NoDaemon(StatusError),
    /// The goal was not reached in time.
    #[error("gave up after {}: {pending}", format_duration(*.waited))]
    TimedOut {
        /// How long it waited: the timeout.
        waited: Duration,
        /// What was still missing.
        pending: String,
    },
    /// A signal asked to stop.
    #[error("interrupted after {}: {pending}", format_duration(*.waited))]
    Interrupted {
        /// How long it waited.
        waited: Duration,
        /// What was still missing.
        pending: String,
    },
}

/// A goal reached.
#[derive(Debug, Clone)]
pub struct Done {
    /// How long it took.
    pub waited: Duration,
    /// What was reached, for a person.
    pub summary: String,
}

/// What one answer says about a goal: what is still missing, and what is met.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Assessment {
    /// Each thing still missing, for a person; empty when the goal is reached.
    pub pending: Vec<String>,
    /// What is met so far.
    pub met: Vec<String>,
    /// Agent connections seen, for `Drained`.
    pub connections: usize,
    /// The pollers that have acted, for the progress line.
    pub acted: Vec<IpAddr>,
}

/// Asks the daemon until `goal` is reached, `timeout` passes or `stop` resolves, showing
/// progress on stderr (one updating line on a terminal, a line per change otherwise).
pub async fn wait(
    goal: Goal,
    how: &Wait,
    stop: impl Future<Output = ()>,
) -> Result<Done, WaitError> {
    let start = Instant::now();
    let mut ticker = Ticker::new();
    let mut first = true;
    // The agent connections: the most seen at once, and when the last one went.
    let mut traffic: (usize, Option<Duration>) = (0, None);
    tokio::pin!(stop);
    loop {
        let asked = Instant::now();
        let pending = match status::ask(&how.url).await {
            Ok(reply) => match Answer::from_json(&reply.body) {
                Ok(answer) => {
                    let since = match goal {
                        Goal::Healthy { since } => asked.saturating_duration_since(since),
                        _ => Duration::ZERO,
                    };
                    let a = assess(goal, &answer, how.polls, since);
                    let (most, gone) = &mut traffic;
                    if a.connections > 0 {
                        *most = (*most).max(a.connections);
                        *gone = None;
                    } else if *most > 0 && gone.is_none() {
                        *gone = Some(start.elapsed());
                    }
                    if a.pending.is_empty() {
                        ticker.clear();
                        let mut met = a.met;
                        if let (n @ 1.., Some(after)) = traffic {
                            met.push(format!(
                                "up to {n} agent connection(s) in flight, the last closed after {}",
                                seconds(after)
                            ));
                        }
                        return Ok(Done {
                            waited: start.elapsed(),
                            summary: met.join("; "),
                        });
                    }
                    let mut line = a.pending.join("; ");
                    if !a.acted.is_empty() {
                        let acted: Vec<String> = a.acted.iter().map(ToString::to_string).collect();
                        line.push_str(&format!("; acted: {}", acted.join(", ")));
                    }
                    line
                }
                Err(e) => format!("{} does not answer like pmcheck ({e})", how.url),
            },
            Err(e) if first => return Err(WaitError::NoDaemon(e)),
            Err(e) => e.to_string(),
        };
        first = false;
        let waited = start.elapsed();
        ticker.show(waited, &pending);
        if waited >= how.timeout {
            ticker.clear();
            return Err(WaitError::TimedOut {
                waited: how.timeout,
                pending,
            });
        }
        tokio::select! {
            () = tokio::time::sleep(EVERY) => {}
            () = &mut stop => {
                ticker.clear();
                return Err(WaitError::Interrupted { waited: start.elapsed(), pending });
            }
        }
    }
}

/// What `answer` says about `goal`. `since` is how long before the answer the command of a
/// cycle ended (for [`Goal::Healthy`]).
pub fn assess(goal: Goal, answer: &Answer<'_>, polls: u32, since: Duration) -> Assessment {
    let mut a = Assessment::default();
    match goal {
        Goal::Drained => {
            if answer.verdict == Verdict::Drained {
                a.met
                    .push(format!("pmcheck answers DRAINED ({})", answer.status));
            } else {
                a.pending.push(format!(
                    "pmcheck answers {}, not DRAINED yet: {}",
                    answer.verdict.as_str(),
                    answer.reason
                ));
            }
            told(&mut a, answer, Verdict::Drained, polls);
            agent_traffic(&mut a, answer);
        }
        Goal::Undrained => {
            if answer.verdict == Verdict::Ok {
                a.met.push("pmcheck answers OK".to_owned());
            } else {
                a.pending.push(format!(
                    "pmcheck answers {}, not OK: {}",
                    answer.verdict.as_str(),
                    answer.reason
                ));
            }
            told(&mut a, answer, Verdict::Ok, polls);
        }
        Goal::Healthy { .. } => {
            let probe = &answer.probe;
            let fresh = probe
                .age_ms
                .is_some_and(|age| Duration::from_millis(age) < since);
            if !fresh {
                a.pending
                    .push("no probe of Puppet Server since the command ended yet".to_owned());
            } else if !probe.ok {
                a.pending.push(format!("Puppet Server: {}", probe.detail));
            } else if answer.load == Some(Load::Warming) {
                let pool = answer
                    .pool
                    .as_ref()
                    .map(|p| format!(": {} of {} JRubies ready", p.free + p.borrowed, p.size))
                    .unwrap_or_default();
                a.pending
                    .push(format!("Puppet Server's JRuby pool is warming{pool}"));
            } else {
                a.met
                    .push(format!("Puppet Server is healthy: {}", probe.detail));
            }
        }
    }
    a
}

/// Whether each recent poller was told `verdict` often enough to act on it.
///
/// A drain is acted on at one agent-check `drain`, or after `polls` HTTP answers in a row
/// (HAProxy's `fall`). Coming back needs every kind of check a poller makes: its HTTP check
/// must pass `polls` times (`rise`) even when its agent check says `up` at once.
fn told(a: &mut Assessment, answer: &Answer<'_>, verdict: Verdict, polls: u32) {
    let Some(pollers) = &answer.pollers else {
        a.pending.push(
            "the daemon's answer lists no pollers: ask it from this host (--url on a loopback address), or restart an older pmcheck".to_owned(),
        );
        return;
    };
    let mut heard = 0;
    for p in pollers {
        let limit = silence_limit(p);
        if Duration::from_millis(p.last_ms_ago) > limit {
            continue;
        }
        let recent =
            |t: &Option<ToldAnswer>| t.filter(|t| Duration::from_millis(t.last_ms_ago) <= limit);
        heard += 1;
        let (http, agent) = (recent(&p.http), recent(&p.agent));
        let enough = |t: Option<ToldAnswer>, n: u32| {
            t.is_some_and(|t| t.verdict_is(verdict) && t.times >= n)
        };
        let acted = if verdict == Verdict::Drained {
            enough(agent, 1) || enough(http, polls)
        } else {
            (agent.is_none() || enough(agent, 1)) && (http.is_none() || enough(http, polls))
        };
        let what = describe_told(p, false);
        if acted {
            a.met.push(format!("{} acted ({what})", p.address));
            a.acted.push(p.address);
        } else {
            let need = match (verdict, agent.is_some()) {
                (Verdict::Drained, true) => format!("one agent-check or {polls} HTTP answers"),
                _ => format!("{polls} HTTP answers in a row"),
            };
            a.pending.push(format!(
                "{} not told {} enough yet ({what}; needs {need})",
                p.address,
                verdict.as_str()
            ));
        }
    }
    if heard == 0 {
        a.met.push("no load balancer is polling".to_owned());
    }
}

/// How long `p` may be silent and still count as polling: three of its intervals, within
/// [`SILENCE`].
fn silence_limit(p: &PollerAnswer) -> Duration {
    let (least, most) = SILENCE;
    if p.polls < 2 {
        return least;
    }
    let span = Duration::from_millis(p.first_ms_ago.saturating_sub(p.last_ms_ago));
    (3 * span / (p.polls - 1)).clamp(least, most)
}

impl ToldAnswer {
    fn verdict_is(&self, verdict: Verdict) -> bool {
        self.told == verdict
    }
}

/// `HTTP: DRAINED x3, agent: DRAINED x1`, and `, last 0.8s ago` with `when`.
pub fn describe_told(p: &PollerAnswer, when: bool) -> String {
    let mut parts = Vec::new();
    for (kind, told) in [("HTTP", &p.http), ("agent", &p.agent)] {
        if let Some(t) = told {
            parts.push(format!("{kind}: {} x{}", t.told.as_str(), t.times));
        }
    }
    if when {
        parts.push(format!(
            "last {} ago",
            seconds(Duration::from_millis(p.last_ms_ago))
        ));
    }
    parts.join(", ")
}

/// The agent connections and borrowed JRubies of a drained node.
fn agent_traffic(a: &mut Assessment, answer: &Answer<'_>) {
    match &answer.traffic {
        None => a.pending.push(
            "the daemon's answer lists no agent connections: ask it from this host (--url on a loopback address), or restart an older pmcheck"
                .to_owned(),
        ),
        Some(t) if t.problem.is_some() => a.pending.push(format!(
            "cannot see the agent connections: {}",
            t.problem.as_deref().unwrap_or_default()
        )),
        Some(t) if t.connections.is_empty() => {
            a.met.push(format!("no agent connection to {}", t.listener));
        }
        Some(t) => {
            a.connections = t.connections.len();
            let pollers: Vec<IpAddr> = answer.pollers.iter().flatten().map(|p| p.address).collect();
            let mut from: BTreeMap<IpAddr, usize> = BTreeMap::new();
            for c in &t.connections {
                *from.entry(c.ip()).or_default() += 1;
            }
            let from: Vec<String> = from
                .into_iter()
                .map(|(ip, n)| {
                    let who = if pollers.contains(&ip) {
                        "through the load balancer"
                    } else {
                        "not a poller: an agent that bypasses the load balancer?"
                    };
                    format!("{n} from {ip} ({who})")
                })
                .collect();
            a.pending.push(format!(
                "{} agent connection(s) to {}: {}",
                t.connections.len(),
                t.listener,
                from.join(", ")
            ));
        }
    }
    match &answer.pool {
        Some(pool) if answer.probe.ok && pool.borrowed > 0 => a.pending.push(format!(
            "{} JRuby instance(s) borrowed: requests in progress",
            pool.borrowed
        )),
        Some(_) if answer.probe.ok => a.met.push("no JRuby borrowed".to_owned()),
        _ => {}
    }
}

/// `12.3s`.
pub fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Progress on stderr: one line rewritten in place on a terminal, plain lines otherwise (a
/// line when the text changes, and every [`REPEAT`] when it does not).
struct Ticker {
    terminal: bool,
    shown: bool,
    last: String,
    last_at: Option<Instant>,
}

impl Ticker {
    fn new() -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            shown: false,
            last: String::new(),
            last_at: None,
        }
    }

    fn show(&mut self, waited: Duration, pending: &str) {
        let mut err = std::io::stderr().lock();
        let line = format!("waiting {}: {pending}", seconds(waited));
        if self.terminal {
            // The line is rewritten, so keep it to one terminal row.
            let short: String = line.chars().take(200).collect();
            let _ = write!(err, "\r\x1b[2K{short}");
            let _ = err.flush();
            self.shown = true;
        } else if pending != self.last || self.last_at.is_none_or(|t| t.elapsed() >= REPEAT) {
            let _ = writeln!(err, "{line}");
            self.last = pending.to_owned();
            self.last_at = Some(Instant::now());
        }
    }

    fn clear(&mut self) {
        if self.terminal && self.shown {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
            self.shown = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::answer::TrafficAnswer;

    /// A drained node's answer as the daemon sends it to loopback.
    fn drained() -> Answer<'static> {
        Answer::from_json(
            r#"{"verdict":"DRAINED","status":404,"reason":"upgrade (by root since 2026-11-23T08:00:00Z); Puppet Server is running","drain":null,
                "probe":{"ok":true,"detail":"running","latency_ms":3,"age_ms":200,"endpoint":null},
                "weight":10,"load":"warm","pool":{"size":2,"free":2,"borrowed":0,"waiting":0,"average_free":2.0,"average_wait_ms":0,"average_borrow_ms":0,"queue_limit_hits":0,"borrow_timeouts":0,"lock":"not-in-use","lock_since":null},
                "pollers":[{"address":"10.0.0.5","first_ms_ago":90000,"last_ms_ago":500,"polls":90,
                            "http":{"told":"DRAINED","times":3,"last_ms_ago":500},
                            "agent":{"told":"DRAINED","times":1,"last_ms_ago":1500}}],
                "traffic":{"listener":"127.0.0.1:8140","connections":[],"problem":null}}"#,
        )
        .expect("a valid answer")
    }

    fn poller<'a>(answer: &'a mut Answer<'static>) -> &'a mut PollerAnswer {
        &mut answer.pollers.as_mut().unwrap()[0]
    }

    #[test]
    fn a_drain_is_safe_once_told_and_quiet() {
        let a = assess(Goal::Drained, &drained(), 3, Duration::ZERO);
        assert_eq!(a.pending, Vec::<String>::new());
        assert!(
            a.met.iter().any(|m| m.starts_with("10.0.0.5 acted")),
            "{:?}",
            a.met
        );
    }

    #[test]
    fn one_agent_drain_suffices_but_http_alone_needs_the_polls() {
        let mut answer = drained();
        poller(&mut answer).http = Some(ToldAnswer {
            told: Verdict::Drained,
            times: 1,
            last_ms_ago: 100,
        });
        assert!(
            assess(Goal::Drained, &answer, 3, Duration::ZERO)
                .pending
                .is_empty()
        );
        poller(&mut answer).agent = None;
        let a = assess(Goal::Drained, &answer, 3, Duration::ZERO);
        assert_eq!(a.pending.len(), 1, "{:?}", a.pending);
        assert!(a.pending[0].contains("10.0.0.5 not told DRAINED enough yet (HTTP: DRAINED x1;"));
        assert!(
            a.pending[0].contains("needs 3 HTTP answers in a row"),
            "{}",
            a.pending[0]
        );
        // An agent answer that is not recent does not count.
        poller(&mut answer).agent = Some(ToldAnswer {
            told: Verdict::Drained,
            times: 5,
            last_ms_ago: 7_000,
        });
        assert_eq!(
            assess(Goal::Drained, &answer, 3, Duration::ZERO)
                .pending
                .len(),
            1
        );
    }

    #[test]
    fn pollers_that_fell_silent_are_not_waited_for() {
        let mut answer = drained();
        let p = poller(&mut answer);
        // Every second for 90 s: it counts until it has been silent for 3 s... at least 5 s.
        p.http = Some(ToldAnswer {
            told: Verdict::Ok,
            times: 9,
            last_ms_ago: 4_000,
        });
        p.agent = None;
        p.last_ms_ago = 4_000;
        assert_eq!(silence_limit(p), SILENCE.0);
        assert_eq!(
            assess(Goal::Drained, &answer, 3, Duration::ZERO)
                .pending
                .len(),
            1
        );
        let p = poller(&mut answer);
        p.last_ms_ago = 6_000;
        p.http.as_mut().unwrap().last_ms_ago = 6_000;
        let a = assess(Goal::Drained, &answer, 3, Duration::ZERO);
        assert!(a.pending.is_empty(), "{:?}", a.pending);
        assert!(a.met.iter().any(|m| m == "no load balancer is polling"));
        // Every 10 s: it still counts after 20 s of silence, not after 31 s.
        let p = poller(&mut answer);
        (p.first_ms_ago, p.polls, p.last_ms_ago) = (200_000, 19, 20_000);
        assert_eq!(silence_limit(p), Duration::from_secs(30));
        // A one-off poll counts for 5 s; nothing counts after a minute.
        (p.first_ms_ago, p.polls) = (20_000, 1);
        assert_eq!(silence_limit(p), SILENCE.0);
        (p.first_ms_ago, p.polls) = (3_600_000, 10);
        assert_eq!(silence_limit(p), SILENCE.1);
    }

    #[test]
    fn connections_and_borrowed_jrubies_keep_it_waiting_and_say_from_where() {
        let mut answer = drained();
        answer.traffic = Some(TrafficAnswer {
            listener: "127.0.0.1:8140".parse().unwrap(),
            connections: vec![
                "10.0.0.5:40001".parse().unwrap(),
                "10.0.0.5:40002".parse().unwrap(),
                "10.0.9.9:50000".parse().unwrap(),
            ],
            problem: None,
        });
        if let Some(pool) = answer.pool.as_mut() {
            pool.to_mut().borrowed = 1;
        }
        let a = assess(Goal::Drained, &answer, 3, Duration::ZERO);
        assert_eq!(a.connections, 3);
        assert_eq!(
            a.pending,
            [
                "3 agent connection(s) to 127.0.0.1:8140: 2 from 10.0.0.5 (through the load \
                 balancer), 1 from 10.0.9.9 (not a poller: an agent that bypasses the load \
                 balancer?)",
                "1 JRuby instance(s) borrowed: requests in progress"
            ]
        );
    }

    #[test]
    fn unknown_traffic_is_never_safe() {
        let mut answer = drained();
        answer.traffic.as_mut().unwrap().problem = Some("cannot read /proc/self/net/tcp".into());
        let a = assess(Goal::Drained, &answer, 3, Duration::ZERO);
        assert_eq!(
            a.pending,
            ["cannot see the agent connections: cannot read /proc/self/net/tcp"]
        );
        answer.traffic = None;
        assert_eq!(
            assess(Goal::Drained, &answer, 3, Duration::ZERO)
                .pending
                .len(),
            1
        );
    }

    #[test]
    fn an_undrain_needs_every_kind_of_check_told_ok() {
        let mut answer = drained();
        answer.verdict = Verdict::Ok;
        let p = poller(&mut answer);
        p.agent = Some(ToldAnswer {
            told: Verdict::Ok,
            times: 1,
            last_ms_ago: 10,
        });
        p.http = Some(ToldAnswer {
            told: Verdict::Ok,
            times: 2,
            last_ms_ago: 10,
        });
        let a = assess(Goal::Undrained, &answer, 3, Duration::ZERO);
        assert_eq!(a.pending.len(), 1, "{:?}", a.pending);
        poller(&mut answer).http.as_mut().unwrap().times = 3;
        assert!(
            assess(Goal::Undrained, &answer, 3, Duration::ZERO)
                .pending
                .is_empty()
        );
        answer.verdict = Verdict::Drained;
        assert!(
            assess(Goal::Undrained, &answer, 3, Duration::ZERO).pending[0]
                .starts_with("pmcheck answers DRAINED, not OK")
        );
    }

    #[test]
    fn healthy_needs_a_probe_after_the_command_and_a_full_pool() {
        let mut answer = drained();
        // The probe is 200 ms old; the command ended 100 ms ago: that probe is from before.
        let a = assess(
            Goal::Healthy {
                since: Instant::now(),
            },
            &answer,
            3,
            Duration::from_millis(100),
        );
        assert_eq!(
            a.pending,
            ["no probe of Puppet Server since the command ended yet"]
        );
        let since = Duration::from_secs(1);
        let goal = Goal::Healthy {
            since: Instant::now(),
        };
        assert!(assess(goal, &answer, 3, since).pending.is_empty());
        answer.load = Some(Load::Warming);
        if let Some(pool) = answer.pool.as_mut() {
            pool.to_mut().free = 1;
        }
        assert_eq!(
            assess(goal, &answer, 3, since).pending,
            ["Puppet Server's JRuby pool is warming: 1 of 2 JRubies ready"]
        );
        answer.probe.ok = false;
        answer.probe.detail = "connection refused".into();
        assert_eq!(
            assess(goal, &answer, 3, since).pending,
            ["Puppet Server: connection refused"]
        );
    }
}
