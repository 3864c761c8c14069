//! The probe: one HTTPS GET of Puppet Server's status API, as this host, verified against the
//! Puppet CA, turned into a [`ProbeReport`] that says in plain words what was seen.
//!
//! It asks the `jruby-metrics` status service: one request says both that Puppet Server runs
//! (the service's `state`) and whether it can compile (its JRuby pool). Servers without that
//! service fall back along [`crate::puppet::status_api::FALLBACKS`] to the `simple` status, which says `running` only.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::{AlertDescription, CertificateError};
use tokio::sync::watch;

use crate::file_stamp::FileStamp;
use crate::puppet::identity::IdentityFiles;
use crate::puppet::pool::{Capacity, Pool};
use crate::puppet::probe_error::{Body, CannotProbe, ProbeError, TlsProblem, causes, undecodable};
use crate::puppet::report::{ProbeOutcome, ProbeReport};
use crate::puppet::status_api::{Seen, next_path, read_answer, server_timeout};
use crate::settings::Settings;
use crate::text;

/// The largest status body we read. The pool's answer lists every compiling and waiting
/// request (a few hundred bytes each), so a saturated server's answer can be large.
const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// Everything one probe needs.
#[derive(Debug, Clone)]
pub struct ProbeTarget {
    /// The certificate, key and CA to use.
    pub identity: IdentityFiles,
    /// The name verified in Puppet Server's certificate, sent as SNI and as Host.
    pub certname: String,
    /// Where to connect, whatever the name.
    pub addr: SocketAddr,
    /// The status endpoint tried first.
    pub status_path: String,
    /// The deadline of one probe.
    pub timeout: Duration,
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
            addr: settings.puppet_addr.value,
            status_path: settings.status_path.value.clone(),
            timeout: settings.timeout.value,
        }
    }
}

/// Probes one Puppet Server, rebuilding its TLS client whenever the certificate, key or CA
/// files change on disk (Puppet renews them in place) and remembering the status path that works.
pub struct Prober {
    target: ProbeTarget,
    path: String,
    client: Option<([Option<FileStamp>; 3], reqwest::Client)>,
    /// The queue-limit count of the previous probe: a rise means requests were refused.
    queue_limit_hits: Option<u64>,
}

impl Prober {
    /// A prober for `target`; the TLS client is built at the first probe.
    pub fn new(target: ProbeTarget) -> Self {
        Self {
            path: target.status_path.clone(),
            target,
            client: None,
            queue_limit_hits: None,
        }
    }

    /// Drops the TLS client, so the next probe loads the certificate files again.
    pub fn forget_identity(&mut self) {
        self.client = None;
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
        let (outcome, pool) = match tokio::time::timeout(self.target.timeout, self.attempt()).await
        {
            Ok(seen) => seen,
            Err(_) => (
                ProbeOutcome::Unhealthy(ProbeError::Timeout {
                    addr: self.target.addr,
                    after: self.target.timeout,
                }),
                None,
            ),
        };
        ProbeReport::with_pool(outcome, pool, started.elapsed(), Some(self.endpoint()))
    }

    async fn attempt(&mut self) -> (ProbeOutcome, Option<Pool>) {
        let client = match self.client().await {
            Ok(client) => client,
            Err(cannot) => return (ProbeOutcome::CannotTell(cannot), None),
        };
        let answered = loop {
            match self.get(&client).await {
                // The status service's own 404: no such service or status route here.
                Ok(Seen::NotFound) if let Some(next) = next_path(&self.path) => {
                    tracing::info!(
                        "Puppet Server has no {}; using {next} from now on",
                        self.path
                    );
                    self.path = next.to_owned();
                }
                other => break other,
            }
        };
        match answered {
            Ok(Seen::Running(None)) => (ProbeOutcome::Healthy(None), None),
            Ok(Seen::Running(Some(pool))) => {
                let previous = self.queue_limit_hits.replace(pool.queue_limit_hits);
                let new_hits = previous.map_or(0, |p| pool.queue_limit_hits.saturating_sub(p));
                let outcome = match pool.capacity(new_hits) {
                    Capacity::Ready(load) => ProbeOutcome::Healthy(Some(load)),
                    Capacity::Unready(why) => ProbeOutcome::NotReady(why),
                };
                (outcome, Some(pool))
            }
            Ok(Seen::Unready(why)) => (ProbeOutcome::NotReady(why), None),
            // The last path there is to try.
            Ok(Seen::NotFound) => (
                ProbeOutcome::Unhealthy(ProbeError::Status {
                    status: 404,
                    body: Body::Text(format!("not found: {}", self.path)),
                }),
                None,
            ),
            Err(e) => {
                // Puppet Server is restarting (perhaps upgraded): start from the configured
                // path again, so a fallback chosen for the old server does not outlive it.
                if matches!(e, ProbeError::Refused { .. }) && self.path != self.target.status_path {
                    tracing::info!(
                        "Puppet Server is not listening; trying {} again once it is back",
                        self.target.status_path
                    );
                    self.path = self.target.status_path.clone();
                }
                (ProbeOutcome::Unhealthy(e), None)
            }
        }
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
        // Once at start and once per renewal: worth a line.
        let identity = &self.target.identity;
        tracing::info!(
            "loaded the TLS identity: hostcert {}, hostprivkey {}, localcacert {}",
            identity.hostcert.display(),
            identity.hostprivkey.display(),
            identity.localcacert.display()
        );
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
        let mut body = Vec::new();
        while body.len() < BODY_LIMIT {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(e) => return Err(self.classify(e)),
            }
        }
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
                presented: presented.clone(),
                certname: certname(),
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
            Ok(()) = reload.changed() => prober.forget_identity(),
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
