//! The probe: one HTTPS GET of Puppet Server's status API, as this host, verified against the
//! Puppet CA, turned into a [`ProbeReport`] that says in plain words what was seen.
//!
//! It asks the `jruby-metrics` status service: one request says both that Puppet Server runs
//! (the service's `state`) and whether it can compile (its JRuby pool). Servers without that
//! service fall back along [`crate::puppet::status_api::FALLBACKS`] to the `simple` status, which says `running` only.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use crate::puppet::client::ProbeTarget;
use crate::puppet::client::PuppetClient;
use crate::puppet::pause::{self, Pause, PauseWatch};
use crate::puppet::pool::{Pool, Unready};
use crate::puppet::probe_error::{Body, ProbeError, undecodable};
use crate::puppet::report::{ProbeOutcome, ProbeReport};
use crate::puppet::status_api::{Seen, next_path, read_answer};
use crate::puppet::wedge::WedgeWatch;
use crate::text;

/// The largest status body we read. The pool's answer lists every compiling and waiting
/// request (a few hundred bytes each), so a saturated server's answer can be large.
const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// After this many probes on a fallback path, the configured path is tried again: one
/// transient `service-not-found` must not blind the probe to the pool for good.
const FALLBACK_PROBES: u32 = 30;

/// What one attempt found: an outcome with the pool it read, or a pause (with the pool, when
/// Puppet Server answered).
enum Found {
    Outcome(ProbeOutcome, Option<Pool>),
    Paused(Option<Pool>, Pause),
}

/// Probes one Puppet Server through its [`PuppetClient`], remembering the status path that
/// works and what earlier probes saw (a pause, a wedge, the queue-limit count).
pub struct Prober {
    target: ProbeTarget,
    path: String,
    client: Arc<PuppetClient>,
    /// The queue-limit count of the previous probe: a rise means requests were refused.
    queue_limit_hits: Option<u64>,
    /// Tells a paused pool from one that is starting.
    pauses: PauseWatch,
    /// Tells a busy pool from one that only fails its borrows.
    wedge: WedgeWatch,
    /// Probes made on a fallback path since the configured one answered 404.
    on_fallback: u32,
    /// One probe without history (`pmcheck check`): a JVM up for longer than the grace is
    /// presumed to have had its pool ready before.
    once: bool,
}

impl Prober {
    /// A prober for `target`; the TLS client is built at the first probe.
    pub fn new(target: ProbeTarget) -> Self {
        Self {
            path: target.settings.given.puppet.status_path.clone(),
            pauses: PauseWatch::new(target.settings.given.puppet.pause_grace),
            wedge: WedgeWatch::new(target.settings.given.puppet.wedged_after),
            client: Arc::new(PuppetClient::new(target.clone())),
            target,
            queue_limit_hits: None,
            on_fallback: 0,
            once: false,
        }
    }

    /// The client the prober asks with, for the other readers of Puppet Server's status.
    pub fn client(&self) -> Arc<PuppetClient> {
        Arc::clone(&self.client)
    }

    /// A prober for a single probe (`pmcheck check`, inetd), which has seen no earlier probe: a pool
    /// locked in a JVM up for longer than `--pause-grace` counts as paused, from the lock's own
    /// time; a refill, or a lock that does not say when it was taken, does not.
    pub fn once(target: ProbeTarget) -> Self {
        Self {
            once: true,
            ..Self::new(target)
        }
    }

    /// SIGHUP: drops the TLS client, so the next probe loads the certificate files again, and
    /// tries the configured status path again.
    pub async fn reload(&mut self) {
        self.client.reload().await;
        self.reload_path();
    }

    /// The URL probed now, without the query.
    pub fn endpoint(&self) -> String {
        self.client.url(&self.path)
    }

