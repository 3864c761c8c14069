//! The server lines of a `/status` answer, read: which proven load balancers still check this
//! node, where the drain rule ([`crate::health::hold`]) holds a drain and why, which backends
//! have no server left, which pollers prove nothing. The daemon's progress and the operator's
//! guard read them here, so each rule and each of its sentences is written once.

use std::time::Duration;

use crate::drain::holders::Holder;
use crate::health::hold::{self, Held};
use crate::health::lb_state::LbState;
use crate::health::verdict::Verdict;
use crate::protocol::{PollerAnswer, StateAnswer, Status, ToldAnswer};
use crate::text::seconds;

/// A server line of a proven load balancer that still checks this node, with its header read.
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    /// The load balancer.
    pub poller: &'a PollerAnswer,
    /// The line as the daemon keeps it.
    pub state: &'a StateAnswer,
    /// Its latest header.
    pub lb: &'a LbState,
}

impl Line<'_> {
    /// `load balancer 10.0.0.5 (lb1)`.
    pub fn who(&self) -> String {
        who_with(self.poller, self.lb)
    }

    /// How long ago its latest check came.
    pub fn age(&self) -> Duration {
        Duration::from_millis(self.state.last_ms_ago)
    }

    /// Its latest check came within `within` and was answered under the drain (DRAINED, or
    /// held there). A check that came after the record was written but was answered before
    /// the daemon saw it (answered OK) shows nothing of the drain yet.
    pub fn checked_since(&self, within: Duration) -> bool {
        self.age() < within && (self.state.told == Verdict::Drained || self.state.held.is_some())
    }
}

/// A server line where a drain is held, or would be.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Blocker {
    /// The load balancer, named.
    pub who: String,
    /// What it said of this server line.
    pub lb: LbState,
    /// Why the drain is held there.
    pub held: Held,
}

impl Blocker {
    /// What the load balancer says, for a person: `load balancer 10.0.0.5 (lb1) says m1 is
    /// the only server taking new agents in backend bk (weight 100 of 100)`.
    pub fn said(&self) -> String {
        self.held.said(&self.who, &self.lb)
    }

    /// What ends the hold.
    pub fn ends(&self) -> String {
        self.held.ends(&self.lb)
    }

    /// `drain held: ...; it ends once ...`.
    pub fn line(&self) -> String {
        self.held.line(&self.who, &self.lb)
    }
}

/// The blockers in words, joined.
pub fn said(blockers: &[Blocker]) -> String {
    let said: Vec<String> = blockers.iter().map(Blocker::said).collect();
    said.join("; ")
}

impl Status<'_> {
    /// Reads a JSON body back.
    pub fn from_json(text: &str) -> serde_json::Result<Status<'static>> {
        serde_json::from_str(text)
    }

    /// Why the daemon cannot use its load balancer key file, if it cannot.
    pub fn key_file_problem(&self) -> Option<&str> {
        (self.lb_key_file.as_ref()).and_then(|k| k.problem.as_deref())
    }

    /// When the Puppet Server the latest probe found healthy started, when the daemon knows.
    pub fn started(&self) -> Option<std::time::SystemTime> {
        self.answer.probe.started_healthy()
    }

    /// The daemon answers DRAINED.
    pub fn drained(&self) -> bool {
        self.answer.verdict == Verdict::Drained
    }

    /// `pmcheck at URL answers DRAINED (404): REASON`.
    pub fn says(&self, url: &str) -> String {
        let a = &self.answer;
        format!(
            "pmcheck at {url} answers {} ({}): {}",
            a.verdict.as_str(),
            a.status,
            a.reason
        )
    }

    /// The server lines of the proven load balancers that still check this node.
    pub fn lines(&self) -> impl Iterator<Item = Line<'_>> {
        (self.pollers.iter())
            .filter(|p| p.proof.proven())
            .flat_map(|p| p.states.iter().map(move |s| (p, s)))
            .filter(|(_, s)| s.polling)
            .filter_map(|(poller, state)| {
                let lb = state.seen.as_ref()?;
                Some(Line { poller, state, lb })
            })
    }

    /// Where the drain rule would hold a drain of `holders` now: each line whose latest header
    /// holds ([`hold::held`]). What `drain` and `cycle` refuse by before they write.
    pub fn would_hold(&self, holders: &[Holder]) -> Vec<Blocker> {
        self.blockers(|l| hold::held(holders.iter(), || l.state.holds))
    }

    /// Where the drain rule would hold any drain that may be held: the lines whose header
    /// says this node is its backend's last server, or that the backend has none left.
    pub fn holding(&self) -> Vec<Blocker> {
        self.blockers(|l| l.state.holds)
    }

    /// Where the drain is held now: the lines whose latest check was answered as not drained
    /// although the node is ([`hold`]).
    pub fn held(&self) -> Vec<Blocker> {
        if !self.drained() {
            return Vec::new();
        }
        self.blockers(|l| l.state.held)
    }

    /// Each line where `held` says why a drain is held there.
    fn blockers(&self, held: impl Fn(&Line<'_>) -> Option<Held>) -> Vec<Blocker> {
        self.lines()
            .filter_map(|l| {
                Some(Blocker {
                    held: held(&l)?,
                    who: l.who(),
                    lb: l.lb.clone(),
                })
            })
            .collect()
    }

    /// Every line that checks this node was checked in the last `within`, and answered under
    /// the drain made then ([`Line::checked_since`]).
    pub fn checked_within(&self, within: Duration) -> bool {
        self.lines().all(|l| l.checked_since(within))
    }

    /// How long the daemon has listened.
    pub fn listened(&self) -> Duration {
        Duration::from_millis(self.listening_ms)
    }

    /// The daemon has listened long enough to have heard every load balancer that checks it
    /// every `lb_interval`: two intervals. Before that, no line seen is no line.
    pub fn heard_all(&self, lb_interval: Duration) -> bool {
        self.listened() >= 2 * lb_interval
    }

    /// The load balancers that say no server at all takes new agents in this node's backend
    /// (a total weight of 0).
    pub fn empty_backends(&self) -> Vec<String> {
        self.lines()
            .filter(|l| l.lb.total_weight == 0)
            .map(|l| {
                format!(
                    "{} says no server takes new agents in backend {} (weight {} of 0)",
                    l.who(),
                    l.lb.backend,
                    l.lb.weight
                )
            })
            .collect()
    }

    /// The regular pollers that send a load balancer's view without proving they are one:
    /// the drain rule cannot read them.
    pub fn unproven_views(&self) -> Vec<String> {
        (self.pollers.iter())
            .filter(|p| p.regular && p.polling && !p.proof.proven() && !p.states.is_empty())
            .map(|p| format!("{} ({})", who(p), p.proof.describe()))
            .collect()
    }
}

