//! The command line. Every option but the `--wait` and `--force` switches also reads
//! `PMCHECK_<OPTION>` so a systemd `EnvironmentFile` can configure the daemon without editing
//! the unit.
//!
//! One home for every subcommand's flags, their variables and their help, read a subcommand at
//! a time; the daemon's own, which `serve` and `config` share, are in [`crate::settings::daemon`].

// The doc comments are clap's help text, where `[::]:9200` is an address, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::settings::daemon::DrainedArgs;
use crate::settings::duration::parse_duration;
use crate::settings::{Daemon, Puppet, defaults};

/// The whole command line.
#[derive(Debug, Parser)]
#[command(
    name = "pmcheck",
    version,
    about = "Tell HAProxy whether this Puppet Server compile master may receive agent traffic",
    long_about = "pmcheck answers HAProxy's HTTP health checks (option httpchk) on port 9200. \
It probes the local Puppet Server's status API over mutual TLS with the host's own Puppet \
certificate and answers 200, or 503 with the reason. An operator drain record \
(`pmcheck drain`) forces 503 (or 404, as packaged for HAProxy's `http-check disable-on-404`) so the \
node leaves the pool while Puppet keeps running."
)]
pub struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the health responder daemon (also Prometheus metrics at GET /metrics).
    Serve(ServeArgs),
    /// Answer exactly one poll on stdin/stdout (for xinetd or a systemd Accept=yes socket).
    Inetd(InetdArgs),
    /// Probe Puppet Server once and print a monitoring-plugin line (exit 0 OK, 1 drained or paused, 2 down, 3 unknown).
    Check(CheckArgs),
    /// Print every resolved setting and where it came from.
    Config(ConfigArgs),
    /// Take this node out of the load balancer pool (the daemon answers DRAINED: 503, or 404 as packaged); with --wait, return once it is safe to stop Puppet Server.
    Drain(DrainArgs),
    /// Put this node back into the pool; with --wait, return once the load balancers took it back.
    Undrain(UndrainArgs),
    /// Drain, wait, run COMMAND (a restart, an upgrade), wait until Puppet Server can compile, undrain, wait; the node stays drained if anything fails.
    Cycle(CycleArgs),
    /// Ask the running daemon what it answers HAProxy now (exit 0 when it answers 200).
    Status(StatusArgs),
    /// Mark this master for one rolling restart (`begin`; refused, exit 77, while another roll's mark is here and has not lapsed) or take the mark away (`end`): one roll at a time, from any control node. A mark drains nothing.
    Roll(RollArgs),
    /// For pmcheck-drain-on-stop@.service, as Puppet Server's unit stops: drain, and wait (within --max-wait) until the load balancers have acted and the agents have left. Never fails the stop.
    OnStop(OnStopArgs),
    /// For pmcheck-drain-on-stop@.service, once Puppet Server's unit has started: let go of the hold `on-stop` took, once the daemon's next probe finds Puppet Server healthy (within --max-wait); every other drain stays.
    OnStart(OnStopArgs),
    /// What pmcheck-drain-on-stop@.service runs while Puppet Server's unit runs: `on-start` at once, then `on-stop` when systemd stops it (SIGTERM), so a stop needs no new process.
    StopGuard(GuardArgs),
    /// Print the man page or a shell completion script (for packaging).
    Generate {
        /// What to write.
        #[command(subcommand)]
        what: Generate,
    },
}

/// Where the drain record lives.
#[derive(Debug, Clone, Args)]
pub struct StateArgs {
    /// Directory of the drain record (DIR/drain)
    #[arg(long, env = "PMCHECK_STATE_DIR", value_name = "DIR", default_value = defaults::STATE_DIR)]
    pub(crate) state_dir: PathBuf,
}

/// `pmcheck serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub(crate) daemon: Daemon,
    #[command(flatten)]
    pub(crate) puppet: Puppet,
    #[command(flatten)]
    pub(crate) state: StateArgs,
}

