//! The daemon's own settings: what only the command line and the environment set (where it
//! listens, who may poll, how often it probes, how it answers), their options' definitions
//! (the help text) and where each value came from.

// The doc comments are clap's help text, where `[::]:9200` is an address, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::allow::parse_network;
use super::duration::{self, parse_duration, parse_duration_or_off};
use super::{Given, Row};

/// The daemon's own settings: where it listens, who may poll, how often it probes, how it
/// answers. `serve` and `config` take them, so `config` shows what the daemon will use.
#[derive(Debug, Clone, Args)]
pub struct Daemon {
    /// Address to listen on (repeatable; in the environment, comma-separated) [default: [::]:9200, or 0.0.0.0:9200 without IPv6]
    #[arg(
        long,
        env = "PMCHECK_LISTEN",
        value_name = "ADDR:PORT",
        value_delimiter = ','
    )]
    pub(crate) listen: Vec<SocketAddr>,
    /// How often Puppet Server may be probed, however many pollers there are
    #[arg(long, env = "PMCHECK_INTERVAL", value_name = "DURATION", value_parser = parse_duration, default_value = "1s")]
    pub(crate) interval: Duration,
    /// Accept polls only from this network, checked before a byte is read (repeatable; in the environment, comma-separated) [default: from anywhere]
    #[arg(
        long,
        env = "PMCHECK_ALLOW",
        value_name = "CIDR",
        value_delimiter = ',',
        value_parser = parse_network
    )]
    pub(crate) allow: Vec<ipnet::IpNet>,
    /// File of the load balancers' keys (one per line, each followed by the addresses that may send it: `KEY 10.0.0.5`; at most 4; mode 0640): only an HTTP check that sends it in X-Pmcheck-Key (HAProxy: http-check send hdr X-Pmcheck-Key KEY) or an agent check that sends it (agent-send "BACKEND/SERVER KEY\n") counts as a load balancer's word for --wait, cycle, the last-server guard and status; a file that cannot be used never stops the daemon, and drain and cycle refuse until it is fixed [default: none]
    #[arg(long, env = "PMCHECK_LB_KEY_FILE", value_name = "PATH")]
    pub(crate) lb_key_file: Option<PathBuf>,
    /// Without --lb-key-file: polls from this network count as a load balancer's word (weaker: anything on that host passes) (repeatable; in the environment, comma-separated) [default: none]
    #[arg(
        long,
        env = "PMCHECK_LB_ADDRESS",
        value_name = "CIDR",
        value_delimiter = ',',
        value_parser = parse_network
    )]
    pub(crate) lb_address: Vec<ipnet::IpNet>,
    /// Most connections open at once; past it the oldest connection of the busiest source is closed
    #[arg(long, env = "PMCHECK_MAX_CONNECTIONS", value_name = "N", default_value = "1024", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_connections: u32,
    /// Most connections open at once from one address; past it that address's oldest is closed
    #[arg(long, env = "PMCHECK_MAX_CONNECTIONS_PER_SOURCE", value_name = "N", default_value = "256", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_connections_per_source: u32,
    /// Also answer HAProxy's agent check here: one line per connection with the node's state and a weight from Puppet Server's JRuby pool (repeatable; in the environment, comma-separated; the packaged service uses [::]:9201) [default: no agent check]
    #[arg(
        long,
        env = "PMCHECK_AGENT_LISTEN",
        value_name = "ADDR:PORT",
        value_delimiter = ','
    )]
    pub(crate) agent_listen: Vec<SocketAddr>,
    /// After Puppet Server comes back (a restart, a reload, an undrain), ramp the agent-check weight from 10% to 100% over this long; 0s turns it off
    #[arg(long, env = "PMCHECK_SLOW_START", value_name = "DURATION", value_parser = parse_duration_or_off, default_value = "60s")]
    pub(crate) slow_start: Duration,
    /// Show the deploy record (.r10k-deploy.json: commit, success, time) of this environment in status, the JSON and /metrics, never in the verdict (repeatable; in the environment, comma-separated; at most 16)
    #[arg(
        long,
        env = "PMCHECK_CODE_ENVIRONMENT",
        value_name = "NAME",
        value_delimiter = ',',
        default_value = "production",
        value_parser = parse_environment
    )]
    pub(crate) code_environment: Vec<String>,
    #[command(flatten)]
    pub(crate) drained: DrainedArgs,
}