/// The load balancer by address, and HAProxy's node name when it proves itself and says it.
pub fn who(p: &PollerAnswer) -> String {
    let seen = (p.states.iter()).find_map(|s| s.seen.as_ref().filter(|_| p.proof.proven()));
    match seen {
        Some(lb) => who_with(p, lb),
        None => p.address.to_string(),
    }
}

/// The load balancer by address and HAProxy's node name.
pub fn who_with(p: &PollerAnswer, lb: &LbState) -> String {
    if lb.node.is_empty() {
        format!("load balancer {}", p.address)
    } else {
        format!("load balancer {} ({})", p.address, lb.node)
    }
}

impl StateAnswer {
    /// HAProxy wrote this header after its server line's check had been answered `verdict`
    /// once: it shows the effect of that answer (it writes a header before it reads the
    /// answer).
    pub fn written_after(&self, verdict: Verdict) -> bool {
        self.told == verdict && self.since_ms_ago > self.last_ms_ago
    }
}

impl PollerAnswer {
    /// What its agent checks were told, unless it stopped making them.
    pub fn agent_now(&self) -> Option<ToldAnswer> {
        self.agent.filter(|_| self.agent_stopped_ms_ago.is_none())
    }

    /// It looks like a load balancer: it makes agent checks (which nobody else does), or polls
    /// at a steady rhythm naming no client (HAProxy's HTTP checks name none); people and
    /// scripts (curl, pmcheck's own requests) do not.
    pub fn is_load_balancer(&self) -> bool {
        self.agent.is_some() || (self.regular && self.client.is_none())
    }

    /// HAProxy's `node` name in its own view, when it sends one and proves it is a load
    /// balancer (an unproven poller's word names nothing).
    pub fn node(&self) -> Option<&str> {
        (self.states.iter())
            .filter(|_| self.proof.proven())
            .filter_map(|s| s.seen.as_ref())
            .map(|lb| lb.node.as_str())
            .find(|node| !node.is_empty())
    }