/// `pmcheck inetd`.
#[derive(Debug, Args)]
pub struct InetdArgs {
    /// Longest wait for the request, from connection to the blank line ending its headers
    #[arg(long, env = "PMCHECK_READ_TIMEOUT", value_name = "DURATION", value_parser = parse_duration, default_value = "2s")]
    pub(crate) read_timeout: Duration,
    #[command(flatten)]
    pub(crate) drained: DrainedArgs,
    #[command(flatten)]
    pub(crate) puppet: Puppet,
    #[command(flatten)]
    pub(crate) state: StateArgs,
}

/// `pmcheck check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// WARNING when hostcert, a CA certificate of localcacert, or the CRL's nextUpdate falls due within this long (or a file cannot be read); the HTTP verdict never changes for it
    #[arg(long, env = "PMCHECK_WARN_EXPIRY", value_name = "DURATION", value_parser = parse_duration, default_value = "30d")]
    pub(crate) warn_expiry: Duration,
    /// CRITICAL when one falls due within this long, or is past it
    #[arg(long, env = "PMCHECK_CRIT_EXPIRY", value_name = "DURATION", value_parser = parse_duration, default_value = "7d")]
    pub(crate) crit_expiry: Duration,
    /// Where the line is compared with the daemon's answer, when one answers there: it may
    /// run as a user that cannot read what this check can.
    #[command(flatten)]
    pub(crate) daemon: DaemonUrl,
    #[command(flatten)]
    pub(crate) puppet: Puppet,
    #[command(flatten)]
    pub(crate) state: StateArgs,
}

/// `pmcheck config`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Also check that every file the daemon reads can be read: by you, and when you are root, by the user the unit runs the daemon as (its User= and SupplementaryGroups=); exit 78 on any problem
    #[arg(long)]
    pub(crate) check: bool,
    /// The service's environment file, read as systemd reads it; `none` for no file [default: /etc/default/pmcheck, else /etc/sysconfig/pmcheck]
    #[arg(long, env = "PMCHECK_ENV_FILE", value_name = "PATH")]
    pub(crate) env_file: Option<PathBuf>,
    /// With --check as root: the unit whose User= and SupplementaryGroups= the daemon runs with [default: the installed pmcheck.service]
    #[arg(long, value_name = "PATH")]
    pub(crate) unit: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) daemon: Daemon,
    #[command(flatten)]
    pub(crate) puppet: Puppet,
    #[command(flatten)]
    pub(crate) state: StateArgs,
}

/// How `--wait` and `cycle` wait: which daemon to ask, how long, how many polls.
#[derive(Debug, Clone, Args)]
pub struct WaitArgs {
    /// With --wait and in cycle: give up waiting after this long (exit 75; what the command changed stays changed); a cycle waits its turn this long too
    #[arg(long, env = "PMCHECK_MAX_WAIT", value_name = "DURATION", value_parser = parse_duration, default_value = "10m")]
    pub(crate) max_wait: Duration,
    /// With --wait and in cycle, for load balancers that do not send `http-check send-state`: answers in a row their HTTP check must get before they count as having acted (HAProxy's fall and rise); one agent-check answer suffices for a drain. A load balancer that sends its state is believed instead; one that does not prove itself (--lb-key-file) has acted once told the verdict for --polls x --lb-interval
    #[arg(long, env = "PMCHECK_POLLS", value_name = "N", default_value = "3", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) polls: u32,
    /// With --wait and in cycle: the longest check interval (inter, agent-inter) of the load balancers polling this node; a wait believes that none polls only after the daemon has listened for two of them
    #[arg(long, env = "PMCHECK_LB_INTERVAL", value_name = "DURATION", value_parser = parse_duration, default_value = "2s")]
    pub(crate) lb_interval: Duration,
    /// With --wait and in cycle: the daemon to ask what each load balancer was told.
    #[command(flatten)]
    pub(crate) daemon: DaemonUrl,
}

/// The running daemon the operator's commands ask, over plain HTTP on this host.
#[derive(Debug, Clone, Args)]
pub struct DaemonUrl {
    /// The running daemon to ask (its /status when the URL names no path)
    #[arg(
        long,
        env = "PMCHECK_URL",
        value_name = "URL",
        default_value = "http://127.0.0.1:9200/"
    )]
    pub(crate) url: String,
}