    /// One probe, never longer than the target's timeout.
    pub async fn probe(&mut self) -> ProbeReport {
        let started = Instant::now();
        // The deadline is kept twice, by this timeout and by the HTTP client's own: either
        // may fire first, and both mean the same.
        let deadline = self.target.settings.given.puppet.timeout;
        let found = match tokio::time::timeout(deadline, self.attempt()).await {
            Ok(Found::Outcome(ProbeOutcome::Unhealthy(ProbeError::Timeout { .. }), _)) | Err(_) => {
                match self.pauses.goes_on(Instant::now(), true) {
                    // A refill can keep the status API from answering for seconds.
                    Some(Ok(pause)) => Found::Paused(None, pause),
                    Some(Err(why)) => Found::Outcome(ProbeOutcome::NotReady(why), None),
                    None => Found::Outcome(
                        ProbeOutcome::Unhealthy(ProbeError::Timeout {
                            addr: self.client.addr(),
                            after: deadline,
                        }),
                        None,
                    ),
                }
            }
            Ok(found) => found,
        };
        let endpoint = Some(self.endpoint());
        let mut report = match found {
            Found::Outcome(outcome, pool) => {
                ProbeReport::with_pool(outcome, pool, started.elapsed(), endpoint)
            }
            Found::Paused(pool, pause) => {
                ProbeReport::paused(pool, pause, started.elapsed(), endpoint)
            }
        };
        report.started =
            (self.pauses.started()).map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
        report
    }

    async fn attempt(&mut self) -> Found {
        let client = match self.client.http().await {
            Ok(client) => client,
            Err(cannot) => return Found::Outcome(ProbeOutcome::CannotTell(cannot), None),
        };
        if self.path != self.target.settings.given.puppet.status_path {
            self.on_fallback += 1;
            if self.on_fallback > FALLBACK_PROBES {
                self.reload_path();
            }
        }
        let answered = loop {
            match self.get(&client).await {
                // A server that reported its pool since it started does not lose the pool
                // service for good: no fallback (a `running` without numbers would be 200
                // for an empty pool), the pool is unreported.
                Ok(Seen::NotFound)
                    if self.pauses.was_ready()
                        && self.path == self.target.settings.given.puppet.status_path =>
                {
                    return self.unreported();
                }
                // The status service's own 404: no such service or status route here.
                Ok(Seen::NotFound) if let Some(next) = next_path(&self.path) => {
                    tracing::info!(
                        path = %self.path,
                        next = %next,
                        "Puppet Server has no such status path; using the next from now on"
                    );
                    self.path = next.to_owned();
                }
                other => break other,
            }
        };
        match answered {
            Ok(Seen::Running(None)) => Found::Outcome(ProbeOutcome::Healthy(None), None),
            Ok(Seen::Running(Some(mut pool))) => {
                pool.multithreaded = self.target.settings.multithreaded.value;
                let previous = self.queue_limit_hits.replace(pool.queue_limit_hits);
                let new_hits = previous.map_or(0, |p| pool.queue_limit_hits.saturating_sub(p));
                let wedged = self.wedge.observe(&pool, Instant::now(), SystemTime::now());
                match pool.capacity(new_hits) {
                    Ok(_) if let Some(why) = wedged => {
                        Found::Outcome(ProbeOutcome::NotReady(why), Some(pool))
                    }
                    Ok(load) => {
                        // Once per Puppet Server process: its JVM, to recognise it later.
                        let jvm = if self.once || self.pauses.was_ready() {
                            None
                        } else {
                            self.client.jvm_start(&client).await
                        };
                        self.pauses.ready(jvm);
                        Found::Outcome(ProbeOutcome::Healthy(Some(load)), Some(pool))
                    }
                    Err(why) => self.unready(&client, why, pool).await,
                }
            }
            Ok(Seen::Unready(why)) => {
                self.pauses.restarted();
                self.wedge.restarted();
                Found::Outcome(ProbeOutcome::NotReady(why), None)
            }
            // The last path there is to try.
            Ok(Seen::NotFound) => Found::Outcome(
                ProbeOutcome::Unhealthy(ProbeError::Status {
                    status: 404,
                    body: Body::Text(format!("not found: {}", self.path)),
                }),
                None,
            ),
            Err(e) => {
                if matches!(e, ProbeError::Refused { .. }) {
                    self.pauses.restarted();
                    self.wedge.restarted();
                    // Puppet Server is restarting (perhaps upgraded): start from the configured
                    // path again, so a fallback chosen for the old server does not outlive it.
                    if self.path != self.target.settings.given.puppet.status_path {
                        tracing::info!(
                            path = %self.target.settings.given.puppet.status_path,
                            "Puppet Server is not listening; trying the configured status path again once it is back"
                        );
                        self.reload_path();
                    }
                }
                Found::Outcome(ProbeOutcome::Unhealthy(e), None)
            }
        }
    }

