//! The waits' vocabulary: what a wait waits for ([`Goal`]) and how it waits ([`Wait`]). Where a
//! goal stands is the daemon's answer ([`crate::protocol::progress`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::cli::{StateArgs, WaitArgs};
use crate::drain::file::DrainFile;
use crate::protocol::progress::{Ask, Progress, Stage};

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
    pub drain_file: PathBuf,
}

impl Wait {
    /// How the waits of a command ask about the drain record in `state`, from its command line.
    pub fn of(args: &WaitArgs, state: &StateArgs) -> Self {
        Self {
            max_wait: args.max_wait,
            polls: args.polls,
            lb_interval: args.lb_interval,
            drain_file: DrainFile::new(&state.state_dir).resolved(),
        }
    }

    /// What the daemon is asked with for `goal`, asked at `asked`.
    pub fn ask(&self, goal: Goal, asked: Instant) -> Ask {
        Ask {
            polls: self.polls,
            lb_interval: self.lb_interval,
            ended: match goal {
                Goal::Healthy { since } => Some(asked.saturating_duration_since(since)),
                _ => None,
            },
        }
    }
}

impl Goal {
    /// Its stage in the daemon's `progress`.
    pub fn of(self, progress: &Progress) -> &Stage {
        match self {
            Goal::Drained => &progress.drain,
            Goal::Undrained => &progress.undrain,
            Goal::Healthy { .. } => &progress.healthy,
        }
    }
}
