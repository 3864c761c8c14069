//! The node's shared state: one per daemon (or per inetd poll), shared by every listener and
//! connection, read by the HTTP answers ([`crate::responder::http`]) and the agent check.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use tokio::sync::watch;

use crate::drain::file::DrainFile;
use crate::drain::record::{Drain, DrainState};
use crate::drain::watch::Drains;
use crate::health::Now;
use crate::health::decision::{Decision, Rules};
use crate::health::verdict::Verdict;
use crate::health::weight::Rejoin;
use crate::health::{hold, lb_state};
use crate::puppet::readings::Readings;
use crate::puppet::report::{Latest, ProbeReport};
use crate::responder::agent;
use crate::responder::agents::Agents;
use crate::responder::metrics::Metrics;
use crate::responder::pollers::{Poll, Pollers, Via};
use crate::settings::lb_proof::LbProof;

/// The moment a decision is made at: the one place the responder reads both clocks for one.
pub(crate) fn now() -> Now {
    Now {
        at: Instant::now(),
        wall: SystemTime::now(),
    }
}

/// Who asks for a decision, for the drain's gate ([`crate::health::hold`]).
#[derive(Debug, Clone, Copy)]
pub enum Asker<'a> {
    /// Anybody: the operator, Prometheus, a check that proves nothing.
    Anyone,
    /// A proven load balancer's HTTP check, with its `X-Haproxy-Server-State`.
    Check(&'a [u8]),
    /// An agent check from this address.
    Agent(IpAddr),
}

/// The drain state a held drain is decided with.
static NOT_DRAINED: DrainState = DrainState::NotDrained;

/// What the background tasks publish for the polls to read.
pub struct Feeds {
    /// The drain state, from the drain watcher.
    pub drain: Drains,
    /// The latest probe report, from the prober.
    pub latest: Latest,
    /// Where the node stands on its way back into the pool, from the rejoin tracker.
    pub rejoin: watch::Receiver<Rejoin>,
}

/// The node's shared state, what every poll reads: the latest drain state, probe report and
/// rejoin state, all kept up to date in the background, so a poll does no I/O beyond its
/// socket; and what the polls leave behind (pollers, counters).
pub struct Node {
    /// The drain state, kept current by the drain watcher.
    pub drain: Drains,
    /// The latest probe report, published by the prober.
    pub latest: Latest,
    /// Where the node stands on its way back into the pool, for the weight.
    pub rejoin: watch::Receiver<Rejoin>,
    /// The daemon's settings that shape an answer.
    pub rules: Rules,
    /// Who polls, and what each was told.
    pub pollers: Pollers,
    /// What a poll must show to count as a load balancer's.
    pub proof: LbProof,
    /// The agent connections to Puppet Server, for the operator's view.
    pub agents: Agents,
    /// The daemon's counters for `/metrics`; `None` in inetd mode, whose process lives for
    /// one poll and so has nothing to count.
    pub metrics: Option<Metrics>,
    /// The slow readings, kept by their readers (none in inetd mode either).
    pub readings: Readings,
    /// When the listeners started accepting: the poller table knows nothing from before.
    pub started: Instant,
    /// The drain record watched, for the operator's view
    /// ([`crate::drain::file::DrainFile::resolved`]).
    pub drain_file: String,
}

impl Node {
    /// The shared state of a node whose drain record is `drain_file` and whose Puppet Server
    /// listens on `puppet` (for the agent connections); `metrics` for a daemon, which counts.
    pub fn new(
        feeds: Feeds,
        rules: Rules,
        proof: LbProof,
        drain_file: &DrainFile,
        puppet: Option<SocketAddr>,
        metrics: bool,
    ) -> Self {
        Self {
            drain: feeds.drain,
            latest: feeds.latest,
            rejoin: feeds.rejoin,
            rules,
            pollers: Pollers::new(),
            proof,
            agents: Agents::new(puppet),
            metrics: metrics.then(Metrics::new),
            readings: Readings::default(),
            started: Instant::now(),
            drain_file: drain_file.resolved().display().to_string(),
        }
    }

    /// The latest probe report, without waiting for Puppet Server.
    pub fn latest(&self) -> Option<Arc<ProbeReport>> {
        self.latest.borrow().clone()
    }

    /// The agent check's line for `peer`, with what it tells (to note once the client has said
    /// what it sends, [`Node::agent_told`]).
    pub fn agent_line(&self, peer: IpAddr) -> (String, Verdict, Instant) {
        self.decide_for(Asker::Agent(peer), |decision, now| {
            (agent::line(decision), decision.verdict, now)
        })
    }

    /// Notes that the agent check from `peer`, which sent `sent` (HAProxy's `agent-send`), was
    /// told `verdict` at `at`.
    pub fn agent_told(&self, peer: IpAddr, sent: &[u8], verdict: Verdict, at: Instant) {
        let poll = Poll {
            address: peer,
            via: Via::Agent,
            verdict,
            state: None,
            client: None,
            proof: self.proof.judge(peer, Some(sent)),
        };
        self.count(poll, at, false);
    }

    /// Decides from the latest drain state, probe report and rejoin state, as of now.
    pub(crate) fn decide<R>(&self, then: impl FnOnce(&Decision<'_>, Instant) -> R) -> R {
        self.decide_for(Asker::Anyone, then)
    }

    /// [`Node::decide`] for `asker`: a drain is held from a load balancer that says this node
    /// is its backend's last server ([`crate::health::hold`]).
    pub(crate) fn decide_for<R>(
        &self,
        asker: Asker<'_>,
        then: impl FnOnce(&Decision<'_>, Instant) -> R,
    ) -> R {
        let now = now();
        let drain = Arc::clone(&self.drain.borrow());
        let probe = self.latest();
        let rejoin = *self.rejoin.borrow();
        let held = match &*drain {
            DrainState::Drained(d) => self.held(d, asker, now),
            _ => None,
        };
        let Some(why) = held else {
            return then(
                &Decision::decide(&drain, probe.as_deref(), rejoin, now, &self.rules),
                now.at,
            );
        };
        let mut decision =
            Decision::decide(&NOT_DRAINED, probe.as_deref(), rejoin, now, &self.rules);
        decision.reason = Cow::Owned(format!("{why}; {}", decision.reason));
        then(&decision, now.at)
    }

    /// Why `drain` is held from `asker`, if it is.
    fn held(&self, drain: &Drain, asker: Asker<'_>, now: Now) -> Option<String> {
        match asker {
            Asker::Anyone => None,
            Asker::Check(header) => {
                let lb = lb_state::parse(header).ok()?;
                hold::held(&lb, drain, now.wall).map(|h| h.describe(&lb))
            }
            // HAProxy applies an agent line as it reads it, with no header to decide by: the
            // agent check follows what the same load balancer's HTTP check was last answered.
            Asker::Agent(peer) => match self.pollers.proven_http(peer, now.at) {
                Some(told) if told != Verdict::Drained => Some(format!(
                    "drain held: the HTTP check of load balancer {} was answered {} last",
                    peer.to_canonical(),
                    told.as_str()
                )),
                _ => None,
            },
        }
    }

    /// Counts a poll, and notes its poller unless it is pmcheck's own tool (`own`).
    pub(crate) fn count(&self, poll: Poll<'_>, now: Instant, own: bool) {
        if let Some(metrics) = &self.metrics {
            metrics.polled(poll.via, poll.verdict);
        }
        if !own {
            self.pollers.record(poll, now);
        }
    }
}