    /// The pool's status service is gone: a pause under way goes on within its grace, else
    /// the node cannot compile as far as anyone can tell.
    fn unreported(&mut self) -> Found {
        let why = match self.pauses.goes_on(Instant::now(), false) {
            Some(Ok(pause)) => return Found::Paused(None, pause),
            Some(Err(too_long)) => too_long,
            None => Unready::Unreported {
                path: self.path.clone(),
            },
        };
        Found::Outcome(ProbeOutcome::NotReady(why), None)
    }

    /// A pool that cannot compile: paused, when it was ready since this process started.
    async fn unready(&mut self, client: &reqwest::Client, why: Unready, pool: Pool) -> Found {
        // One probe has no history: no pause whose start Puppet Server does not give.
        if self.once && pause::began(&why, SystemTime::now()).is_none() {
            return Found::Outcome(ProbeOutcome::NotReady(why), Some(pool));
        }
        if self.once && !self.pauses.was_ready() {
            let up = |start: &u64| {
                let started = SystemTime::UNIX_EPOCH + Duration::from_millis(*start);
                SystemTime::now()
                    .duration_since(started)
                    .is_ok_and(|up| up > self.target.settings.given.puppet.pause_grace)
            };
            if let Some(start) = self.client.jvm_start(client).await.filter(up) {
                self.pauses.ready(Some(start));
            }
        }
        let jvm = if self.pauses.would_begin() {
            self.client.jvm_start(client).await
        } else {
            None
        };
        match self
            .pauses
            .unready(why, jvm, Instant::now(), SystemTime::now())
        {
            Ok(pause) => Found::Paused(Some(pool), pause),
            Err(why) => Found::Outcome(ProbeOutcome::NotReady(why), Some(pool)),
        }
    }

    fn reload_path(&mut self) {
        self.path
            .clone_from(&self.target.settings.given.puppet.status_path);
        self.on_fallback = 0;
    }

    async fn get(&self, client: &reqwest::Client) -> Result<Seen, ProbeError> {
        let url = self.client.status_url(&self.path);
        let mut response = client
            .get(&url)
            .send()
            .await
            .map_err(|e| self.client.classify(e))?;
        let status = response.status().as_u16();
        let encoding = response
            .headers()
            .get(reqwest::header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .map(|v| text::one_line(v, 20).into_owned());
        let mut body = self.client.body(&mut response, BODY_LIMIT).await?;
        body.truncate(BODY_LIMIT);
        if let Some(body) = undecodable(encoding.as_deref(), &body) {
            return Err(ProbeError::Status { status, body });
        }
        let text = String::from_utf8_lossy(&body);
        read_answer(status, text.trim())
    }
}

/// Probes once per `interval`, however many pollers there are, publishing each report.
/// `observe` sees every report as it lands (the daemon logs verdict changes there).
pub async fn run(
    mut prober: Prober,
    interval: Duration,
    publish: watch::Sender<Option<Arc<ProbeReport>>>,
    mut reload: watch::Receiver<()>,
    mut observe: impl FnMut(&ProbeReport),
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut first = true;
    loop {
        let started = tokio::time::Instant::now();
        let report = tokio::select! {
            report = prober.probe() => Arc::new(report),
            () = &mut shutdown => return,
        };
        // The daemon's first probe is its coldest (a new client's first handshake, a package's
        // install still running): one that timed out is made again at once before anything is
        // published. A new operator saw a node that had served for 12 minutes logged DOWN and
        // ramped up again after the install's first probe timed out. The verdict meanwhile
        // stays STARTING: a 503 to the HTTP check (one failed check of HAProxy's `fall`), and
        // an agent line that changes nothing; no DOWN is logged and no ramp follows.
        let timed_out = matches!(
            report.outcome,
            ProbeOutcome::Unhealthy(ProbeError::Timeout { .. })
        );
        if std::mem::take(&mut first) && timed_out {
            tracing::info!(
                detail = %report.detail(),
                "the first probe timed out: probing again before answering"
            );
            continue;
        }
        observe(&report);
        publish.send_replace(Some(report));
        tokio::select! {
            () = tokio::time::sleep_until(started + interval) => {}
            // SIGHUP: load the identity again and probe with it now.
            Ok(()) = reload.changed() => prober.reload().await,
            () = &mut shutdown => return,
        }
    }
}
