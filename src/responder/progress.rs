//! Where a change stands, decided by the daemon for each `/status` ([`crate::protocol::progress`]):
//! which load balancers have acted on a drain or an undrain (by their own word with
//! `http-check send-state`, else by what they were told), where the drain is held, the agent
//! connections and borrowed JRubies left, and whether Puppet Server is healthy again after a
//! restart. Pure: it reads one answer made at one instant, so every rule is tested on answers
//! written by hand.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::Duration;

use crate::health::lb_state::{Health, LbState};
use crate::health::verdict::Verdict;
use crate::protocol::lines::{who, who_with};
use crate::protocol::progress::{Ask, Progress, Stage};
use crate::protocol::{PollerAnswer, StateAnswer, Status, ToldAnswer};
use crate::puppet::pool::Load;
use crate::responder::pollers::REGULAR;
use crate::responder::server_line::SILENCE;
use crate::responder::unproven::{bound, by_time};
use crate::settings::lb_proof::Proof;
use crate::text::{ms, seconds};

/// Where a drain, an undrain and a restart stand in `status`, for `ask`.
pub fn progress(status: &Status<'_>, ask: &Ask) -> Progress {
    let drain = drain(status, ask);
    let undrain = undrain(status, ask);
    Progress {
        polls: ask.polls,
        lb_interval_ms: ms(ask.lb_interval),
        safe_to_stop: drain.met(),
        in_rotation: undrain.met(),
        healthy: healthy(status, ask),
        drain,
        undrain,
    }
}

/// A drain: pmcheck answers DRAINED, nowhere held, every load balancer acted, no agent
/// connection and no borrowed JRuby left.
fn drain(status: &Status<'_>, ask: &Ask) -> Stage {
    let mut a = Stage::default();
    let answer = &status.answer;
    if answer.verdict == Verdict::Drained {
        a.met
            .push(format!("pmcheck answers DRAINED ({})", answer.status));
    } else {
        a.pend(format!(
            "pmcheck answers {}, not DRAINED yet: {}",
            answer.verdict.as_str(),
            answer.reason
        ));
    }
    let held = status.held();
    for blocker in &held {
        a.pend(blocker.line());
    }
    a.held = held;
    told(&mut a, status, Verdict::Drained, ask);
    a.every_poller_acted = a.pending.is_empty();
    agent_traffic(&mut a, status);
    if a.every_poller_acted && a.pending.is_empty() && !settled(&a, status) {
        a.pend("every load balancer has acted: reading the agent connections once more, for one it sent just before".to_owned());
    }
    a
}

/// How long after the latest load balancer acted the agent connections must have been read:
/// one may open an agent's connection here just before it acts, and the kernel's tables show
/// it a moment later.
const SETTLE: Duration = Duration::from_millis(250);

/// The agent connections were read [`SETTLE`] after the latest load balancer acted, so that a
/// connection it opened just before is among them; a read that cannot be dated never is.
fn settled(a: &Stage, status: &Status<'_>) -> bool {
    let read = status.traffic.as_ref().and_then(|t| t.age_ms);
    (a.acted_ms_ago).is_none_or(|acted| {
        read.is_some_and(|age| Duration::from_millis(age) + SETTLE <= Duration::from_millis(acted))
    })
}

/// An undrain: pmcheck answers OK and every load balancer took the node back.
fn undrain(status: &Status<'_>, ask: &Ask) -> Stage {
    let mut a = Stage::default();
    let answer = &status.answer;
    if answer.verdict == Verdict::Ok {
        a.met.push("pmcheck answers OK".to_owned());
    } else {
        a.pend(format!(
            "pmcheck answers {}, not OK: {}",
            answer.verdict.as_str(),
            answer.reason
        ));
    }
    told(&mut a, status, Verdict::Ok, ask);
    a
}

