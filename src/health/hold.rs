//! Whether a drain takes effect at a load balancer's server line or is held there: the one
//! rule. The daemon answers each proven check by it, with that check's own header
//! ([`crate::responder::node`]); its `/status` says, for each server line, what the rule meets
//! there now; and `pmcheck drain`, `cycle` and `on-stop` ask that answer before they write
//! (`operator::view`), with the holders they would leave in the record.
//!
//! Why a hold: two masters drained within a check interval of each other both pass a guard
//! that reads a header up to one interval old, and HAProxy takes both out. HAProxy itself
//! orders what matters: it writes `X-Haproxy-Server-State` as it sends a check, applies the
//! answer as it reads it, and spreads a backend's checks over the interval. So a drained node
//! whose check's header says it is the only server taking new agents is answered as not
//! drained (the drain is *held*), and the drain takes effect at the first check whose header
//! shows another server taking agents. Of two drains at once, the node checked first goes out
//! and the other is held until the first comes back: that is how colliding cycles take turns.
//! Should both still go out (their checks crossed within a round trip), the next header says
//! the backend has no server left: a line this node left less than [`YOUNG`] ago then holds
//! too, so the node checked first comes back. A line left longer ago is not: that is the other
//! masters failing, not a collision.
//!
//! Only a drain whose every holder may be held is: one holder that may not (forced, written
//! while no daemon answered or by hand, Puppet Server's stop, a cycle stopped half-way) takes
//! the node out, wherever it is.

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::drain::holders::{Holder, Kind};
use crate::health::lb_state::LbState;

/// How long after this node left a server line a backend with no server left holds it.
pub const YOUNG: Duration = Duration::from_secs(60);

/// Why a drain is held at a server line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Held {
    /// This node is the only server taking new agents in the backend.
    LastServer,
    /// No server takes new agents: this node and another went out at once.
    EmptyBackend,
    /// Two load balancers answer as one (one key and one `node` name, two HAProxy
    /// processes): their headers of the line disagree about the backend, check by check. Such
    /// a view may keep the node in, never let it out: which of them a check came from is
    /// unknown, so neither one's word can be trusted to leave another server.
    TwoViews,
}

/// What a server line's header holds: why a drain that may be held is held there, if it is.
///
/// `agent_out`: the line's agent check had been told `drain` when HAProxy wrote the header, so
/// HAProxy keeps the server in DRAIN, out of the backend's total weight (the word stays `UP`).
/// `young`: this node's drain took effect at the line less than [`YOUNG`] ago, or has not.
/// `two_views`: the line's headers come from two load balancers answering as one.
pub fn holds(lb: &LbState, agent_out: bool, young: bool, two_views: bool) -> Option<Held> {
    if two_views {
        return Some(Held::TwoViews);
    }
    if lb.last_serving() && !agent_out {
        return Some(Held::LastServer);
    }
    (young && lb.total_weight == 0).then_some(Held::EmptyBackend)
}

/// Whether a load balancer may hold this holder's drain: the last-server guard checked it,
/// it was not forced, and it keeps out a node that can serve (an operator's drain, a running
/// cycle). A stop's is not held: Puppet Server stops whatever a load balancer says. Nor is a
/// cycle's that stopped half-way: the node may be half-way through an upgrade.
pub fn holdable(holder: &Holder) -> bool {
    holder.checked && holder.forced.is_none() && matches!(holder.kind, Kind::Drain | Kind::Cycle)
}

/// The rule: the drain of `holders` is held at a server line that [`holds`] when every one of
/// them may be held ([`holdable`]); a record with none (a hand-written file that is no record)
/// is never held. `holds` is only asked when the holders may be held: most drains taking
/// effect cost no read of the line's header.
pub fn held<'a>(
    holders: impl Iterator<Item = &'a Holder>,
    holds: impl FnOnce() -> Option<Held>,
) -> Option<Held> {
    if may_hold(holders) { holds() } else { None }
}

