//! The daemon's own settings: what only the command line and the environment set (where it
//! listens, who may poll, how often it probes, how it answers), each with its source.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

use super::{Setting, Source, duration};

/// The daemon's own settings, each with where it came from: what nothing but the command line
/// and the environment sets.
#[derive(Debug, Clone)]
pub struct Daemon {
    /// `--listen`; empty for `[::]:9200` (or `0.0.0.0:9200` without IPv6).
    pub listen: Setting<Vec<SocketAddr>>,
    /// `--agent-listen`; empty for no agent check.
    pub agent_listen: Setting<Vec<SocketAddr>>,
    /// `--allow`; empty for everyone.
    pub allow: Setting<Vec<IpNet>>,
    /// `--lb-key-file`: the load balancers' keys.
    pub lb_key_file: Setting<Option<PathBuf>>,
    /// `--lb-address`: without a key file, the load balancers' addresses.
    pub lb_addresses: Setting<Vec<IpNet>>,
    /// `--interval`: how often Puppet Server may be probed.
    pub interval: Setting<Duration>,
    /// `--max-connections`.
    pub max_connections: Setting<u32>,
    /// `--max-connections-per-source`.
    pub max_connections_per_source: Setting<u32>,
    /// `--slow-start`; zero for off.
    pub slow_start: Setting<Duration>,
    /// `--drained-status`: 503, or 404 for `http-check disable-on-404`.
    pub drained_status: Setting<u16>,
    /// `--code-environment`: the environments whose deploy records are shown.
    pub code_environments: Setting<Vec<String>>,
}

impl Daemon {
    /// The connection limits: the per-source one never above the total.
    pub fn limits(&self) -> Limits {
        let total = self.max_connections.value;
        Limits {
            total: total as usize,
            per_source: self.max_connections_per_source.value.min(total) as usize,
        }
    }

    /// `config`'s rows of the daemon's settings.
    pub(crate) fn rows(&self) -> Vec<(&'static str, String, &Source)> {
        /// A list as `config` shows it, comma-separated; `none` when empty.
        fn joined<T: ToString>(list: &[T], none: &str) -> String {
            if list.is_empty() {
                return none.to_owned();
            }
            let shown: Vec<String> = list.iter().map(ToString::to_string).collect();
            shown.join(",")
        }
        let slow_start = match self.slow_start.value {
            Duration::ZERO => "off".to_owned(),
            d => duration::format_duration(d),
        };
        vec![
            (
                "listen",
                joined(&self.listen.value, "[::]:9200"),
                &self.listen.source,
            ),
            (
                "agent-listen",
                joined(&self.agent_listen.value, "(none)"),
                &self.agent_listen.source,
            ),
            (
                "allow",
                joined(&self.allow.value, "(anywhere)"),
                &self.allow.source,
            ),
            (
                "lb-key-file",
                (self.lb_key_file.value.as_ref())
                    .map_or_else(|| "(none)".to_owned(), |f| f.display().to_string()),
                &self.lb_key_file.source,
            ),
            (
                "lb-address",
                joined(&self.lb_addresses.value, "(none)"),
                &self.lb_addresses.source,
            ),
            (
                "interval",
                duration::format_duration(self.interval.value),
                &self.interval.source,
            ),
            (
                "max-connections",
                self.max_connections.value.to_string(),
                &self.max_connections.source,
            ),
            (
                "max-connections-per-source",
                self.max_connections_per_source.value.to_string(),
                &self.max_connections_per_source.source,
            ),
            ("slow-start", slow_start, &self.slow_start.source),
            (
                "drained-status",
                self.drained_status.value.to_string(),
                &self.drained_status.source,
            ),
            (
                "code-environment",
                self.code_environments.value.join(","),
                &self.code_environments.source,
            ),
        ]
    }
}

/// How many connections may be open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// In all.
    pub total: usize,
    /// From one address.
    pub per_source: usize,
}
