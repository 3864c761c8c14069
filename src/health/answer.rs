//! The answer to a poll: what a load balancer, a monitoring check and the tests read, as one
//! type that serializes to the JSON body (`Accept: application/json`) and reads it back. The
//! operator's `/status` carries it with what only the operator reads
//! ([`crate::protocol`]).
//!
//! Fields borrow while an answer is rendered and own after it is read back: [`Answer<'static>`]
//! is what [`Answer::from_json`] returns.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::health::verdict::Verdict;
use crate::health::weight::WeightCause;
use crate::puppet::pool::{Load, Pool};

/// The whole answer to a poll.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer<'a> {
    /// The first word of the text body.
    pub verdict: Verdict,
    /// The HTTP status HAProxy acts on: 200 for OK, 503 otherwise (404 for a drain with
    /// `--drained-status 404`).
    pub status: u16,
    /// Why, in one line.
    pub reason: Cow<'a, str>,
    /// The drain record, when there is one (also an expired one); `None` when not drained or
    /// when the record cannot be read (the reason says why).
    pub drain: Option<DrainAnswer<'a>>,
    /// The latest probe of Puppet Server.
    pub probe: ProbeAnswer<'a>,
    /// The agent-check weight in percent: 100 for a warm idle node, less when busy, warming
    /// or ramping up after coming back, the floor when not OK.
    pub weight: u8,
    /// Why the weight is what it is.
    pub weight_cause: WeightCause,
    /// How loaded Puppet Server's JRuby pool is, when it can compile and reported it.
    pub load: Option<Load>,
    /// Puppet Server's JRuby pool as last reported; `None` when it gave no numbers.
    pub pool: Option<Cow<'a, Pool>>,
}

/// The drain record as found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainAnswer<'a> {
    /// Why the node is drained; `None` when the file is not a valid record.
    pub reason: Option<Cow<'a, str>>,
    /// Who drained it.
    pub by: Option<Cow<'a, str>>,
    /// Since when (RFC 3339).
    pub since: Option<Cow<'a, str>>,
    /// Until when, for `drain --for` (RFC 3339).
    pub until: Option<Cow<'a, str>>,
    /// The `until` time has passed: the drain no longer counts.
    pub expired: bool,
    /// What is wrong with the file, if anything.
    pub problem: Option<Cow<'a, str>>,
}

/// The latest probe, as the verdict used it (by default, none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeAnswer<'a> {
    /// Puppet Server answered `running` and can compile: `outcome` is `healthy`.
    pub ok: bool,
    /// What the probe found, for the operator's tools to decide on.
    pub outcome: ProbeState,
    /// `running`, or what went wrong.
    pub detail: Cow<'a, str>,
    /// How long the probe took; `None` before the first probe.
    pub latency_ms: Option<u64>,
    /// How old the probe is; `None` before the first probe.
    pub age_ms: Option<u64>,
    /// The URL probed; `None` when no request was made.
    pub endpoint: Option<Cow<'a, str>>,
    /// When the Puppet Server process it reached started (RFC 3339), when the prober knows:
    /// a stop's hold older than that no longer holds the node while the probe is healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
}

impl ProbeAnswer<'_> {
    /// When the Puppet Server it found healthy started, when known
    /// ([`crate::health::hold::live`]).
    pub fn started_healthy(&self) -> Option<std::time::SystemTime> {
        let started = self.started.as_deref().filter(|_| self.healthy())?;
        humantime::parse_rfc3339(started).ok()
    }

    /// Puppet Server runs and can compile.
    pub fn healthy(&self) -> bool {
        self.outcome == ProbeState::Healthy
    }
}

/// What a probe found, in the JSON answer: [`crate::puppet::report::ProbeOutcome`] without
/// its details, which `detail` says in words.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeState {
    /// Puppet Server runs and can compile.
    Healthy,
    /// Puppet Server answers but cannot compile yet.
    NotReady,
    /// Puppet Server failed the probe.
    Unhealthy,
    /// The probe could not be made.
    CannotTell,
    /// No probe has finished yet.
    #[default]
    None,
}

/// `body` as a JSON body, one line and a newline; an UNKNOWN answer saying why when it cannot
/// be rendered (a load balancer then reads a 503's words, never half a body).
pub fn json_line(body: &impl Serialize) -> String {
    let mut json = serde_json::to_string(body).unwrap_or_else(|e| {
        format!(r#"{{"verdict":"UNKNOWN","status":503,"reason":"cannot render JSON: {e}"}}"#)
    });
    json.push('\n');
    json
}

impl Answer<'_> {
    /// Reads a JSON body back.
    pub fn from_json(text: &str) -> serde_json::Result<Answer<'static>> {
        serde_json::from_str(text)
    }
}
