//! The waits' vocabulary: what a wait waits for ([`Goal`]), how it waits ([`Wait`]), what one
//! answer of the daemon says of it ([`Assessment`]), and how a poller of that answer is timed
//! (its silence against its own rhythm) and named. Shared by [`crate::operator::assessment`]
//! and [`crate::operator::backends`], which judge the answers.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::health::answer::{PollerAnswer, StateAnswer};
use crate::health::lb_state::LbState;
use crate::health::verdict::Verdict;
use crate::text::seconds;

/// A poller counts while it keeps its own rhythm: silent for less than three of its intervals
/// between polls, within these bounds. A load balancer checking every 2 s counts until it has
/// been silent 6 s; a one-off curl stops counting 5 s after its poll; none counts after a
/// minute of silence (a load balancer taken out of service, a check turned off).
pub const SILENCE: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(60));
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
}

/// HAProxy wrote this header after its server line's check had been answered `verdict` once:
/// it shows the effect of that answer (it writes a header before it reads the answer).
pub fn written_after(s: &StateAnswer, verdict: Verdict) -> bool {
    s.told == verdict && s.since_ms_ago > s.last_ms_ago
}

/// The load balancer by address.
pub fn who(p: &PollerAnswer) -> String {
    match p.states.iter().find_map(|s| s.seen.as_ref()) {
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

/// How long a poller with one poll may be silent and still count.
pub fn least_silence(how: &Wait) -> Duration {
    SILENCE.0.max(2 * how.lb_interval)
}

/// How long `p` may be silent and still count as polling: three of its intervals, within
/// `least` and [`SILENCE`]'s most.
pub fn silence_limit(p: &PollerAnswer, least: Duration) -> Duration {
    let most = SILENCE.1.max(least);
    if p.polls < 2 {
        return least;
    }
    let span = Duration::from_millis(p.first_ms_ago.saturating_sub(p.last_ms_ago));
    (3 * span / (p.polls - 1)).clamp(least, most)
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