/// `pmcheck drain`.
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// Why the node is drained (shown to HAProxy's stats page and to whoever runs `pmcheck status`)
    #[arg(
        long,
        env = "PMCHECK_REASON",
        value_name = "TEXT",
        default_value = "drained by operator",
        value_parser = crate::drain::record::parse_reason
    )]
    pub(crate) reason: String,
    /// Undrain automatically after this long (for example 30m)
    #[arg(long = "for", env = "PMCHECK_FOR", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) for_: Option<Duration>,
    /// Then wait until it is safe to stop Puppet Server: every load balancer took the node out (by its own word with `http-check send-state`, else by what it was told), no agent connection and no borrowed JRuby is left
    #[arg(long)]
    pub(crate) wait: bool,
    /// Drain even when a load balancer says this node is the only server taking traffic in its backend (the drain record notes it)
    #[arg(long)]
    pub(crate) force: bool,
    #[command(flatten)]
    pub(crate) waiting: WaitArgs,
    #[command(flatten)]
    pub(crate) state: StateArgs,
}

/// `pmcheck undrain`.
#[derive(Debug, Args)]
pub struct UndrainArgs {
    /// Then wait until every load balancer polling was told OK often enough to take the node back
    #[arg(long)]
    pub(crate) wait: bool,
    /// Undrain even while a running `pmcheck cycle` holds the node drained
    #[arg(long)]
    pub(crate) force: bool,
    #[command(flatten)]
    pub(crate) waiting: WaitArgs,
    #[command(flatten)]
    pub(crate) state: StateArgs,
}

/// `pmcheck cycle`.
#[derive(Debug, Args)]
pub struct CycleArgs {
    /// Why, for the drain record [default: pmcheck cycle: COMMAND]
    #[arg(long, env = "PMCHECK_REASON", value_name = "TEXT", value_parser = crate::drain::record::parse_reason)]
    pub(crate) reason: Option<String>,
    /// Run even when a load balancer says this node is the only server taking traffic in its backend (the drain record notes it), or, once drained, that no server is left for agents
    #[arg(long)]
    pub(crate) force: bool,
    /// On SIGINT, SIGTERM or SIGHUP the command's process group gets the same signal and SIGTERM, and SIGKILL after this long (or at a second signal)
    #[arg(long, env = "PMCHECK_KILL_AFTER", value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    pub(crate) kill_after: Duration,
    #[command(flatten)]
    pub(crate) waiting: WaitArgs,
    #[command(flatten)]
    pub(crate) state: StateArgs,
    /// The command to run while drained, after `--`: `pmcheck cycle -- systemctl restart puppetserver`
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub(crate) command: Vec<std::ffi::OsString>,
}

/// `pmcheck on-stop` and `on-start`: their unit, whether they are on, and how they wait.
#[derive(Debug, Clone, Args)]
pub struct OnStopArgs {
    /// `no` turns draining on Puppet Server's stops off: `on-stop` then holds nothing (`on-start` still lets go of an earlier stop's hold)
    #[arg(long, env = "PMCHECK_DRAIN_ON_STOP", value_name = "yes|no", default_value = "yes", value_parser = parse_yes_no, action = clap::ArgAction::Set)]
    pub(crate) drain_on_stop: bool,
    /// Puppet Server's unit; `on-stop` holds the node only while systemd stops or restarts it (stopping pmcheck-drain-on-stop@ alone drains nothing)
    #[arg(long, value_name = "UNIT")]
    pub(crate) unit: Option<String>,
    #[command(flatten)]
    pub(crate) state: StateArgs,
    #[command(flatten)]
    pub(crate) waiting: WaitArgs,
}

/// `pmcheck stop-guard`.
#[derive(Debug, Args)]
pub struct GuardArgs {
    #[command(flatten)]
    pub(crate) on_stop: OnStopArgs,
    /// The service's environment file, read again at the stop as systemd reads `EnvironmentFile=`: `on-stop` runs with it as it is then; `none` for no file [default: /etc/default/pmcheck, else /etc/sysconfig/pmcheck]
    #[arg(long, env = "PMCHECK_ENV_FILE", value_name = "PATH")]
    pub(crate) env_file: Option<PathBuf>,
}