/// A restart: a probe made after its command ended found Puppet Server running with its pool
/// full (warm or busy, not warming).
fn healthy(status: &Status<'_>, ask: &Ask) -> Stage {
    let mut a = Stage::default();
    let answer = &status.answer;
    let probe = &answer.probe;
    let fresh = probe.age_ms.is_some_and(|age| {
        ask.ended
            .is_none_or(|ended| Duration::from_millis(age) < ended)
    });
    let age = Duration::from_millis(probe.age_ms.unwrap_or_default());
    let stale = Duration::from_millis(status.probe_stale_ms);
    if !fresh {
        a.pend("no probe of Puppet Server since the command ended yet".to_owned());
    } else if age > stale {
        a.pend(format!(
            "the latest probe of Puppet Server is {} old, more than two probe rounds ({}): not believed; waiting for a new one",
            seconds(age),
            seconds(stale)
        ));
    } else if !probe.healthy() {
        a.pend(format!("Puppet Server: {}", probe.detail));
    } else if answer.load == Some(Load::Warming) {
        let pool = (answer.pool.as_ref())
            .map(|p| format!(": {} of {} JRubies ready", p.free + p.borrowed, p.size))
            .unwrap_or_default();
        a.pend(format!("Puppet Server's JRuby pool is warming{pool}"));
    } else {
        a.met
            .push(format!("Puppet Server is healthy: {}", probe.detail));
    }
    a
}

/// Whether each load balancer has acted on `verdict`: by its own view where it sends one
/// (`http-check send-state`, [`judge_by_states`]), else by the answers counted ([`by_counts`]);
/// one that proves nothing, by time ([`by_time`]).
///
/// Only pollers that still poll count ([`crate::responder::server_line::polling`]), and of those
/// that prove nothing, only regular ones; a proven one not regular yet, or polls the table had
/// no room for, keep the wait going until they either turn regular or fall silent, so a flood
/// of addresses can delay a wait but never end it early.
fn told(a: &mut Stage, status: &Status<'_>, verdict: Verdict, ask: &Ask) {
    let bound = bound(status);
    let mut heard = 0;
    for p in &status.pollers {
        let silent = Duration::from_millis(p.last_ms_ago);
        if !p.polling {
            // A load balancer that said what it did, and then stopped checking.
            if p.polls >= REGULAR && !p.states.is_empty() && p.proof.proven() {
                a.met.push(format!(
                    "{} stopped checking {} ago (a server in MAINT, which HAProxy does not check, a restart of HAProxy, or a server line removed): not waited for",
                    who(p),
                    seconds(silent)
                ));
            }
            continue;
        }
        if !p.proof.proven() {
            // Its word is not believed, nor is how often it polled: it may be anything on a
            // load balancer's host, or anybody. Only its silence and time count, until every
            // load balancer of the key file proves itself: one that sends no key from another
            // address is then none of them.
            let none_of_them = (bound.as_ref()).is_some_and(|b| {
                b.missing.is_empty() && !b.hosts.contains(&p.address) && p.proof == Proof::NoKey
            });
            match (none_of_them, p.regular) {
                (true, true) => a.met.push(format!(
                    "{} ({}): every address the key file binds proves itself as a load balancer that checks now, and this one is none of them: not waited for",
                    p.address,
                    p.proof.describe()
                )),
                (false, true) => {
                    heard += 1;
                    by_time(a, p, verdict, ask, bound.as_ref());
                }
                _ => {}
            }
            continue;
        }
        heard += 1;
        if !p.regular {
            a.pend_of(Some(p.address), Some(p.last_ms_ago), format!(
                "{} polled {} time(s), the latest {} ago: not known as a load balancer yet (it counts once it polls {REGULAR} times in a row, and is not waited for once silent)",
                p.address,
                p.polls,
                seconds(silent),
            ));
            continue;
        }
        let states: Vec<&StateAnswer> = p.states.iter().filter(|s| s.polling).collect();
        let seen: Vec<(&StateAnswer, &LbState)> = (states.iter())
            .filter_map(|s| s.seen.as_ref().map(|lb| (*s, lb)))
            .collect();
        if !seen.is_empty() {
            judge_by_states(a, p, &seen, verdict);
            continue;
        }
        let malformed = states.iter().find_map(|s| s.malformed.as_deref());
        by_counts(a, p, (p.http, p.agent_now()), malformed, verdict, ask.polls);
    }
    if let Some(u) = status.unrecorded {
        let ago = Duration::from_millis(u.last_ms_ago);
        if ago <= SILENCE.0.max(2 * ask.lb_interval) {
            heard += 1;
            a.pend(format!(
                "{} poll(s) from addresses the daemon's poller table had no room for, the latest {} ago: a load balancer may be among them (list the load balancers in --allow)",
                u.polls,
                seconds(ago)
            ));
        }
    }
    if heard == 0 {
        if !status.heard_all(ask.lb_interval) {
            a.pend(format!(
                "the daemon has listened for only {}: no load balancer has polled yet, waiting {} (two --lb-interval) before believing none polls",
                seconds(status.listened()),
                seconds(2 * ask.lb_interval)
            ));
        } else {
            a.met.push("no load balancer is polling".to_owned());
        }
    }
}

