//! The probe: one HTTPS GET of Puppet Server's status API, as this host, verified against the
//! Puppet CA, turned into a [`ProbeReport`] that says in plain words what was seen.
//!
//! It asks the `jruby-metrics` status service: one request says both that Puppet Server runs
//! (the service's `state`) and whether it can compile (its JRuby pool). Servers without that
//! service fall back along [`crate::puppet::status_api::FALLBACKS`] to the `simple` status, which says `running` only.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rustls::{AlertDescription, CertificateError};
use tokio::sync::watch;

use crate::file_stamp::FileStamp;
use crate::puppet::identity::IdentityFiles;
use crate::puppet::pause::{self, Pause, PauseWatch};
use crate::puppet::pool::{Capacity, Pool, Unready};
use crate::puppet::probe_error::{
    Body, CannotProbe, ProbeError, TlsProblem, causes, plain_name, undecodable,
};
use crate::puppet::report::{ProbeOutcome, ProbeReport};
use crate::puppet::status_api::{
    JVM_STATUS_PATH, Seen, jvm_start_time, next_path, read_answer, server_timeout,
};
use crate::puppet::wedge::WedgeWatch;
use crate::settings::Settings;
use crate::text;

/// The largest status body we read. The pool's answer lists every compiling and waiting
/// request (a few hundred bytes each), so a saturated server's answer can be large.
const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// After this many probes on a fallback path, the configured path is tried again: one
/// transient `service-not-found` must not blind the probe to the pool for good.
const FALLBACK_PROBES: u32 = 30;

/// Everything one probe needs.
#[derive(Debug, Clone)]
pub struct ProbeTarget {
    /// The certificate, key and CA to use.
    pub identity: IdentityFiles,
    /// The name verified in Puppet Server's certificate, sent as SNI and as Host.
    pub certname: String,
    /// Where the certname came from, for the error when Puppet Server's certificate is for
    /// another name.
    pub certname_from: String,
    /// Where to connect, whatever the name.
    pub addr: SocketAddr,
    /// The status endpoint tried first.
    pub status_path: String,
    /// The deadline of one probe.
    pub timeout: Duration,
    /// How long a paused pool is answered OK ([`crate::puppet::pause`]).
    pub pause_grace: Duration,
    /// How long a pool may only fail its borrows before it is out.
    pub wedged_after: Duration,
    /// Puppet Server runs one multithreaded JRuby (puppetserver.conf).
    pub multithreaded: bool,
}

impl ProbeTarget {
    /// What the probe needs from the resolved settings.
    pub fn of(settings: &Settings) -> Self {
        Self {
            identity: IdentityFiles {
                hostcert: settings.hostcert.value.clone(),
                hostprivkey: settings.hostprivkey.value.clone(),
                localcacert: settings.localcacert.value.clone(),
            },
            certname: settings.certname.value.clone(),
            certname_from: settings.certname.source.to_string(),
            addr: settings.puppet_addr.value,
            status_path: settings.status_path.value.clone(),
            timeout: settings.timeout.value,
            pause_grace: settings.pause_grace.value,
            wedged_after: settings.wedged_after.value,
            multithreaded: settings.multithreaded.value,
        }
    }
}

/// What one attempt found: an outcome with the pool it read, or a pause (with the pool, when
/// Puppet Server answered).
enum Found {
    Outcome(ProbeOutcome, Option<Pool>),
    Paused(Option<Pool>, Pause),
}

/// Probes one Puppet Server, rebuilding its TLS client whenever the certificate, key or CA
/// files change on disk (Puppet renews them in place) and remembering the status path that works.
pub struct Prober {
    target: ProbeTarget,
    path: String,
    client: Option<([Option<FileStamp>; 3], reqwest::Client)>,
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
    /// Asks other services only ([`Prober::aside`]): its identity loads are not news.
    aside: bool,
}

impl Prober {
    /// A prober for `target`; the TLS client is built at the first probe.
    pub fn new(target: ProbeTarget) -> Self {
        Self {
            path: target.status_path.clone(),
            pauses: PauseWatch::new(target.pause_grace),
            wedge: WedgeWatch::new(target.wedged_after),
            target,
            client: None,
            queue_limit_hits: None,
            on_fallback: 0,
            once: false,
            aside: false,
        }
    }

