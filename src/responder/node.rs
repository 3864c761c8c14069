//! The node's shared state: one per daemon (or per inetd poll), shared by every listener and
//! connection, read by the HTTP answers ([`crate::responder::http`]) and the agent check.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use crate::health::decision::{Decision, Rules};
use crate::health::drain_file::DrainFile;
use crate::health::drain_watch::Drains;
use crate::health::lb_proof::LbProof;
use crate::health::verdict::Verdict;
use crate::health::weight::Rejoin;
use crate::puppet::report::{Latest, ProbeReport};
use crate::responder::agent;
use crate::responder::agents::Agents;
use crate::responder::metrics::Metrics;
use crate::responder::pollers::{Poll, Pollers, Via};

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
    /// When the listeners started accepting: the poller table knows nothing from before.
    pub started: Instant,
    /// The drain record watched, for the operator's view
    /// ([`crate::health::drain_file::DrainFile::resolved`]).
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
            started: Instant::now(),
            drain_file: drain_file.resolved().display().to_string(),
        }
    }

    /// The latest probe report, without waiting for Puppet Server.
    pub fn latest(&self) -> Option<Arc<ProbeReport>> {
        self.latest.borrow().clone()
    }

    /// The agent check's line, with what it tells (to note once the client has said what it
    /// sends, [`Node::agent_told`]).
    pub fn agent_line(&self) -> (String, Verdict, Instant) {
        self.decide(|decision, now| (agent::line(decision), decision.verdict, now))
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
        let now = Instant::now();
        let drain = Arc::clone(&self.drain.borrow());
        let probe = self.latest();
        let rejoin = *self.rejoin.borrow();
        then(
            &Decision::decide(&drain, probe.as_deref(), rejoin, now, &self.rules),
            now,
        )
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