/// The load balancer's own word on this node's server lines (one per backend it is in), for
/// `verdict`: it has acted when every one of them says so. For a drain, that this server takes
/// no new agents (`NOLB`, `DOWN`, or its weight out of the backend's total) and has no session
/// left; for an undrain, `UP` and counted again. Where the weights cannot tell (HAProxy's agent
/// drain leaves the word `UP` and this server's weight; only the total drops), the answer of
/// the agent check for that server line before that header decides: HAProxy applies an agent
/// line as it reads it.
fn judge_by_states(
    a: &mut Stage,
    p: &PollerAnswer,
    seen: &[(&StateAnswer, &LbState)],
    verdict: Verdict,
) {
    let mut lines = Vec::new();
    let mut all = true;
    for &(s, lb) in seen {
        // The agent check of this server line (of the load balancer, when its agent checks
        // name none); its current run of answers began before this header was sent.
        let agent = s.agent.or_else(|| p.agent_now());
        let agent_before = |drained: bool| {
            agent.is_some_and(|t| {
                (t.told == Verdict::Drained) == drained && t.since_ms_ago > s.last_ms_ago
            })
        };
        let says = format!(
            "{} says {} for {}/{} (weight {}/{}, {} session(s), {} queued; {} ago)",
            who_with(p, lb),
            lb.word(),
            lb.backend,
            lb.server,
            lb.weight,
            lb.total_weight,
            lb.scur,
            lb.qcur,
            seconds(Duration::from_millis(s.last_ms_ago))
        );
        // HAProxy writes the header before it reads that check's answer: it shows the effect of
        // `verdict` only once this server line's check before it was answered so.
        let fresh = s.written_after(verdict);
        let before = format!(
            "{says}: that is from before its checks were first answered {}; waiting for the next",
            verdict.as_str()
        );
        let (ok, line) = if verdict == Verdict::Drained {
            if lb.total_weight == 0 {
                a.warnings.push(format!(
                    "{} says backend {} has no server taking new agents now (total weight 0)",
                    who_with(p, lb),
                    lb.backend
                ));
            }
            let serving = matches!(lb.health, Health::Up | Health::NoCheck) && lb.counted();
            // An agent drain applies as HAProxy reads it, before any later header.
            let out = (fresh && !serving) || agent_before(true);
            if s.held.is_some() {
                // Said once, with what ends it, by the hold's own line.
                (false, String::new())
            } else if !out && !fresh {
                (false, before)
            } else if !out {
                (false, format!("{says}: it still sends new agents here"))
            } else if lb.scur > 0 {
                (
                    false,
                    format!("{says}: out for new agents, sessions still open"),
                )
            } else {
                (true, format!("{says}: out, no session left"))
            }
        } else {
            let back = lb.health == Health::Up
                && lb.counted()
                && agent.is_none_or(|_| agent_before(false));
            if !fresh {
                (false, before)
            } else if back {
                (true, format!("{says}: back"))
            } else {
                (false, format!("{says}: not taking new agents here yet"))
            }
        };
        all &= ok;
        lines.push((ok, line));
    }
    if all {
        a.met.extend(lines.into_iter().map(|(_, line)| line));
        // It acted at its line's first answer so (HAProxy acts on an agent's word and on a
        // 404 as it reads them), the latest of its lines.
        let ago = (seen.iter()).map(|(s, _)| s.since_ms_ago).min();
        a.acted_by(p.address, ago.unwrap_or_default());
    } else {
        for (_, line) in lines
            .into_iter()
            .filter(|(ok, line)| !ok && !line.is_empty())
        {
            a.pend_of(Some(p.address), Some(p.last_ms_ago), line);
        }
    }
}