/// Whether a load balancer may hold the drain of `holders` at all: there is one, and every one
/// may be held ([`holdable`]).
pub fn may_hold<'a>(holders: impl Iterator<Item = &'a Holder>) -> bool {
    let mut holders = holders.peekable();
    holders.peek().is_some() && holders.all(holdable)
}

/// The holders that hold the node at `now`. A drain whose `--for` has passed no longer does,
/// nor a stop's holder once Puppet Server started again after it and a probe made since found
/// it healthy (`started`: the start of the Puppet Server process the latest healthy probe
/// reached, when known): the node returns on that fresh answer, whether or not `on-start` has
/// tidied the record yet.
pub fn live(
    holders: &[Holder],
    started: Option<SystemTime>,
    now: SystemTime,
) -> impl Iterator<Item = &Holder> {
    holders.iter().filter(move |h| {
        let restarted = || {
            (h.tenure.since.time())
                .zip(started)
                .is_some_and(|(since, started)| started > since)
        };
        !h.tenure.expired_at(now) && (h.kind != Kind::Stop || !restarted())
    })
}

/// Who asks for a decision, for the drain rule.
#[derive(Debug, Clone, Copy)]
pub enum Asker<'a> {
    /// Anybody: the operator, Prometheus, a check that proves nothing.
    Anyone,
    /// A proven load balancer's HTTP check, with its `X-Haproxy-Server-State`.
    Check {
        /// Its address.
        peer: IpAddr,
        /// Its key ([`crate::settings::lb_proof::Whose::key_line`]).
        key_line: Option<usize>,
        /// The header.
        header: &'a [u8],
    },
    /// An agent check, naming the server line it is for (`agent-send`), or none: every agent
    /// check, proven or not, since one that proves nothing must not take out a node that a
    /// load balancer at its address holds.
    Agent {
        /// Its address.
        peer: IpAddr,
        /// Its key ([`crate::settings::lb_proof::Whose::key_line`]), when it proved itself; `None` when it did not.
        key_line: Option<Option<usize>>,
        /// The server line named, `BACKEND/SERVER`.
        line: Option<&'a [u8]>,
    },
}

impl Held {
    /// Why, for a person, naming the load balancer's server line and what ends the hold: the
    /// reason a poll is answered with.
    pub fn describe(self, lb: &LbState) -> String {
        let who = if lb.node.is_empty() {
            "load balancer".to_owned()
        } else {
            format!("load balancer ({})", lb.node)
        };
        self.line(&who, lb)
    }

    /// `drain held: WHAT `who` SAYS; WHAT ENDS IT`: the whole line, wherever a hold is told.
    pub fn line(self, who: &str, lb: &LbState) -> String {
        format!("drain held: {}; {}", self.said(who, lb), self.ends(lb))
    }

    /// What the load balancer `who` says of its server line `lb`: the one sentence of each
    /// hold, for the poll's reason, `status` and the refusals alike.
    pub fn said(self, who: &str, lb: &LbState) -> String {
        match self {
            Held::LastServer => format!(
                "{who} says {} is the only server taking new agents in backend {} (weight {} of {})",
                lb.server, lb.backend, lb.weight, lb.total_weight
            ),
            Held::EmptyBackend => format!(
                "{who} says no server takes new agents in backend {} (weight {} of 0)",
                lb.backend, lb.weight
            ),
            Held::TwoViews => format!(
                "{who}: two load balancers answer as one for {}/{} (their checks of it, with one key, disagree about the backend at every check): give each HAProxy its own key line in the key file (--lb-key-file), bound to its address",
                lb.backend, lb.server
            ),
        }
    }