/// `yes` or `no` (also `true`/`false`, `on`/`off`, `1`/`0`), as systemd reads booleans.
fn parse_yes_no(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "yes" | "true" | "on" | "1" => Ok(true),
        "no" | "false" | "off" | "0" => Ok(false),
        _ => Err(format!("`{value}` is neither yes nor no")),
    }
}

/// `pmcheck status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The daemon to ask.
    #[command(flatten)]
    pub(crate) daemon: DaemonUrl,
    /// Print the daemon's JSON answer as it is
    #[arg(long, env = "PMCHECK_JSON")]
    pub(crate) json: bool,
    /// Show the last N drain events (who drained what, when; 20 without N) from the state
    /// directory's event log instead of asking the daemon (root or group pmcheck)
    #[arg(
        long,
        value_name = "N",
        num_args = 0..=1,
        default_missing_value = "20",
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub(crate) history: Option<u16>,
    #[command(flatten)]
    pub(crate) state: StateArgs,
}

/// `pmcheck roll`.
#[derive(Debug, Args)]
pub struct RollArgs {
    /// Mark this master for the roll, or take its mark away
    #[arg(value_enum)]
    pub(crate) step: RollStep,
    /// The roll's name, the same on every master it marks (the playbook's names its control node and start)
    #[arg(long, value_name = "NAME", required_unless_present = "force", value_parser = parse_roll_name)]
    pub(crate) name: Option<String>,
    /// `begin`: what the roll runs, shown with its mark [default: a rolling restart]
    #[arg(long, value_name = "TEXT", value_parser = crate::drain::record::parse_reason)]
    pub(crate) reason: Option<String>,
    /// `begin`: the mark lapses after this long, so that a roll whose control node died keeps no other out for good [default: 4h]
    #[arg(long = "for", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) lasting: Option<Duration>,
    /// `end`: take the mark away whosever it is (or whatever the file holds)
    #[arg(long)]
    pub(crate) force: bool,
    #[command(flatten)]
    pub(crate) state: StateArgs,
}

/// `pmcheck roll`'s two steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RollStep {
    /// Mark this master for the roll
    Begin,
    /// Take the roll's mark away
    End,
}

/// A roll's name: one line, not empty, at most 128 characters.
fn parse_roll_name(text: &str) -> Result<String, String> {
    let limit = crate::drain::roll::NAME_LIMIT;
    match text {
        "" => Err("is empty; name the roll (the playbook uses its control node and start)".into()),
        t if t.chars().any(char::is_control) => Err("must be one line of printable text".into()),
        t if t.chars().count() > limit => Err(format!("is longer than {limit} characters")),
        // Kept as written, so that `end` finds the mark `begin` made under the same name.
        t if crate::text::one_line(t, limit) != t => Err(
            "must not begin or end with a space, nor have two spaces in a row or any other blank"
                .into(),
        ),
        t => Ok(t.to_owned()),
    }
}

/// What `pmcheck generate` writes.
#[derive(Debug, Subcommand)]
pub enum Generate {
    /// The pmcheck(1) man page, in roff; read it with `pmcheck generate man | man -l -`
    Man,
    /// A completion script for SHELL (bash, zsh, fish, elvish, powershell)
    Completions {
        /// bash, zsh, fish, elvish or powershell
        shell: clap_complete::Shell,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::CommandFactory;

    /// The packaged settings file is where operators find settings: a new PMCHECK_* of
    /// `serve` missing from it is a setting nobody knows about (the Puppet module's own check
    /// catches it too, but only in the slow package run).
    #[test]
    fn every_setting_of_serve_is_in_the_packaged_file() {
        let packaged = include_str!("../packaging/defaults/pmcheck");
        let cli = Cli::command();
        let serve = cli
            .find_subcommand("serve")
            .expect("pmcheck has a serve subcommand");
        let missing: Vec<String> = serve
            .get_arguments()
            .filter_map(|a| a.get_env())
            .map(|v| v.to_string_lossy().into_owned())
            .filter(|var| {
                !packaged
                    .lines()
                    .any(|l| l.trim_start_matches('#').starts_with(&format!("{var}=")))
            })
            .collect();
        assert!(
            missing.is_empty(),
            "not in packaging/defaults/pmcheck: {missing:?}"
        );
    }
}
