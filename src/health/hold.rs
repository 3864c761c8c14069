//! A drain takes effect only where the load balancer says another server still takes agents.
//!
//! Two masters drained within a check interval of each other both passed the last-server
//! guard of e5ddf73, which reads a header up to one interval old, and HAProxy took both out.
//! HAProxy itself orders what matters: it writes `X-Haproxy-Server-State` when it sends a check
//! and applies the answer as it reads it, and it spreads the checks of a backend's servers over
//! the interval. So the answer to a proven check decides with that check's own header: a
//! drained node whose header says it is the only server taking agents is answered as not
//! drained (the drain is *held*), and the drain takes effect at the first check whose header
//! shows another server taking agents. Of two drains at once, the node checked first goes out
//! and the other is held until the first comes back: that is how colliding cycles take turns.
//!
//! Should both still go out (their checks crossed within a round trip), the next header says
//! the backend has no server left: a drain younger than [`YOUNG`] is then held too, so the node
//! checked first comes back and the other stays out. An older drain is left alone: that is
//! the other masters failing, not a collision. A forced drain (`--force`) is never held, nor
//! one that no last-server guard checked before it was written (no daemon answered its
//! writer): a single master's drain made that way must still take it out.

use std::time::{Duration, SystemTime};

use crate::drain::record::Drain;
use crate::health::answer::PollerAnswer;
use crate::health::lb_state::LbState;
use crate::health::verdict::Verdict;

/// How long after it began a drain is held when the backend has no server left.
pub const YOUNG: Duration = Duration::from_secs(60);

/// Why a drain is held from a load balancer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// This node is the only server taking new agents in the backend.
    LastServer,
    /// No server takes new agents: this drain and another went out at once.
    EmptyBackend,
}

/// Whether `drain` is held from the load balancer whose word on this node is `lb`.
pub fn held(lb: &LbState, drain: &Drain, now: SystemTime) -> Option<Held> {
    let record = drain.record.as_ref()?;
    if record.forced.is_some() || !record.holders().iter().any(|h| h.guarded) {
        return None;
    }
    if lb.last_serving() {
        return Some(Held::LastServer);
    }
    let young = drain
        .since()
        .is_some_and(|since| now.duration_since(since).unwrap_or_default() < YOUNG);
    (young && lb.total_weight == 0).then_some(Held::EmptyBackend)
}

/// A header older than this says nothing of now: its load balancer stopped checking (a
/// server in MAINT is not checked), and holds nothing.
pub const CURRENT: Duration = Duration::from_secs(60);

/// Why `drain` is held now, from the pollers as the operator's JSON lists them: a proven
/// load balancer whose latest check of a server line, within [`CURRENT`], was answered as not
/// drained, and whose header still holds it.
pub fn held_by(pollers: &[PollerAnswer], drain: &Drain, now: SystemTime) -> Option<String> {
    (pollers.iter())
        .filter(|p| p.regular && p.proof.proven())
        .flat_map(|p| &p.states)
        .filter(|s| s.told != Verdict::Drained && Duration::from_millis(s.last_ms_ago) <= CURRENT)
        .find_map(|s| {
            let lb = s.seen.as_ref()?;
            held(lb, drain, now).map(|h| h.describe(lb))
        })
}

impl Held {
    /// Why, for a person, naming the load balancer's server line.
    pub fn describe(self, lb: &LbState) -> String {
        let node = if lb.node.is_empty() {
            String::new()
        } else {
            format!(" ({})", lb.node)
        };
        match self {
            Held::LastServer => format!(
                "drain held: load balancer{node} says {} is the only server taking new agents in backend {}; it goes out once another server takes agents",
                lb.server, lb.backend
            ),
            Held::EmptyBackend => format!(
                "drain held: load balancer{node} says no server takes new agents in backend {} (another master went out at the same moment); it stays in until another comes back",
                lb.backend
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::lb_state::parse;

    fn drain(since: &str, forced: bool) -> Drain {
        let forced = if forced { r#","forced":"yes""# } else { "" };
        Drain::parse(
            format!(
                r#"{{"reason":"r","by":"me","since":"{since}"{forced},"holders":[{{"kind":"drain","by":"me","since":"{since}","what":"r","guarded":true}}]}}"#
            )
            .as_bytes(),
        )
    }

    fn at(text: &str) -> SystemTime {
        humantime::parse_rfc3339(text).unwrap()
    }

    #[test]
    fn the_last_server_is_held_and_an_empty_backend_only_for_a_young_drain() {
        let up_last = parse(b"UP; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0").unwrap();
        let up_other = parse(b"UP; name=bk/m1; weight=100/200; scur=0/0; qcur=0").unwrap();
        let empty = parse(b"NOLB; name=bk/m1; weight=100/0; scur=0/0; qcur=0").unwrap();
        let out = parse(b"NOLB; name=bk/m1; weight=100/100; scur=0/0; qcur=0").unwrap();
        let young = drain("2026-11-25T10:00:00Z", false);
        let now = at("2026-11-25T10:00:30Z");
        assert_eq!(held(&up_last, &young, now), Some(Held::LastServer));
        assert_eq!(held(&up_other, &young, now), None);
        assert_eq!(held(&empty, &young, now), Some(Held::EmptyBackend));
        assert_eq!(held(&out, &young, now), None);
        let later = at("2026-11-25T10:01:00Z");
        assert_eq!(held(&empty, &young, later), None, "the others failed later");
        assert_eq!(held(&up_last, &young, later), Some(Held::LastServer));
        let forced = drain("2026-11-25T10:00:00Z", true);
        assert_eq!(held(&up_last, &forced, now), None);
        assert_eq!(held(&empty, &forced, now), None);
        let unguarded = Drain::parse(br#"{"reason":"r","by":"me","since":"2026-11-25T10:00:00Z"}"#);
        assert_eq!(held(&up_last, &unguarded, now), None, "no guard checked it");
        assert!(
            Held::LastServer
                .describe(&up_last)
                .starts_with("drain held: load balancer (lb1) says m1 is the only server")
        );
    }

    /// The operator's view holds a drain only by a header that is current.
    #[test]
    fn only_a_current_header_holds_the_drain_in_the_operators_view() {
        use crate::health::answer::StateAnswer;
        use crate::settings::lb_proof::Proof;
        let header = "UP; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0";
        let poller = |last_ms_ago| PollerAnswer {
            address: "10.0.0.5".parse().unwrap(),
            proof: Proof::Key,
            first_ms_ago: 600_000,
            last_ms_ago,
            polls: 300,
            http: None,
            agent: None,
            regular: true,
            client: None,
            states: vec![StateAnswer {
                last_ms_ago,
                told: Verdict::Ok,
                since_ms_ago: last_ms_ago,
                seen: parse(header.as_bytes()).ok(),
                malformed: None,
            }],
            states_stopped_ms_ago: None,
            agent_stopped_ms_ago: None,
        };
        let young = drain("2026-11-25T10:00:00Z", false);
        let now = at("2026-11-25T10:00:30Z");
        let held = held_by(&[poller(2_000)], &young, now);
        assert!(held.is_some_and(|h| h.contains("only server")));
        assert_eq!(
            held_by(&[poller(61_000)], &young, now),
            None,
            "a minute old"
        );
    }
}
