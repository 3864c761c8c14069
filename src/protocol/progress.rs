//! Where a change stands, as the daemon decides it (`responder::progress`) and publishes it in
//! `/status`: for a drain, an undrain and a restart, what is met and what is pending (each with
//! who and since), and one boolean each for "safe to stop" and "in rotation everywhere". Every
//! command renders it; none decides it again.

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::protocol::lines::Blocker;

/// What the asker waits with: its `--polls` and `--lb-interval`, and for a restart how long
/// before the request its command ended. Sent as `/status`'s query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// Answers in a row a load balancer without `send-state` needs (HAProxy's fall and rise).
    pub polls: u32,
    /// The longest check interval of the load balancers.
    pub lb_interval: Duration,
    /// How long before the request the restart's command ended: only a probe younger than
    /// that shows Puppet Server healthy again. `None`: any probe.
    pub ended: Option<Duration>,
}

impl Default for Ask {
    /// `pmcheck status`'s: the waits' defaults.
    fn default() -> Self {
        Self {
            polls: 3,
            lb_interval: Duration::from_secs(2),
            ended: None,
        }
    }
}

impl Ask {
    /// `polls=3&lb_interval_ms=2000[&ended_ms_ago=N]`.
    pub fn query(&self) -> String {
        let mut q = format!(
            "polls={}&lb_interval_ms={}",
            self.polls,
            self.lb_interval.as_millis()
        );
        if let Some(ended) = self.ended {
            q.push_str(&format!("&ended_ms_ago={}", ended.as_millis()));
        }
        q
    }

    /// Reads a query as [`Ask::query`] writes it; what is absent keeps its default.
    pub fn from_query(query: Option<&str>) -> Result<Self, String> {
        let mut ask = Ask::default();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let number = || {
                value.parse::<u64>().map_err(|_| {
                    format!("/status?{name}={value}: not a whole number; pmcheck sends it itself")
                })
            };
            match name {
                "polls" => {
                    ask.polls = u32::try_from(number()?).unwrap_or(u32::MAX).clamp(1, 100);
                }
                "lb_interval_ms" => ask.lb_interval = Duration::from_millis(number()?),
                "ended_ms_ago" => ask.ended = Some(Duration::from_millis(number()?)),
                _ => {}
            }
        }
        Ok(ask)
    }
}

/// Where a drain, an undrain and a restart stand now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The `--polls` it was decided with.
    pub polls: u32,
    /// The `--lb-interval` it was decided with.
    pub lb_interval_ms: u64,
    /// A drain: told, acted on by each load balancer, sessions and agents gone, JRubies idle.
    pub drain: Stage,
    /// An undrain: told, back (UP) at each load balancer.
    pub undrain: Stage,
    /// A restart: Puppet Server healthy with its pool full, on a probe made after its
    /// command ended.
    pub healthy: Stage,
    /// The drain stage is met: safe to stop Puppet Server.
    pub safe_to_stop: bool,
    /// The undrain stage is met: in rotation at every load balancer.
    pub in_rotation: bool,
}

/// One goal's state: met when nothing is pending.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stage {
    /// What is met so far, for a person.
    pub met: Vec<String>,
    /// What is still missing; empty when the goal is reached.
    pub pending: Vec<Pending>,
    /// What the operator should know although the goal is reached (a backend left with no
    /// server taking traffic).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The pollers that have acted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acted: Vec<IpAddr>,
    /// How long ago the latest of them acted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acted_ms_ago: Option<u64>,
    /// Where the drain is held ([`crate::health::hold`]): it does not take effect there until
    /// another server takes agents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<Blocker>,
    /// Agent connections seen (a drain).
    #[serde(default)]
    pub connections: usize,
    /// The daemon answers as the goal wants and every poller has acted on it (a drain: no
    /// new agent comes).
    #[serde(default)]
    pub every_poller_acted: bool,
}

/// One thing still missing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// The poller it waits for, if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub who: Option<IpAddr>,
    /// How long ago what it waits on last changed (the poller's latest check, the answers'
    /// run), when it is about one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms_ago: Option<u64>,
    /// What is missing, for a person.
    pub what: String,
}

impl Stage {
    /// The goal is reached.
    pub fn met(&self) -> bool {
        self.pending.is_empty()
    }

    /// What is missing, joined for one line.
    pub fn missing(&self) -> String {
        let said: Vec<&str> = self.pending.iter().map(|p| p.what.as_str()).collect();
        said.join("; ")
    }

    /// Notes that `who` acted, `ago` milliseconds ago.
    pub(crate) fn acted_by(&mut self, who: IpAddr, ago: u64) {
        self.acted.push(who);
        self.acted_ms_ago = Some(self.acted_ms_ago.map_or(ago, |was| was.min(ago)));
    }

    /// Adds what is missing, of nobody in particular.
    pub(crate) fn pend(&mut self, what: String) {
        self.pend_of(None, None, what);
    }

    /// Adds what is missing of `who`, as of `since_ms_ago`.
    pub(crate) fn pend_of(&mut self, who: Option<IpAddr>, since_ms_ago: Option<u64>, what: String) {
        self.pending.push(Pending {
            who,
            since_ms_ago,
            what,
        });
    }
}
