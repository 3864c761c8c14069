//! The daemon's `/status` as both sides read it, as mini-redis keeps its `Frame`: the poll's
//! answer, who polls with what each load balancer said and was told, the agent connections, the
//! readings, and where a change stands ([`progress`], decided by the daemon:
//! `responder::progress`). The operator's commands import this module and nothing else of the
//! daemon's; another host gets only the poll's answer.

pub mod lines;
pub mod progress;
pub mod readings;

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::health::answer::Answer;
use crate::health::hold::Held;
use crate::health::lb_state::LbState;
use crate::health::verdict::Verdict;
use crate::settings::lb_proof::{KeyFileAnswer, Proof};

pub use progress::Progress;
pub use readings::{CertificatesAnswer, CodeAnswer};

/// The operator's JSON (`pmcheck status`, the waits, `cycle`). Every path but this one and
/// `/metrics` is a load balancer's poll: HAProxy's `option httpchk` may name any.
pub const STATUS_PATH: &str = "/status";

/// The `User-Agent` of pmcheck's own requests (`status`, `drain --wait`): the operator's
/// tool is not a load balancer, so its polls are not recorded as a poller's.
pub const USER_AGENT: &str = concat!("pmcheck/", env!("CARGO_PKG_VERSION"));

/// This build's version, as `/status` says it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The operator's JSON: the poll's answer, and what only the operator reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status<'a> {
    /// The daemon's version, for the command that cannot read its answer (an older daemon
    /// sends none).
    #[serde(default)]
    pub version: String,
    /// What a poll from nobody in particular is answered now.
    #[serde(flatten)]
    pub answer: Answer<'a>,
    /// Whether the daemon answers HAProxy's agent check (`--agent-listen`), without which no
    /// weight is sent.
    pub agent_check: bool,
    /// Who polls this node, what each said and was told.
    pub pollers: Vec<PollerAnswer>,
    /// The agent connections to Puppet Server; `None` where the node watches none (inetd
    /// mode, whose process lives for one poll).
    pub traffic: Option<TrafficAnswer>,
    /// How long the daemon has listened: a wait does not believe that nobody polls before it
    /// has listened for a check interval.
    pub listening_ms: u64,
    /// The drain record the daemon watches.
    pub drain_file: String,
    /// Polls from addresses the poller table had no room for, when there were any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unrecorded: Option<UnrecordedAnswer>,
    /// The certificates' and the CRL's dates, as the daemon last read them (a daemon serves
    /// them; inetd mode does not read them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificates: Option<CertificatesAnswer>,
    /// The deploy records of `--code-environment`, as the daemon last read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<Vec<CodeAnswer>>,
    /// The load balancers' key file, when one is set: whether it can be used, and the
    /// addresses each key is bound to (never the keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lb_key_file: Option<KeyFileAnswer>,
    /// A probe older than this is not believed (two probe rounds, interval and timeout):
    /// the verdict fails closed, and a restart's progress waits for a new one.
    #[serde(default)]
    pub probe_stale_ms: u64,
    /// Where a drain, an undrain and a restart stand, as the daemon decides it; absent from
    /// a daemon of another version, which a command names rather than reads as "nothing
    /// pending".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
}

/// Polls that no poller entry holds ([`crate::responder::pollers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnrecordedAnswer {
    /// How many since the daemon started.
    pub polls: u64,
    /// How long ago the latest was.
    pub last_ms_ago: u64,
}