    /// `HTTP: DRAINED x3, agent: DRAINED x1`, and `, last 0.8s ago` with `when`; an agent
    /// check that stopped says so.
    pub fn describe_told(&self, when: bool) -> String {
        let mut parts = Vec::new();
        for (kind, told) in [("HTTP", &self.http), ("agent", &self.agent)] {
            if let Some(t) = told {
                parts.push(format!("{kind}: {} x{}", t.told.as_str(), t.times));
            }
        }
        // What its agent checks were told before they stopped is no longer its state.
        if let (Some(ago), Some(last)) = (self.agent_stopped_ms_ago, parts.last_mut()) {
            last.push_str(&format!(
                " until {} ago, then no more agent checks (`agent-check` gone from its server line?)",
                seconds(Duration::from_millis(ago))
            ));
        }
        if when {
            parts.push(format!(
                "last {} ago",
                seconds(Duration::from_millis(self.last_ms_ago))
            ));
        }
        parts.join(", ")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::drain::holders::Kind;

    /// A drained node's answer as the daemon sends it to loopback, with one proven load
    /// balancer (10.0.0.5) that polls and sends no state.
    pub(crate) fn drained() -> Status<'static> {
        Status::from_json(
            r#"{"verdict":"DRAINED","status":404,"reason":"upgrade (by root since 2026-11-23T08:00:00Z); Puppet Server is running","drain":null,
                "probe":{"ok":true,"outcome":"healthy","detail":"running","latency_ms":3,"age_ms":200,"endpoint":null},
                "weight":10,"weight_cause":{"cause":"full"},"load":"warm","pool":{"size":2,"free":2,"borrowed":0,"waiting":0,"average_free":2.0,"average_wait_ms":0,"average_borrow_ms":0,"queue_limit_hits":0,"borrow_timeouts":0,"lock":"not-in-use","lock_since":null},
                "agent_check":true,"listening_ms":90000,"probe_stale_ms":20000,"drain_file":"/var/lib/pmcheck/drain",
                "pollers":[{"address":"10.0.0.5","proof":"key","first_ms_ago":90000,"last_ms_ago":500,"polls":90,"regular":true,"polling":true,
                            "http":{"told":"DRAINED","times":3,"last_ms_ago":500,"since_ms_ago":4500},
                            "agent":{"told":"DRAINED","times":1,"last_ms_ago":1500,"since_ms_ago":1500}}],
                "traffic":{"listener":"127.0.0.1:8140","connections":[],"total":0,"sources":[],"other_sources":0,"problem":null,"age_ms":0}}"#,
        )
        .expect("a valid answer")
    }

    /// [`drained`] with its load balancer checking the node in backend `bk` with `header`,
    /// 300 ms ago, its line answered `told` (and `held`), `holds` now.
    pub(crate) fn view(
        header: &str,
        told: Verdict,
        held: Option<Held>,
        holds: Option<Held>,
    ) -> Status<'static> {
        let mut status = drained();
        status.pollers[0].states = vec![StateAnswer {
            last_ms_ago: 300,
            told,
            since_ms_ago: 2_300,
            polling: true,
            held,
            holds,
            agent: None,
            seen: None,
            malformed: None,
        }];
        let state = &mut status.pollers[0].states[0];
        state.seen = Some(crate::health::lb_state::parse(header.as_bytes()).unwrap());
        (state.told, state.held, state.holds) = (told, held, holds);
        status
    }

    const LAST: &str = "UP; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0";

    #[test]
    fn a_drain_that_may_be_held_is_refused_where_a_line_holds_it() {
        let v = view(
            LAST,
            Verdict::Ok,
            Some(Held::LastServer),
            Some(Held::LastServer),
        );
        let mut mine = Holder::drain("kernel".into(), None, std::time::SystemTime::now());
        mine.checked = true;
        let refused = v.would_hold(std::slice::from_ref(&mine));
        assert_eq!(
            said(&refused),
            "load balancer 10.0.0.5 (lb1) says m1 is the only server taking new agents in backend bk (weight 100 of 100)"
        );
        mine.forced = Some("--force".into());
        assert!(
            v.would_hold(std::slice::from_ref(&mine)).is_empty(),
            "forced"
        );
        let stop = Holder::stop("puppetserver.service", std::time::SystemTime::now());
        assert!(v.would_hold(&[stop]).is_empty(), "a stop is never held");
        assert_eq!(v.holding().len(), 1);
        assert_eq!(v.held().len(), 1);
        assert_eq!(v.held()[0].held, Held::LastServer);
        assert_eq!(mine.kind, Kind::Drain);
    }

    #[test]
    fn only_lines_still_checked_and_proven_count() {
        let mut v = view(
            LAST,
            Verdict::Ok,
            Some(Held::LastServer),
            Some(Held::LastServer),
        );
        v.pollers[0].states[0].polling = false;
        assert!(
            v.holding().is_empty(),
            "a line no longer checked holds nothing"
        );
        let mut v = view(
            LAST,
            Verdict::Ok,
            Some(Held::LastServer),
            Some(Held::LastServer),
        );
        v.pollers[0].proof = crate::settings::lb_proof::Proof::WrongKey;
        assert!(
            v.holding().is_empty(),
            "an unproven poller's word holds nothing"
        );
        assert_eq!(v.unproven_views().len(), 1);
    }
}
