//! A probe's report: what it found out about Puppet Server, and when; the verdict ages it.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use crate::puppet::pause::Pause;
use crate::puppet::pool::{Load, Pool, Unready};
use crate::puppet::probe_error::{CannotProbe, ProbeError};

/// One probe: what it found and when.
#[derive(Debug)]
pub struct ProbeReport {
    /// What the probe found.
    pub outcome: ProbeOutcome,
    /// How long the probe took.
    pub latency: Duration,
    /// When it finished: the verdict ages reports from here.
    pub finished: Instant,
    /// The URL probed, without the query; `None` when no request was made.
    pub endpoint: Option<String>,
    /// The JRuby pool, when Puppet Server reported it (also when it cannot compile yet).
    pub pool: Option<Pool>,
    /// The pause in force, when the outcome is `Healthy(Some(Load::Paused))`.
    pub pause: Option<Pause>,
    /// When the Puppet Server process it reached started (its JVM's `start-time-ms`), when
    /// the prober knows it: a stop's hold older than that holds nothing once a healthy probe
    /// says so ([`crate::health::hold::live`]).
    pub started: Option<SystemTime>,
    /// The outcome in words, rendered once per probe so that every poll can borrow it.
    detail: String,
}

impl ProbeReport {
    /// A report of `outcome`, finished now.
    pub fn new(outcome: ProbeOutcome, latency: Duration, endpoint: Option<String>) -> Self {
        Self::with_pool(outcome, None, latency, endpoint)
    }

    /// A report of `outcome` with the pool it was read from, finished now.
    pub fn with_pool(
        outcome: ProbeOutcome,
        pool: Option<Pool>,
        latency: Duration,
        endpoint: Option<String>,
    ) -> Self {
        let detail = match (&outcome, &pool) {
            (ProbeOutcome::Healthy(Some(load)), Some(pool)) => pool.describe(*load),
            _ => outcome.to_string(),
        };
        Self {
            detail,
            outcome,
            latency,
            finished: Instant::now(),
            endpoint,
            pool,
            pause: None,
            started: None,
        }
    }

    /// A report of a paused pool: the pause's words are its detail.
    pub fn paused(
        pool: Option<Pool>,
        pause: Pause,
        latency: Duration,
        endpoint: Option<String>,
    ) -> Self {
        let mut report = Self::with_pool(
            ProbeOutcome::Healthy(Some(Load::Paused)),
            pool,
            latency,
            endpoint,
        );
        report.detail = pause.describe();
        report.pause = Some(pause);
        report
    }

    /// `running` (with the pool's numbers when known), or what went wrong, in plain words.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

/// What one probe found out about Puppet Server, kept apart from the node's verdict (which also
/// weighs the drain record and the report's age). Shown as `running`, or what went wrong, in
/// the words the verdict and `pmcheck status` show.
#[derive(Debug, thiserror::Error)]
pub enum ProbeOutcome {
    /// Puppet Server answered `running` and can compile; the load, when it reported its pool.
    #[error("running")]
    Healthy(Option<Load>),
    /// Puppet Server answers but cannot compile yet (starting, pool locked or empty).
    #[error(transparent)]
    NotReady(Unready),
    /// Puppet Server was asked and is not fit for agents: the error says how.
    #[error(transparent)]
    Unhealthy(ProbeError),
    /// The probe could not be made, so pmcheck cannot tell how Puppet Server is.
    #[error(transparent)]
    CannotTell(CannotProbe),
}

impl ProbeOutcome {
    /// Whether Puppet Server answered `running` and can compile.
    pub fn is_healthy(&self) -> bool {
        matches!(self, ProbeOutcome::Healthy(_))
    }
}

/// The latest probe report, shared between the prober and every poll.
pub type Latest = watch::Receiver<Option<Arc<ProbeReport>>>;