/// One address that polls, and what it was told ([`crate::responder::pollers`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollerAnswer {
    /// Where its polls come from.
    pub address: IpAddr,
    /// How its latest poll proved that it comes from a load balancer; the waits, the
    /// last-server guard and `status` believe only a proven poller's word.
    pub proof: Proof,
    /// The key file's line of the key it proves itself with: one load balancer per key, so
    /// two at one address are told apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_line: Option<usize>,
    /// How long ago its first remembered poll was.
    pub first_ms_ago: u64,
    /// How long ago its latest poll was.
    pub last_ms_ago: u64,
    /// How many polls it made since the first, of either kind.
    pub polls: u32,
    /// What its HTTP checks were told.
    pub http: Option<ToldAnswer>,
    /// What its agent checks were told.
    pub agent: Option<ToldAnswer>,
    /// It polls at a steady rhythm (a load balancer), as opposed to an address seen once or
    /// twice: an unproven poller is waited for only once regular.
    pub regular: bool,
    /// It still polls: silent for no longer than three of its own intervals between polls
    /// ([`crate::responder::server_line::polling`]). Whoever no longer polls is not waited for,
    /// and its word holds nothing.
    pub polling: bool,
    /// The client its latest HTTP poll named in `User-Agent` (`curl`); none for HAProxy, whose
    /// checks send no such header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// The latest `X-Haproxy-Server-State` it sent (`http-check send-state`), one per server
    /// line it checks this node for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<StateAnswer>,
    /// How long ago the latest state header its checks stopped sending was sent: its later
    /// checks carry none (`http-check send-state` is gone from its backend), so that header
    /// is no longer its view, and is left out of `states`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub states_stopped_ms_ago: Option<u64>,
    /// How long ago its latest agent check was, when its agent checks fell silent while its
    /// HTTP checks went on (`agent-check` gone from its server line): what they were told is
    /// no longer its state, nor is the weight read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_stopped_ms_ago: Option<u64>,
}

/// One server line a load balancer checks this node for (its backend and server), as its
/// latest HTTP check's `X-Haproxy-Server-State` said. HAProxy writes the header before it
/// reads that check's answer: it shows the effect of the answers before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateAnswer {
    /// How long ago it was sent.
    pub last_ms_ago: u64,
    /// What the check that carried it was answered.
    pub told: Verdict,
    /// How long ago this server line's checks began to be answered `told`, in a row.
    pub since_ms_ago: u64,
    /// The line is still checked: its header came within three of its own intervals.
    pub polling: bool,
    /// The check that carried it was answered as not drained although the node is: the
    /// drain was held at this line ([`crate::health::hold`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Held>,
    /// What the drain rule meets at this line now: a drain whose every holder may be held is
    /// held here, for this reason. What `drain` and `cycle` ask before they write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holds: Option<Held>,
    /// What this line's agent checks were told, when they name it (`agent-send`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<ToldAnswer>,
    /// The header as read; `None` when it was malformed.
    pub seen: Option<LbState>,
    /// Why the header was refused, if it was.
    pub malformed: Option<String>,
}

/// What one kind of check was told last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToldAnswer {
    /// The verdict of the latest answer.
    pub told: Verdict,
    /// How many answers in a row carried it.
    pub times: u32,
    /// How long ago the latest answer was.
    pub last_ms_ago: u64,
    /// How long ago the first answer of this run was.
    pub since_ms_ago: u64,
}

/// The established connections to Puppet Server's listener, without pmcheck's own probes;
/// bounded however many there are ([`crate::responder::agents`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrafficAnswer {
    /// The listener watched: the address pmcheck probes.
    pub listener: SocketAddr,
    /// The remote end of the first connections (for agents through HAProxy, HAProxy's
    /// address), at most [`crate::responder::agents::LISTED`].
    pub connections: Vec<SocketAddr>,
    /// How many connections there are.
    pub total: usize,
    /// Connections per source address, the busiest first, at most
    /// [`crate::responder::agents::SOURCES`].
    pub sources: Vec<SourceAnswer>,
    /// How many more source addresses there are.
    pub other_sources: usize,
    /// Why the connections cannot be read, if they cannot.
    pub problem: Option<String>,
    /// How long before the answer the tables were read (a read serves requests for
    /// [`crate::responder::agents::FRESH`]); `None` when they could not be.
    pub age_ms: Option<u64>,
}

/// How many connections come from one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceAnswer {
    /// The address.
    pub address: IpAddr,
    /// Its connections.
    pub connections: usize,
}

impl TrafficAnswer {
    /// The connections to `listener` cannot be read, because of `problem`.
    pub fn unreadable(listener: SocketAddr, problem: String) -> Self {
        Self {
            listener,
            connections: Vec::new(),
            total: 0,
            sources: Vec::new(),
            other_sources: 0,
            problem: Some(problem),
            age_ms: None,
        }
    }
}