    /// What ends the hold.
    pub fn ends(self, lb: &LbState) -> String {
        match self {
            Held::TwoViews => {
                "it ends once each load balancer proves itself with its own key".to_owned()
            }
            _ => format!(
                "it ends once another server takes new agents in backend {}",
                lb.backend
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::holders::Process;
    use crate::drain::record::{Drain, DrainRecord};
    use crate::drain::tenure::{Stamp, Tenure};
    use crate::health::lb_state::parse;

    fn at(text: &str) -> SystemTime {
        humantime::parse_rfc3339(text).unwrap()
    }

    fn holder(kind: Kind, checked: bool, forced: bool) -> Holder {
        Holder {
            kind,
            tenure: Tenure {
                by: "alice".into(),
                since: Stamp::read("2026-11-25T10:00:00Z"),
                until: None,
            },
            what: "r".into(),
            process: (kind == Kind::Cycle).then(|| Process {
                pid: 1,
                start: 1,
                boot: "b".into(),
            }),
            checked,
            forced: forced.then(|| "--force".to_owned()),
        }
    }

    /// Headers, by what the rule should find in them (`bk/m1` is this node).
    const LAST: &str = "UP; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0";
    const OTHER: &str = "UP; name=bk/m1; node=lb1; weight=100/200; scur=0/0; qcur=0";
    const EMPTY: &str = "NOLB; name=bk/m1; node=lb1; weight=100/0; scur=0/0; qcur=0";
    const OUT: &str = "NOLB; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0";
    /// Agent-drained beside one server as heavy: the word stays UP, the total drops.
    const AGENT_OUT: &str = "UP; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0";
    const FALLING_LAST: &str = "UP 2/3; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0";

    /// What a server line's header holds, for every header and both ages.
    #[test]
    fn what_a_header_holds() {
        let h = |text: &str| parse(text.as_bytes()).unwrap();
        // (header, the line's agent check said drain, young) -> held
        let table = [
            (LAST, false, true, Some(Held::LastServer)),
            (LAST, false, false, Some(Held::LastServer)),
            (FALLING_LAST, false, false, Some(Held::LastServer)),
            (AGENT_OUT, true, true, None),
            (OTHER, false, true, None),
            (OUT, false, true, None),
            (EMPTY, false, true, Some(Held::EmptyBackend)),
            (EMPTY, false, false, None),
            (EMPTY, true, true, Some(Held::EmptyBackend)),
        ];
        for (header, ..) in table {
            assert_eq!(
                holds(&h(header), true, false, true),
                Some(Held::TwoViews),
                "two views at {header} keep the node in, whatever the header says"
            );
        }
        for (header, agent_out, young, want) in table {
            assert_eq!(
                holds(&h(header), agent_out, young, false),
                want,
                "{header} agent_out={agent_out} young={young}"
            );
        }
    }

    /// Every kind of holder, checked or not, forced or not, alone and beside a holdable one:
    /// the drain is held only when every holder may be.
    #[test]
    fn a_drain_is_held_only_when_every_holder_may_be() {
        let kinds = [Kind::Drain, Kind::Cycle, Kind::StoppedCycle, Kind::Stop];
        for kind in kinds {
            for checked in [false, true] {
                for forced in [false, true] {
                    let h = holder(kind, checked, forced);
                    let may = checked && !forced && matches!(kind, Kind::Drain | Kind::Cycle);
                    assert_eq!(
                        holdable(&h),
                        may,
                        "{kind:?} checked={checked} forced={forced}"
                    );
                    for holds in [None, Some(Held::LastServer), Some(Held::EmptyBackend)] {
                        let alone = held([&h].into_iter(), || holds);
                        if !may {
                            let asked = held([&h].into_iter(), || unreachable!("header read"));
                            assert_eq!(asked, None, "no header read for {kind:?}");
                        }
                        assert_eq!(alone, holds.filter(|_| may), "{kind:?} alone, {holds:?}");
                        // Beside an operator's checked drain: the other decides as much.
                        let other = holder(Kind::Drain, true, false);
                        let both = held([&other, &h].into_iter(), || holds);
                        assert_eq!(both, holds.filter(|_| may), "{kind:?} beside, {holds:?}");
                    }
                }
            }
        }
        assert_eq!(
            held(std::iter::empty(), || Some(Held::LastServer)),
            None,
            "a file that is no record has no holder to hold"
        );
    }

    /// A hand-written record, or one with a top-level drain only, is one drain no guard
    /// checked: never held.
    #[test]
    fn a_hand_written_record_is_never_held() {
        for text in [
            r#"{"reason":"r","by":"me","since":"2026-11-25T10:00:00Z"}"#,
            r#"{"reason":"r","by":"me","since":"2026-11-25T10:00:00Z","forced":"x"}"#,
        ] {
            let drain = Drain::parse(text.as_bytes());
            let record = drain.record.expect(text);
            assert_eq!(
                held(record.holders().iter(), || Some(Held::LastServer)),
                None
            );
        }
        let plain = Drain::parse(b"kernel upgrade, back at noon\n");
        assert!(plain.record.is_none());
        let written = DrainRecord::held_by(vec![holder(Kind::Drain, true, false)]).unwrap();
        let text = serde_json::to_string(&written).unwrap();
        assert!(!text.contains("\"reason\""), "no top-level copy: {text}");
        let read = Drain::parse(text.as_bytes()).record.unwrap();
        assert_eq!(
            held(read.holders().iter(), || Some(Held::LastServer)),
            Some(Held::LastServer)
        );
    }

    /// A stop's holder stops holding once Puppet Server started after it; others stay.
    #[test]
    fn a_stops_holder_goes_once_puppet_server_started_after_it() {
        let stop = holder(Kind::Stop, false, false);
        let drain = holder(Kind::Drain, false, false);
        let both = [stop.clone(), drain.clone()];
        let now = at("2026-11-25T10:05:00Z");
        let count = |started| live(&both, started, now).count();
        assert_eq!(count(None), 2, "not known to have started");
        assert_eq!(count(Some(at("2026-11-25T09:59:00Z"))), 2, "started before");
        assert_eq!(count(Some(at("2026-11-25T10:00:01Z"))), 1, "started after");
        assert_eq!(
            live(&both, Some(at("2026-11-25T10:00:01Z")), now).next(),
            Some(&drain)
        );
    }

    /// A drain whose `--for` has passed holds nothing beside the others: a lapsed forced
    /// drain no longer keeps a cycle beside it from being held.
    #[test]
    fn a_lapsed_holder_holds_nothing() {
        let mut lapsed = holder(Kind::Drain, true, true);
        lapsed.tenure.until = Some(Stamp::read("2026-11-25T11:00:00Z"));
        let cycle = holder(Kind::Cycle, true, false);
        let both = [lapsed, cycle.clone()];
        let last = || Some(Held::LastServer);
        let before = at("2026-11-25T10:59:59Z");
        assert_eq!(
            held(live(&both, None, before), last),
            None,
            "forced, still on"
        );
        let after = at("2026-11-25T11:00:00Z");
        assert_eq!(live(&both, None, after).collect::<Vec<_>>(), [&cycle]);
        assert_eq!(held(live(&both, None, after), last), Some(Held::LastServer));
    }

    #[test]
    fn a_hold_says_where_and_what_ends_it() {
        let lb = parse(LAST.as_bytes()).unwrap();
        let said = Held::LastServer.describe(&lb);
        assert!(
            said.starts_with("drain held: load balancer (lb1) says m1 is the only server"),
            "{said}"
        );
        assert!(
            said.ends_with("; it ends once another server takes new agents in backend bk"),
            "{said}"
        );
        let two = Held::TwoViews.describe(&lb);
        assert!(
            two.starts_with(
                "drain held: load balancer (lb1): two load balancers answer as one for bk/m1"
            ) && two.ends_with("it ends once each load balancer proves itself with its own key"),
            "{two}"
        );
    }
}