/// A poller whose state header was not seen: it has acted once told `verdict` enough times,
/// one agent-check `drain` or `polls` HTTP answers in a row (HAProxy's `fall`); coming back
/// needs every kind of check it makes.
fn by_counts(
    a: &mut Stage,
    p: &PollerAnswer,
    (http, agent): (Option<ToldAnswer>, Option<ToldAnswer>),
    malformed: Option<&str>,
    verdict: Verdict,
    polls: u32,
) {
    let enough =
        |t: Option<ToldAnswer>, n: u32| t.is_some_and(|t| t.told == verdict && t.times >= n);
    let acted = if verdict == Verdict::Drained {
        enough(agent, 1) || enough(http, polls)
    } else {
        (agent.is_none() || enough(agent, 1)) && (http.is_none() || enough(http, polls))
    };
    let mut what = p.describe_told(false);
    if let Some(why) = malformed {
        let _ = write!(what, "; its X-Haproxy-Server-State is malformed: {why}");
    }
    if acted {
        a.met.push(format!("{} acted ({what})", p.address));
        // The agent acted at its first such answer; the HTTP check at the latest of those counted.
        let ago = match (enough(agent, 1), http) {
            (true, _) => agent.map(|t| t.since_ms_ago),
            (false, Some(t)) => Some(t.last_ms_ago),
            (false, None) => None,
        };
        a.acted_by(p.address, ago.unwrap_or_default());
        return;
    }
    let need = match (verdict, agent.is_some()) {
        (Verdict::Drained, true) => format!("one agent-check or {polls} HTTP answers"),
        _ => format!("{polls} HTTP answers in a row"),
    };
    let since = (http.iter().chain(&agent)).map(|t| t.since_ms_ago).max();
    a.pend_of(
        Some(p.address),
        since,
        format!(
            "{} not told {} enough yet ({what}; needs {need})",
            p.address,
            verdict.as_str()
        ),
    );
}