/// How a drained node answers the HTTP check.
#[derive(Debug, Clone, Args)]
pub struct DrainedArgs {
    /// HTTP status of a drained answer: 503, or 404 for HAProxy's `http-check disable-on-404`, which shows a drain as NOLB instead of DOWN
    #[arg(long, env = "PMCHECK_DRAINED_STATUS", value_name = "CODE", default_value = "503", value_parser = DrainedStatus)]
    pub(crate) drained_status: u16,
}

/// `--drained-status`: its two values, which completions offer and help lists, and our own
/// words when a value is neither.
#[derive(Clone, Copy)]
struct DrainedStatus;

impl clap::builder::TypedValueParser for DrainedStatus {
    type Value = u16;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<u16, clap::Error> {
        // 503 or 404: the two statuses a load balancer can read as "take it out".
        let parse = |text: String| match text.trim() {
            "503" => Ok(503),
            "404" => Ok(404),
            _ => Err(
                "must be 503 (every load balancer: unhealthy) or 404 (HAProxy with `http-check disable-on-404`: NOLB)",
            ),
        };
        (clap::builder::StringValueParser::new().try_map(parse)).parse_ref(cmd, arg, value)
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(
            [
                clap::builder::PossibleValue::new("503").help("every load balancer: unhealthy"),
                clap::builder::PossibleValue::new("404")
                    .help("HAProxy with `http-check disable-on-404`: NOLB"),
            ]
            .into_iter(),
        ))
    }
}

/// A Puppet environment's name: lowercase letters, digits and underscores, as Puppet allows.
fn parse_environment(text: &str) -> Result<String, String> {
    let name = text.trim();
    let valid = (1..=64).contains(&name.len())
        && (name.bytes()).all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    valid.then(|| name.to_owned()).ok_or_else(|| {
        format!(
            "`{text}` is not a Puppet environment name: lowercase letters, digits and \
             underscores, at most 64 (production, feature_x)"
        )
    })
}

impl Daemon {
    /// The connection limits: the per-source one never above the total.
    pub fn limits(&self) -> Limits {
        Limits {
            total: self.max_connections as usize,
            per_source: self.max_connections_per_source.min(self.max_connections) as usize,
        }
    }

    /// `config`'s rows of the daemon's settings, given with the others in `given`.
    pub(crate) fn rows<'a>(&self, given: &'a Given) -> Vec<Row<'a>> {
        /// A list as `config` shows it, comma-separated; `none` when empty.
        fn joined<T: ToString>(list: &[T], none: &str) -> String {
            if list.is_empty() {
                return none.to_owned();
            }
            let shown: Vec<String> = list.iter().map(ToString::to_string).collect();
            shown.join(",")
        }
        let row = |name, value| given.row(name, value);
        let key_file = (self.lb_key_file.as_ref())
            .map_or_else(|| "(none)".to_owned(), |f| f.display().to_string());
        let slow_start = match self.slow_start {
            Duration::ZERO => "off".to_owned(),
            d => duration::format_duration(d),
        };
        vec![
            row("listen", joined(&self.listen, "[::]:9200")),
            row("agent-listen", joined(&self.agent_listen, "(none)")),
            row("allow", joined(&self.allow, "(anywhere)")),
            row("lb-key-file", key_file),
            row("lb-address", joined(&self.lb_address, "(none)")),
            row("interval", duration::format_duration(self.interval)),
            row("max-connections", self.max_connections.to_string()),
            row(
                "max-connections-per-source",
                self.max_connections_per_source.to_string(),
            ),
            row("slow-start", slow_start),
            row("drained-status", self.drained.drained_status.to_string()),
            row("code-environment", self.code_environment.join(",")),
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
