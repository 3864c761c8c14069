//! The waits' vocabulary: what a wait waits for ([`Goal`]), how it waits ([`Wait`]) and what
//! one answer of the daemon says of it ([`Assessment`]), judged by
//! [`crate::operator::assessment`].

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::cli::{StateArgs, WaitArgs};
use crate::drain::file::DrainFile;
use crate::health::verdict::Verdict;
use crate::operator::view::Blocker;
use crate::responder::status::{PollerAnswer, StateAnswer};
use crate::text::seconds;

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
    /// Give up after this long.
    pub max_wait: Duration,
    /// How many answers in a row an HTTP-checking poller needs (HAProxy's `fall`/`rise`),
    /// for load balancers that do not say what they did (`http-check send-state`).
    pub polls: u32,
    /// The longest check interval (`inter`, `agent-inter`) of the load balancers: a wait
    /// believes that nobody polls only after the daemon has listened for two of them.
    pub lb_interval: Duration,
    /// The drain record the command changed ([`crate::drain::file::DrainFile::resolved`]):
    /// a daemon that watches another one cannot tell anything about it.
    pub drain_file: Option<PathBuf>,
}

impl Wait {
    /// How the waits of a command ask about the drain record in `state`, from its command line.
    pub fn of(args: &WaitArgs, state: &StateArgs) -> Self {
        Self {
            max_wait: args.max_wait,
            polls: args.polls,
            lb_interval: args.lb_interval,
            drain_file: Some(DrainFile::new(&state.state_dir).resolved()),
        }
    }
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
    /// For `Drained`: pmcheck answers DRAINED and every poller has acted on it, so the load
    /// balancers send no new agent here.
    pub every_poller_acted: bool,
    /// The pollers that have acted, for the progress line.
    pub acted: Vec<IpAddr>,
    /// What the operator should know although the goal is reached (a backend left with no
    /// server taking traffic).
    pub warnings: Vec<String>,
    /// For `Drained`: where the drain is held ([`crate::health::hold`]): it does not take
    /// effect there until another server takes agents.
    pub held: Vec<Blocker>,
}

/// HAProxy wrote this header after its server line's check had been answered `verdict` once:
/// it shows the effect of that answer (it writes a header before it reads the answer).
pub fn written_after(s: &StateAnswer, verdict: Verdict) -> bool {
    s.told == verdict && s.since_ms_ago > s.last_ms_ago
}

/// `HTTP: DRAINED x3, agent: DRAINED x1`, and `, last 0.8s ago` with `when`; an agent check
/// that stopped says so.
pub fn describe_told(p: &PollerAnswer, when: bool) -> String {
    let mut parts = Vec::new();
    for (kind, told) in [("HTTP", &p.http), ("agent", &p.agent)] {
        if let Some(t) = told {
            parts.push(format!("{kind}: {} x{}", t.told.as_str(), t.times));
        }
    }
    // What its agent checks were told before they stopped is no longer its state.
    if let (Some(ago), Some(last)) = (p.agent_stopped_ms_ago, parts.last_mut()) {
        let _ = write!(
            last,
            " until {} ago, then no more agent checks (`agent-check` gone from its server line?)",
            seconds(Duration::from_millis(ago))
        );
    }
    if when {
        parts.push(format!(
            "last {} ago",
            seconds(Duration::from_millis(p.last_ms_ago))
        ));
    }
    parts.join(", ")
}
