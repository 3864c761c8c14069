//! The daemon's own settings: what only the command line and the environment set (where it
//! listens, who may poll, how often it probes, how it answers), each with its source.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

use super::{Row, Setting, duration, row};

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
    pub(crate) fn rows(&self) -> Vec<Row<'_>> {
        /// A list as `config` shows it, comma-separated; `none` when empty.
        fn joined<T: ToString>(list: &[T], none: &str) -> String {
            if list.is_empty() {
                return none.to_owned();
            }
            let shown: Vec<String> = list.iter().map(ToString::to_string).collect();
            shown.join(",")
        }
        let duration = |d: &Duration| duration::format_duration(*d);
        vec![
            row("listen", &self.listen, |l| joined(l, "[::]:9200")),
            row("agent-listen", &self.agent_listen, |l| joined(l, "(none)")),
            row("allow", &self.allow, |l| joined(l, "(anywhere)")),
            row("lb-key-file", &self.lb_key_file, |f| {
                f.as_ref()
                    .map_or_else(|| "(none)".to_owned(), |f| f.display().to_string())
            }),
            row("lb-address", &self.lb_addresses, |l| joined(l, "(none)")),
            row("interval", &self.interval, duration),
            row("max-connections", &self.max_connections, u32::to_string),
            row(
                "max-connections-per-source",
                &self.max_connections_per_source,
                u32::to_string,
            ),
            row("slow-start", &self.slow_start, |d| match *d {
                Duration::ZERO => "off".to_owned(),
                d => duration::format_duration(d),
            }),
            row("drained-status", &self.drained_status, u16::to_string),
            row("code-environment", &self.code_environments, |l| l.join(",")),
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