/// The agent connections and borrowed JRubies of a drained node.
fn agent_traffic(a: &mut Stage, status: &Status<'_>) {
    let answer = &status.answer;
    match &status.traffic {
        None => a.pend(
            "the daemon watches no agent connections (inetd mode?): ask `pmcheck serve`".to_owned(),
        ),
        Some(t) if t.problem.is_some() => a.pend(format!(
            "cannot see the agent connections: {}",
            t.problem.as_deref().unwrap_or_default()
        )),
        Some(t) if t.total == 0 => {
            a.met.push(format!("no agent connection to {}", t.listener));
        }
        Some(t) => {
            a.connections = t.total;
            let from: BTreeMap<IpAddr, usize> = (t.sources.iter())
                .map(|s| (s.address, s.connections))
                .collect();
            let mut from: Vec<String> = from
                .into_iter()
                .map(|(ip, n)| {
                    let who = if status.pollers.iter().any(|p| p.address == ip) {
                        "through the load balancer"
                    } else {
                        "not a poller: an agent that bypasses the load balancer?"
                    };
                    format!("{n} from {ip} ({who})")
                })
                .collect();
            if t.other_sources > 0 {
                from.push(format!("and from {} more address(es)", t.other_sources));
            }
            a.pend(format!(
                "{} agent connection(s) to {}: {}",
                a.connections,
                t.listener,
                from.join(", ")
            ));
        }
    }
    match &answer.pool {
        Some(pool) if answer.probe.healthy() && pool.borrowed > 0 => a.pend(format!(
            "{} JRuby instance(s) borrowed: requests in progress",
            pool.borrowed
        )),
        Some(_) if answer.probe.healthy() => a.met.push("no JRuby borrowed".to_owned()),
        _ => {}
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::protocol::UnrecordedAnswer;
    use crate::protocol::lines::tests::drained;

    #[derive(Clone, Copy)]
    enum Goal {
        Drained,
        Undrained,
    }

    /// What is pending, in words.
    fn said(a: &Stage) -> Vec<String> {
        a.pending.iter().map(|p| p.what.clone()).collect()
    }

    fn poller<'a>(answer: &'a mut Status<'static>) -> &'a mut PollerAnswer {
        &mut answer.pollers[0]
    }

    /// What `answer` says about `goal`, with `--polls`.
    fn judged(goal: Goal, answer: &Status<'static>, polls: u32) -> Stage {
        let ask = Ask {
            polls,
            ..Ask::default()
        };
        match goal {
            Goal::Drained => drain(answer, &ask),
            Goal::Undrained => undrain(answer, &ask),
        }
    }

    #[test]
    fn a_drain_is_safe_once_told_and_quiet() {
        let a = judged(Goal::Drained, &drained(), 3);
        assert_eq!(said(&a), Vec::<String>::new());
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
            since_ms_ago: 100,
        });
        assert!(judged(Goal::Drained, &answer, 3).pending.is_empty());
        poller(&mut answer).agent = None;
        let a = judged(Goal::Drained, &answer, 3);
        assert_eq!(a.pending.len(), 1, "{:?}", said(&a));
        assert!(said(&a)[0].contains("10.0.0.5 not told DRAINED enough yet (HTTP: DRAINED x1;"));
        assert!(
            said(&a)[0].contains("needs 3 HTTP answers in a row"),
            "{}",
            said(&a)[0]
        );
        // An agent check that stopped does not count.
        let p = poller(&mut answer);
        p.agent = Some(ToldAnswer {
            told: Verdict::Drained,
            times: 5,
            last_ms_ago: 7_000,
            since_ms_ago: 7_000,
        });
        p.agent_stopped_ms_ago = Some(7_000);
        assert_eq!(judged(Goal::Drained, &answer, 3).pending.len(), 1);
    }

    /// A load balancer may open an agent's connection just before it acts: only a read of the
    /// connections made 250 ms after the latest acting counts, and an undated one never does.
    #[test]
    fn the_connections_count_once_read_after_the_latest_load_balancer_acted() {
        let mut answer = drained();
        let a = judged(Goal::Drained, &answer, 3);
        assert!(a.met(), "acted 1.5 s ago, read just now: {:?}", said(&a));
        assert_eq!(a.acted_ms_ago, Some(1_500), "its agent's first drain");
        let agent = poller(&mut answer).agent.as_mut().unwrap();
        (agent.since_ms_ago, agent.last_ms_ago) = (200, 200);
        let a = judged(Goal::Drained, &answer, 3);
        assert_eq!(
            said(&a),
            [
                "every load balancer has acted: reading the agent connections once more, for one it sent just before"
            ]
        );
        poller(&mut answer).agent.as_mut().unwrap().since_ms_ago = 300;
        assert!(judged(Goal::Drained, &answer, 3).met(), "read 300 ms after");
        answer.traffic.as_mut().unwrap().age_ms = Some(100);
        assert!(
            !judged(Goal::Drained, &answer, 3).met(),
            "read 200 ms after"
        );
        answer.traffic.as_mut().unwrap().age_ms = None;
        assert!(!judged(Goal::Drained, &answer, 3).met(), "a read not dated");
    }

    #[test]
    fn pollers_that_fell_silent_are_not_waited_for() {
        let mut answer = drained();
        let p = poller(&mut answer);
        p.http = Some(ToldAnswer {
            told: Verdict::Ok,
            times: 9,
            last_ms_ago: 4_000,
            since_ms_ago: 4_000,
        });
        p.agent = None;
        p.last_ms_ago = 4_000;
        assert_eq!(judged(Goal::Drained, &answer, 3).pending.len(), 1);
        // The daemon says it no longer polls: not waited for.
        poller(&mut answer).polling = false;
        let a = judged(Goal::Drained, &answer, 3);
        assert!(a.pending.is_empty(), "{:?}", said(&a));
        assert!(a.met.iter().any(|m| m == "no load balancer is polling"));
    }

    #[test]
    fn connections_and_borrowed_jrubies_keep_it_waiting_and_say_from_where() {
        let mut answer = drained();
        answer.traffic = Some(crate::responder::agents::bounded(
            "127.0.0.1:8140".parse().unwrap(),
            vec![
                "10.0.0.5:40001".parse().unwrap(),
                "10.0.0.5:40002".parse().unwrap(),
                "10.0.9.9:50000".parse().unwrap(),
            ],
        ));
        if let Some(pool) = answer.answer.pool.as_mut() {
            pool.to_mut().borrowed = 1;
        }
        let a = judged(Goal::Drained, &answer, 3);
        assert_eq!(a.connections, 3);
        assert_eq!(
            said(&a),
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
        let a = judged(Goal::Drained, &answer, 3);
        assert_eq!(
            said(&a),
            ["cannot see the agent connections: cannot read /proc/self/net/tcp"]
        );
        answer.traffic = None;
        assert_eq!(judged(Goal::Drained, &answer, 3).pending.len(), 1);
    }

    #[test]
    fn an_undrain_needs_every_kind_of_check_told_ok() {
        let mut answer = drained();
        answer.answer.verdict = Verdict::Ok;
        let p = poller(&mut answer);
        p.agent = Some(ToldAnswer {
            told: Verdict::Ok,
            times: 1,
            last_ms_ago: 10,
            since_ms_ago: 10,
        });
        p.http = Some(ToldAnswer {
            told: Verdict::Ok,
            times: 2,
            last_ms_ago: 10,
            since_ms_ago: 10,
        });
        let a = judged(Goal::Undrained, &answer, 3);
        assert_eq!(a.pending.len(), 1, "{:?}", said(&a));
        poller(&mut answer).http.as_mut().unwrap().times = 3;
        assert!(judged(Goal::Undrained, &answer, 3).pending.is_empty());
        answer.answer.verdict = Verdict::Drained;
        assert!(
            said(&judged(Goal::Undrained, &answer, 3))[0]
                .starts_with("pmcheck answers DRAINED, not OK")
        );
    }

    #[test]
    fn healthy_needs_a_fresh_probe_after_the_command_and_a_full_pool() {
        let mut answer = drained();
        let ended = |ms| Ask {
            ended: Some(Duration::from_millis(ms)),
            ..Ask::default()
        };
        // The probe is 200 ms old; the command ended 100 ms ago: that probe is from before.
        assert_eq!(
            said(&healthy(&answer, &ended(100))),
            ["no probe of Puppet Server since the command ended yet"]
        );
        assert!(healthy(&answer, &ended(1_000)).met());
        // A probe older than two probe rounds is not believed.
        answer.answer.probe.age_ms = Some(30_000);
        assert!(
            said(&healthy(&answer, &Ask::default()))[0]
                .starts_with("the latest probe of Puppet Server is 30.0s old"),
            "{:?}",
            said(&healthy(&answer, &Ask::default()))
        );
        answer.answer.probe.age_ms = Some(200);
        answer.answer.load = Some(Load::Warming);
        if let Some(pool) = answer.answer.pool.as_mut() {
            pool.to_mut().free = 1;
        }
        assert_eq!(
            said(&healthy(&answer, &ended(1_000))),
            ["Puppet Server's JRuby pool is warming: 1 of 2 JRubies ready"]
        );
        answer.answer.probe.ok = false;
        answer.answer.probe.outcome = crate::health::answer::ProbeState::Unhealthy;
        answer.answer.probe.detail = "connection refused".into();
        assert_eq!(
            said(&healthy(&answer, &ended(1_000))),
            ["Puppet Server: connection refused"]
        );
    }

    /// `drained()` with its load balancer sending `header` 300 ms ago.
    pub(crate) fn with_state(header: &str) -> Status<'static> {
        let mut answer = drained();
        let p = poller(&mut answer);
        // Its HTTP checks had been answered DRAINED for 2 s when it wrote the header.
        p.states = vec![StateAnswer {
            last_ms_ago: 300,
            told: Verdict::Drained,
            since_ms_ago: 2_300,
            polling: true,
            held: None,
            holds: None,
            agent: None,
            seen: Some(crate::health::lb_state::parse(header.as_bytes()).unwrap()),
            malformed: None,
        }];
        // Its agent check answered DRAINED for the first time only after that header.
        p.agent = Some(ToldAnswer {
            told: Verdict::Drained,
            times: 1,
            last_ms_ago: 100,
            since_ms_ago: 100,
        });
        answer
    }

    #[test]
    fn a_load_balancer_that_sends_its_state_is_believed_over_the_answers_counted() {
        // Told DRAINED three times by HTTP and once by agent, but HAProxy says it still
        // counts this server: not acted.
        let answer = with_state("UP; name=bk/m1; node=lb1; weight=100/200; scur=0/3; qcur=0");
        let a = judged(Goal::Drained, &answer, 3);
        assert_eq!(
            said(&a),
            [
                "load balancer 10.0.0.5 (lb1) says UP for bk/m1 (weight 100/200, 0 session(s), 0 queued; 0.3s ago): it still sends new agents here"
            ]
        );
        let answer = with_state("NOLB; name=bk/m1; node=lb1; weight=100/100; scur=2/3; qcur=0");
        let a = judged(Goal::Drained, &answer, 3);
        assert_eq!(a.pending.len(), 1);
        assert!(
            said(&a)[0].ends_with("out for new agents, sessions still open"),
            "{:?}",
            said(&a)
        );
        let answer = with_state("NOLB; name=bk/m1; node=lb1; weight=100/100; scur=0/3; qcur=0");
        let a = judged(Goal::Drained, &answer, 3);
        assert!(a.pending.is_empty(), "{:?}", said(&a));
        assert_eq!(a.acted, ["10.0.0.5".parse::<IpAddr>().unwrap()]);
        // A NOLB written before any DRAINED answer is stale: it was answered OK since.
        let mut answer = with_state("NOLB; name=bk/m1; node=lb1; weight=100/100; scur=0/3; qcur=0");
        let p = poller(&mut answer);
        (p.states[0].told, p.agent) = (Verdict::Ok, None);
        let a = judged(Goal::Drained, &answer, 3);
        assert_eq!(a.pending.len(), 1, "{:?}", said(&a));
        assert!(
            said(&a)[0].ends_with(
                "from before its checks were first answered DRAINED; waiting for the next"
            )
        );
        // DOWN (1/3 on its way up) takes nothing either.
        let answer = with_state("DOWN 1/3; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0");
        assert!(judged(Goal::Drained, &answer, 3).pending.is_empty());
    }

    #[test]
    fn an_agent_drain_that_leaves_the_word_up_counts_once_delivered_before_the_header() {
        // The other server weighs as much: the total alone cannot tell.
        let mut answer = with_state("UP; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0");
        assert_eq!(judged(Goal::Drained, &answer, 3).pending.len(), 1);
        poller(&mut answer).agent.as_mut().unwrap().since_ms_ago = 2_000;
        assert!(judged(Goal::Drained, &answer, 3).pending.is_empty());
        // Its own weight out of a total smaller than it: drained, whatever the agent said.
        let answer = with_state("UP; name=bk/m1; node=lb1; weight=100/60; scur=0/0; qcur=0");
        assert!(judged(Goal::Drained, &answer, 3).pending.is_empty());
    }

    #[test]
    fn an_undrain_waits_for_the_load_balancers_own_up() {
        let mut answer = with_state("NOLB; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0");
        answer.answer.verdict = Verdict::Ok;
        let p = poller(&mut answer);
        p.states[0].told = Verdict::Ok;
        let ok = ToldAnswer {
            told: Verdict::Ok,
            times: 100,
            last_ms_ago: 10,
            since_ms_ago: 9_000,
        };
        (p.http, p.agent) = (Some(ok), Some(ok));
        let a = judged(Goal::Undrained, &answer, 3);
        assert_eq!(
            a.pending.len(),
            1,
            "100 OK answers do not beat HAProxy's NOLB"
        );
        let mut answer = with_state("UP; name=bk/m1; node=lb1; weight=100/200; scur=0/0; qcur=0");
        answer.answer.verdict = Verdict::Ok;
        let p = poller(&mut answer);
        p.states[0].told = Verdict::Ok;
        p.http = Some(ToldAnswer {
            told: Verdict::Ok,
            times: 1,
            last_ms_ago: 10,
            since_ms_ago: 10,
        });
        // The agent's `ready` came after the header: HAProxy may still hold its drain.
        p.agent = Some(ToldAnswer {
            told: Verdict::Ok,
            times: 1,
            last_ms_ago: 10,
            since_ms_ago: 10,
        });
        assert_eq!(judged(Goal::Undrained, &answer, 3).pending.len(), 1);
        poller(&mut answer).agent.as_mut().unwrap().since_ms_ago = 5_000;
        // The header came with the first OK answer: it shows HAProxy before that answer.
        poller(&mut answer).states[0].since_ms_ago = 300;
        let a = judged(Goal::Undrained, &answer, 3);
        assert_eq!(a.pending.len(), 1);
        assert!(
            said(&a)[0]
                .ends_with("from before its checks were first answered OK; waiting for the next"),
            "{:?}",
            said(&a)
        );
        poller(&mut answer).states[0].since_ms_ago = 2_300;
        let a = judged(Goal::Undrained, &answer, 3);
        assert!(
            a.pending.is_empty(),
            "one HTTP answer is enough with HAProxy's word: {:?}",
            said(&a)
        );
    }

    #[test]
    fn pollers_that_are_not_regular_never_act_and_keep_the_wait_going() {
        let mut answer = drained();
        let p = poller(&mut answer);
        (p.regular, p.polls, p.first_ms_ago, p.last_ms_ago) = (false, 1, 500, 500);
        let a = judged(Goal::Drained, &answer, 3);
        assert_eq!(a.acted, Vec::<IpAddr>::new());
        assert_eq!(a.pending.len(), 1);
        assert!(
            said(&a)[0].starts_with(
                "10.0.0.5 polled 1 time(s), the latest 0.5s ago: not known as a load balancer yet"
            ),
            "{:?}",
            said(&a)
        );
        // Silent since: no longer waited for.
        let p = poller(&mut answer);
        (p.first_ms_ago, p.last_ms_ago, p.polling) = (5_500, 5_500, false);
        let a = judged(Goal::Drained, &answer, 3);
        assert!(a.pending.is_empty(), "{:?}", said(&a));
        // Polls the table had no room for keep it going as well.
        answer.unrecorded = Some(UnrecordedAnswer {
            polls: 7,
            last_ms_ago: 200,
        });
        let a = judged(Goal::Drained, &answer, 3);
        assert!(
            said(&a)[0]
                .starts_with("7 poll(s) from addresses the daemon's poller table had no room for"),
            "{:?}",
            said(&a)
        );
    }

    #[test]
    fn a_fresh_daemon_is_not_believed_when_it_has_heard_nobody_yet() {
        let mut answer = drained();
        answer.pollers = Vec::new();
        answer.listening_ms = 300;
        let a = judged(Goal::Drained, &answer, 3);
        assert_eq!(a.pending.len(), 1);
        assert!(
            said(&a)[0].starts_with("the daemon has listened for only 0.3s"),
            "{:?}",
            said(&a)
        );
        answer.listening_ms = 4_000;
        let a = judged(Goal::Drained, &answer, 3);
        assert!(a.pending.is_empty());
        assert!(a.met.iter().any(|m| m == "no load balancer is polling"));
    }

    #[test]
    fn a_load_balancer_that_stopped_checking_is_named_and_not_waited_for() {
        let mut answer = with_state("UP; name=bk/m1; node=lb1; weight=100/200; scur=0/0; qcur=0");
        let p = poller(&mut answer);
        (p.first_ms_ago, p.last_ms_ago, p.polling) = (90_000, 20_000, false);
        let a = judged(Goal::Drained, &answer, 3);
        assert!(a.pending.is_empty(), "{:?}", said(&a));
        assert!(
            a.met.iter().any(|m| m
                .starts_with("load balancer 10.0.0.5 (lb1) stopped checking 20.0s ago")
                && m.contains("a restart of HAProxy")),
            "{:?}",
            a.met
        );
    }
}
