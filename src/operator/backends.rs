//! What the load balancers that send their state (`http-check send-state`) say of this node:
//! whether each acted on the wait's goal by its own word, that this node is a backend's last
//! server (the guard refuses the drain), that a backend has no server left (a warning), that a
//! drain has reached every one (it settled), and which views prove nothing.
//! Pure, as [`crate::operator::assessment`] is: every rule is tested on answers written by hand.

use std::time::Duration;

use crate::health::answer::{Answer, PollerAnswer, StateAnswer, ToldAnswer};
use crate::health::lb_state::{Health, LbState};
use crate::health::verdict::Verdict;
use crate::operator::goal::{
    Assessment, Wait, least_silence, silence_limit, who, who_with, written_after,
};
use crate::text::seconds;

/// The load balancers that say this node is the only server taking new agents in a
/// backend: draining it would leave that backend empty. Read from regular pollers' latest
/// `X-Haproxy-Server-State` (up to one check interval old).
pub fn last_server(answer: &Answer<'_>, how: &Wait) -> Vec<String> {
    let mut found = Vec::new();
    each_recent_state(answer, how, |p, lb, agent_drained| {
        if lb.last_serving() && !agent_drained {
            found.push(format!(
                "{} says {} is the only server taking new agents in backend {} (weight {} of {})",
                who_with(p, lb),
                lb.server,
                lb.backend,
                lb.weight,
                lb.total_weight
            ));
        }
    });
    found
}

/// The load balancers that say no server at all takes new agents in this node's backend (a
/// total weight of 0): taking this node down now would leave agents nothing to come back to.
pub fn empty_backend(answer: &Answer<'_>, how: &Wait) -> Vec<String> {
    let mut found = Vec::new();
    each_recent_state(answer, how, |p, lb, _| {
        if lb.total_weight == 0 {
            found.push(format!(
                "{} says no server takes new agents in backend {} (weight {} of 0)",
                who_with(p, lb),
                lb.backend,
                lb.weight
            ));
        }
    });
    found
}

/// After a drain: whether every proven load balancer that sends its view has shown it after
/// taking the drain (a header written after a check was answered DRAINED), so that a drain
/// held there ([`crate::health::hold`]) would show. True when none sends its view.
pub fn drain_settled(answer: &Answer<'_>, how: &Wait) -> bool {
    polling_now(answer, how)
        .filter(|p| p.proof.proven() && !p.states.is_empty())
        .all(|p| (p.states.iter()).any(|s| s.seen.is_some() && written_after(s, Verdict::Drained)))
}

/// The regular pollers that send a load balancer's view without proving they are one: the
/// last-server guard cannot read them, and says so.
pub fn unproven_views(answer: &Answer<'_>, how: &Wait) -> Vec<String> {
    polling_now(answer, how)
        .filter(|p| !p.proof.proven() && !p.states.is_empty())
        .map(|p| format!("{} ({})", who(p), p.proof.describe()))
        .collect()
}

/// The regular pollers still keeping their rhythm ([`silence_limit`]).
fn polling_now<'a>(answer: &'a Answer<'_>, how: &Wait) -> impl Iterator<Item = &'a PollerAnswer> {
    let least = least_silence(how);
    (answer.pollers.iter().flatten()).filter(move |p| {
        p.regular && Duration::from_millis(p.last_ms_ago) <= silence_limit(p, least)
    })
}

/// Each regular poller's recent word on this node (up to one check interval old), with whether
/// the agent check told it DRAINED since.
fn each_recent_state(
    answer: &Answer<'_>,
    how: &Wait,
    mut visit: impl FnMut(&PollerAnswer, &LbState, bool),
) {
    let least = least_silence(how);
    for p in answer.pollers.iter().flatten() {
        let limit = silence_limit(p, least);
        if !p.regular || !p.proof.proven() || Duration::from_millis(p.last_ms_ago) > limit {
            continue;
        }
        for s in &p.states {
            let Some(lb) = s.seen.as_ref() else { continue };
            let agent_drained = p
                .agent_now()
                .is_some_and(|t| t.told == Verdict::Drained && t.since_ms_ago > s.last_ms_ago);
            if Duration::from_millis(s.last_ms_ago) <= limit {
                visit(p, lb, agent_drained);
            }
        }
    }
}

/// The load balancer's own word on this node's server lines (one per backend it is in), for
/// `verdict`: it has acted when every one of them says so.
pub(crate) fn judge_by_states(
    a: &mut Assessment,
    p: &PollerAnswer,
    seen: &[(&StateAnswer, &LbState)],
    agent: Option<ToldAnswer>,
    verdict: Verdict,
) {
    let mut lines = Vec::new();
    let mut all = true;
    for &(s, lb) in seen {
        // The agent check's current run of answers began before this header was sent.
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
        let fresh = written_after(s, verdict);
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
            if !out && !fresh {
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
        a.acted.push(p.address);
    } else {
        a.pending.extend(
            lines
                .into_iter()
                .filter(|(ok, _)| !ok)
                .map(|(_, line)| line),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::assessment::assess;
    use crate::operator::assessment::tests::{how, with_state};
    use crate::operator::goal::Goal;

    #[test]
    fn the_last_server_is_found_and_an_empty_backend_is_a_warning() {
        let answer = with_state("UP; name=bk/m2; node=lb1; weight=100/100; scur=0/0; qcur=0");
        assert_eq!(
            last_server(&answer, &how(3)),
            [
                "load balancer 10.0.0.5 (lb1) says m2 is the only server taking new agents in backend bk (weight 100 of 100)"
            ]
        );
        let answer = with_state("UP; name=bk/m2; node=lb1; weight=100/160; scur=0/0; qcur=0");
        assert!(last_server(&answer, &how(3)).is_empty());
        let answer = with_state("NOLB; name=bk/m2; node=lb1; weight=100/0; scur=0/0; qcur=0");
        assert!(last_server(&answer, &how(3)).is_empty());
        let a = assess(Goal::Drained, &answer, &how(3), Duration::ZERO);
        assert_eq!(
            a.warnings,
            [
                "load balancer 10.0.0.5 (lb1) says backend bk has no server taking new agents now (total weight 0)"
            ]
        );
    }
}