    /// A client of Puppet Server beside the probe, for other services' status
    /// ([`Prober::service_status`]): the probe's log line for each identity load stays one.
    pub fn aside(target: ProbeTarget) -> Self {
        Self {
            aside: true,
            ..Self::new(target)
        }
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
    pub fn reload(&mut self) {
        self.client = None;
        self.path.clone_from(&self.target.status_path);
        self.on_fallback = 0;
    }

    /// The URL probed now, without the query.
    pub fn endpoint(&self) -> String {
        format!(
            "https://{}:{}{}",
            self.target.certname,
            self.target.addr.port(),
            self.path
        )
    }

    /// One probe, never longer than the target's timeout.
    pub async fn probe(&mut self) -> ProbeReport {
        let started = Instant::now();
        // The deadline is kept twice, by this timeout and by the HTTP client's own: either
        // may fire first, and both mean the same.
        let found = match tokio::time::timeout(self.target.timeout, self.attempt()).await {
            Ok(Found::Outcome(ProbeOutcome::Unhealthy(ProbeError::Timeout { .. }), _)) | Err(_) => {
                match self.pauses.unanswered(Instant::now()) {
                    // A refill can keep the status API from answering for seconds.
                    Some(Ok(pause)) => Found::Paused(None, pause),
                    Some(Err(why)) => Found::Outcome(ProbeOutcome::NotReady(why), None),
                    None => Found::Outcome(
                        ProbeOutcome::Unhealthy(ProbeError::Timeout {
                            addr: self.target.addr,
                            after: self.target.timeout,
                        }),
                        None,
                    ),
                }
            }
            Ok(found) => found,
        };
        let endpoint = Some(self.endpoint());
        match found {
            Found::Outcome(outcome, pool) => {
                ProbeReport::with_pool(outcome, pool, started.elapsed(), endpoint)
            }
            Found::Paused(pool, pause) => {
                ProbeReport::paused(pool, pause, started.elapsed(), endpoint)
            }
        }
    }

    async fn attempt(&mut self) -> Found {
        let client = match self.client().await {
            Ok(client) => client,
            Err(cannot) => return Found::Outcome(ProbeOutcome::CannotTell(cannot), None),
        };
        if self.path != self.target.status_path {
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
                    if self.pauses.was_ready() && self.path == self.target.status_path =>
                {
                    return self.unreported();
                }
                // The status service's own 404: no such service or status route here.
                Ok(Seen::NotFound) if let Some(next) = next_path(&self.path) => {
                    tracing::info!(
                        path = %self.path,
                        next = %next,
                        "Puppet Server has no {}; using {next} from now on",
                        self.path
                    );
                    self.path = next.to_owned();
                }
                other => break other,
            }
        };
        match answered {
            Ok(Seen::Running(None)) => Found::Outcome(ProbeOutcome::Healthy(None), None),
            Ok(Seen::Running(Some(mut pool))) => {
                pool.multithreaded = self.target.multithreaded;
                let previous = self.queue_limit_hits.replace(pool.queue_limit_hits);
                let new_hits = previous.map_or(0, |p| pool.queue_limit_hits.saturating_sub(p));
                let wedged = self.wedge.observe(&pool, Instant::now(), SystemTime::now());
                match pool.capacity(new_hits) {
                    Capacity::Ready(_) if let Some(why) = wedged => {
                        Found::Outcome(ProbeOutcome::NotReady(why), Some(pool))
                    }
                    Capacity::Ready(load) => {
                        // Once per Puppet Server process: its JVM, to recognise it later.
                        let jvm = if self.once || self.pauses.was_ready() {
                            None
                        } else {
                            self.jvm_start(&client).await
                        };
                        self.pauses.ready(jvm);
                        Found::Outcome(ProbeOutcome::Healthy(Some(load)), Some(pool))
                    }
                    Capacity::Unready(why) => self.unready(&client, why, pool).await,
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
                    if self.path != self.target.status_path {
                        tracing::info!(
                            path = %self.target.status_path,
                            "Puppet Server is not listening; trying {} again once it is back",
                            self.target.status_path
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
        let why = Unready::Unreported {
            path: self.path.clone(),
        };
        match self.pauses.continued(Instant::now()) {
            Some(Ok(pause)) => Found::Paused(None, pause),
            Some(Err(too_long)) => Found::Outcome(ProbeOutcome::NotReady(too_long), None),
            None => Found::Outcome(ProbeOutcome::NotReady(why), None),
        }
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
                    .is_ok_and(|up| up > self.target.pause_grace)
            };
            if let Some(start) = self.jvm_start(client).await.filter(up) {
                self.pauses.ready(Some(start));
            }
        }
        let jvm = if self.pauses.would_begin() {
            self.jvm_start(client).await
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
        self.path.clone_from(&self.target.status_path);
        self.on_fallback = 0;
    }

    /// Another service's status (`?level=debug`), with this host's identity: Puppet
    /// Enterprise's file sync client, for the operator. The HTTP status and at most 64 KiB of
    /// the body; what failed, in words.
    pub async fn service_status(&mut self, service: &str) -> Result<(u16, Vec<u8>), String> {
        const LIMIT: usize = 64 * 1024;
        let client = self.client().await.map_err(|e| e.to_string())?;
        let url = self.debug_status_url(&format!("/status/v1/services/{service}"));
        let mut response = client
            .get(&url)
            .send()
            .await
            .map_err(|e| self.classify(e).to_string())?;
        let status = response.status().as_u16();
        let body = self
            .body(&mut response, LIMIT)
            .await
            .map_err(|e| e.to_string())?;
        if body.len() > LIMIT {
            return Err(format!(
                "{service}'s status is larger than {} KiB",
                LIMIT / 1024
            ));
        }
        Ok((status, body))
    }

    /// A status service's URL at `?level=debug`, with Puppet Server's own deadline below ours.
    fn debug_status_url(&self, path: &str) -> String {
        format!(
            "https://{}:{}{path}?level=debug&timeout={}",
            self.target.certname,
            self.target.addr.port(),
            server_timeout(self.target.timeout)
        )
    }

    /// The body, read until it ends or holds more than `limit` bytes (the caller truncates or
    /// refuses): a Puppet Server gone wrong cannot make pmcheck hold an endless answer.
    async fn body(
        &self,
        response: &mut reqwest::Response,
        limit: usize,
    ) -> Result<Vec<u8>, ProbeError> {
        let mut body = Vec::new();
        while body.len() <= limit {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(e) => return Err(self.classify(e)),
            }
        }
        Ok(body)
    }

    /// The JVM's start time (status-service, `?level=debug`); `None` when Puppet Server does
    /// not say it: then the refused connection alone tells a restart.
    async fn jvm_start(&self, client: &reqwest::Client) -> Option<u64> {
        let url = self.debug_status_url(JVM_STATUS_PATH);
        let response = client.get(&url).send().await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        jvm_start_time(&response.bytes().await.ok()?)
    }

    async fn client(&mut self) -> Result<reqwest::Client, CannotProbe> {
        let stamps = self.target.identity.stamps();
        if let Some((built, client)) = &self.client
            && *built == stamps
            && stamps.iter().all(Option::is_some)
        {
            return Ok(client.clone());
        }
        self.client = None;
        // File reads: off the runtime's workers, so a slow disk cannot stall polls.
        let identity = self.target.identity.clone();
        let tls = tokio::task::spawn_blocking(move || identity.client_config())
            .await
            .map_err(CannotProbe::Loader)??;
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .resolve(&self.target.certname, self.target.addr)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .http1_only()
            .timeout(self.target.timeout)
            // Reuse one connection between probes (Jetty keeps idle connections for 30 s), so
            // Puppet Server is not asked for a full handshake every interval.
            .pool_max_idle_per_host(1)
            .pool_idle_timeout(Duration::from_secs(20))
            .user_agent(concat!("pmcheck/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(CannotProbe::Client)?;
        // Once at start and once per renewal: worth a line, from the probe's own client.
        let identity = &self.target.identity;
        let loaded = format!(
            "loaded the TLS identity: hostcert {}, hostprivkey {}, localcacert {}",
            identity.hostcert.display(),
            identity.hostprivkey.display(),
            identity.localcacert.display()
        );
        if self.aside {
            tracing::debug!("{loaded} (for other services' status)");
        } else {
            tracing::info!("{loaded}");
        }
        self.client = Some((stamps, client.clone()));
        Ok(client)
    }

    async fn get(&self, client: &reqwest::Client) -> Result<Seen, ProbeError> {
        // The pool's numbers are in the `debug` level only.
        let level = if self.path.starts_with("/status/v1/services") {
            "level=debug&"
        } else {
            ""
        };
        let url = format!(
            "{}?{level}timeout={}",
            self.endpoint(),
            server_timeout(self.target.timeout)
        );
        let mut response = client
            .get(&url)
            .send()
            .await
            .map_err(|e| self.classify(e))?;
        let status = response.status().as_u16();
        let encoding = response
            .headers()
            .get(reqwest::header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .map(|v| text::one_line(v, 20).into_owned());
        let mut body = self.body(&mut response, BODY_LIMIT).await?;
        body.truncate(BODY_LIMIT);
        if let Some(body) = undecodable(encoding.as_deref(), &body) {
            return Err(ProbeError::Status { status, body });
        }
        let text = String::from_utf8_lossy(&body);
        read_answer(status, text.trim())
    }

    /// Names the phase that failed: connecting, TLS (with the certificate problem spelt out),
    /// or the HTTP exchange.
    fn classify(&self, e: reqwest::Error) -> ProbeError {
        let addr = self.target.addr;
        if e.is_timeout() {
            return ProbeError::Timeout {
                addr,
                after: self.target.timeout,
            };
        }
        for cause in causes(&e) {
            if let Some(tls) = cause.downcast_ref::<rustls::Error>() {
                return ProbeError::Tls {
                    addr,
                    problem: self.tls_problem(tls),
                };
            }
            if cause
                .downcast_ref::<io::Error>()
                .is_some_and(|io| io.kind() == io::ErrorKind::ConnectionRefused)
            {
                return ProbeError::Refused { addr };
            }
        }
        if e.is_connect() {
            ProbeError::Connect { addr, source: e }
        } else {
            ProbeError::Http { addr, source: e }
        }
    }

    fn tls_problem(&self, e: &rustls::Error) -> TlsProblem {
        let t = &self.target;
        let certname = || t.certname.clone();
        match e {
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                TlsProblem::UnknownIssuer {
                    ca: t.identity.localcacert.clone(),
                }
            }
            rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                presented,
                ..
            }) if presented.is_empty() => TlsProblem::NoAltName {
                certname: certname(),
            },
            rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                presented,
                ..
            }) => TlsProblem::WrongName {
                presented: presented.iter().map(|p| plain_name(p)).collect(),
                certname: certname(),
                certname_from: t.certname_from.clone(),
            },
            rustls::Error::InvalidCertificate(CertificateError::NotValidForName) => {
                TlsProblem::NotValidForName {
                    certname: certname(),
                }
            }
            rustls::Error::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. },
            ) => TlsProblem::Expired,
            rustls::Error::AlertReceived(
                alert @ (AlertDescription::BadCertificate
                | AlertDescription::UnknownCA
                | AlertDescription::CertificateUnknown
                | AlertDescription::CertificateRequired
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateRevoked
                | AlertDescription::DecryptError
                | AlertDescription::AccessDenied),
            ) => TlsProblem::Rejected {
                alert: *alert,
                hostcert: t.identity.hostcert.clone(),
            },
            other => TlsProblem::Other(other.clone()),
        }
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
    loop {
        let started = tokio::time::Instant::now();
        let report = tokio::select! {
            report = prober.probe() => Arc::new(report),
            () = &mut shutdown => return,
        };
        observe(&report);
        publish.send_replace(Some(report));
        tokio::select! {
            () = tokio::time::sleep_until(started + interval) => {}
            // SIGHUP: load the identity again and probe with it now.
            Ok(()) = reload.changed() => prober.reload(),
            () = &mut shutdown => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::puppet::pool::Unready;
    use crate::puppet::probe_error::shown;
    use crate::puppet::status_api::FALLBACKS;

    #[test]
    fn server_timeout_stays_below_the_deadline() {
        assert_eq!(server_timeout(Duration::from_millis(1500)), 1);
        assert_eq!(server_timeout(Duration::from_secs(2)), 1);
        assert_eq!(server_timeout(Duration::from_millis(2500)), 2);
        assert_eq!(server_timeout(Duration::from_secs(30)), 29);
        assert_eq!(
            server_timeout(Duration::from_millis(200)),
            1,
            "Puppet needs at least 1"
        );
    }

    #[test]
    fn service_status_answers_are_read_by_state_and_pool() {
        let captured =
            include_str!("../../tests/fixtures/puppetserver-7.9.5-status-services-debug.json");
        let all: serde_json::Value = serde_json::from_str(captured).unwrap();
        let service = all["jruby-metrics"].to_string();
        match read_answer(200, &service) {
            Ok(Seen::Running(Some(pool))) => assert_eq!((pool.size, pool.free), (1, 1)),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            read_answer(503, r#"{"state":"starting","status":{}}"#).unwrap(),
            Seen::Unready(Unready::State("starting".into()))
        );
        assert_eq!(
            read_answer(503, r#"{"state":"error","status":{}}"#)
                .unwrap_err()
                .to_string(),
            "Puppet Server reports `error`, not `running`"
        );
        assert_eq!(
            read_answer(200, r#"{"state":"running","status":{}}"#).unwrap(),
            Seen::Running(None),
            "no debug details: running, without numbers"
        );
        let not_found = r#"{"kind":"service-not-found","msg":"No status information found for service jruby-metrics"}"#;
        assert_eq!(read_answer(404, not_found).unwrap(), Seen::NotFound);
        assert!(matches!(
            read_answer(200, r#"{"unexpected":true}"#),
            Err(ProbeError::Unreadable { status: 200, .. })
        ));
    }

    #[test]
    fn simple_answers_are_read_by_their_word() {
        assert_eq!(read_answer(200, "running").unwrap(), Seen::Running(None));
        assert_eq!(
            read_answer(503, "stopping").unwrap(),
            Seen::Unready(Unready::State("stopping".into()))
        );
        assert!(matches!(
            read_answer(503, "error"),
            Err(ProbeError::NotRunning(state)) if state == "error"
        ));
        assert!(matches!(
            read_answer(503, "running"),
            Err(ProbeError::Status { status: 503, .. })
        ));
        assert_eq!(
            read_answer(404, "not found: server").unwrap(),
            Seen::NotFound
        );
        assert_eq!(
            read_answer(404, "<html><body>HTTP ERROR 404</body></html>").unwrap(),
            Seen::Unready(Unready::RoutesMissing)
        );
    }

    #[test]
    fn fallbacks_run_in_order_and_stop_at_the_end_or_at_a_path_of_ones_own() {
        assert_eq!(next_path(FALLBACKS[0]), Some(FALLBACKS[1]));
        assert_eq!(
            next_path("/status/v1/simple/server"),
            Some("/status/v1/simple/master")
        );
        assert_eq!(next_path("/status/v1/simple/master"), None);
        assert_eq!(next_path("/behind/a/proxy"), None);
    }

    #[test]
    fn bodies_are_flattened_and_cut() {
        assert_eq!(shown("a\n  b").to_string(), "a b");
        assert_eq!(shown("").to_string(), "(empty body)");
        assert!(shown(&"x".repeat(500)).to_string().ends_with("..."));
        assert_eq!(
            shown("stopping\r\nX-Evil: 1").to_string(),
            "stopping X-Evil: 1"
        );
    }

    #[test]
    fn compressed_and_binary_bodies_are_named_not_shown() {
        let gzip = undecodable(None, &[0x1f, 0x8b, 8, 0, 0, 0])
            .unwrap()
            .to_string();
        assert_eq!(
            gzip,
            "a gzip-compressed body of 6 bytes, which pmcheck does not decode (it asks for plain \
             text; is something between pmcheck and Puppet Server compressing?)"
        );
        let br = undecodable(Some("br"), b"xyz").unwrap().to_string();
        assert!(br.starts_with("a br-compressed body"), "{br}");
        assert_eq!(
            undecodable(None, b"\x00\x01").unwrap().to_string(),
            "a binary body of 2 bytes"
        );
        assert_eq!(undecodable(Some("identity"), b"running\n"), None);
    }
}
