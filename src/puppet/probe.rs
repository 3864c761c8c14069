//! The probe: one HTTPS GET of Puppet Server's status API, as this host, verified against the
//! Puppet CA, turned into a [`ProbeReport`] that says in plain words what was seen.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::{AlertDescription, CertificateError};
use thiserror::Error;
use tokio::sync::watch;

use crate::puppet::identity::{FileStamp, IdentityError, IdentityFiles};
use crate::text;

/// Puppet Server >= 6.14. Older servers answer 404 `not found: server` and need the next one.
pub const DEFAULT_STATUS_PATH: &str = "/status/v1/simple/server";
/// What the Puppet agent falls back to on older servers.
pub const LEGACY_STATUS_PATH: &str = "/status/v1/simple/master";
/// The largest status body we read; `running` is 7 bytes, Jetty's 404 page about 400.
const BODY_LIMIT: usize = 4096;

/// Everything one probe needs.
#[derive(Debug, Clone)]
pub struct ProbeTarget {
    pub identity: IdentityFiles,
    /// The name verified in Puppet Server's certificate, sent as SNI and as Host.
    pub certname: String,
    /// Where to connect, whatever the name.
    pub addr: SocketAddr,
    pub status_path: String,
    pub timeout: Duration,
}

/// The outcome of one probe.
#[derive(Debug, Clone)]
pub struct ProbeReport {
    pub ok: bool,
    /// The probe could not even be made (certificate files missing, unreadable or unusable):
    /// pmcheck cannot tell how Puppet Server is.
    pub inconclusive: bool,
    /// `running`, or what went wrong in plain words.
    pub detail: String,
    pub latency: Duration,
    pub finished: Instant,
    pub endpoint: String,
}

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("cannot set up the HTTPS client: {0}")]
    Client(String),
    #[error(
        "connection to {addr} refused: Puppet Server is not listening (stopped, restarting or still starting)"
    )]
    Refused { addr: SocketAddr },
    #[error("cannot connect to {addr}: {detail}")]
    Connect { addr: SocketAddr, detail: String },
    #[error("TLS with Puppet Server at {addr} failed: {detail}")]
    Tls { addr: SocketAddr, detail: String },
    #[error("no answer from Puppet Server at {addr} within {timeout}", timeout = crate::cli::format_duration(*.after))]
    Timeout { addr: SocketAddr, after: Duration },
    #[error("Puppet Server answered 404: it is still starting (its status routes are not up yet)")]
    NotReady,
    #[error("Puppet Server answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("Puppet Server reports `{0}`, not `running`")]
    NotRunning(String),
    #[error("HTTP exchange with Puppet Server at {addr} failed: {detail}")]
    Http { addr: SocketAddr, detail: String },
}

/// Probes one Puppet Server, rebuilding its TLS client whenever the certificate, key or CA
/// files change on disk (Puppet renews them in place) and remembering the status path that works.
pub struct Prober {
    target: ProbeTarget,
    path: String,
    client: Option<([Option<FileStamp>; 3], reqwest::Client)>,
}

impl Prober {
    pub fn new(target: ProbeTarget) -> Self {
        Self {
            path: target.status_path.clone(),
            target,
            client: None,
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
        let outcome = match tokio::time::timeout(self.target.timeout, self.attempt()).await {
            Ok(outcome) => outcome,
            Err(_) => Err(ProbeError::Timeout {
                addr: self.target.addr,
                after: self.target.timeout,
            }),
        };
        let finished = Instant::now();
        let inconclusive = matches!(
            outcome,
            Err(ProbeError::Identity(_) | ProbeError::Client(_))
        );
        let (ok, detail) = match outcome {
            Ok(()) => (true, "running".to_owned()),
            Err(e) => (false, e.to_string()),
        };
        ProbeReport {
            ok,
            inconclusive,
            detail,
            latency: finished - started,
            finished,
            endpoint: self.endpoint(),
        }
    }

    async fn attempt(&mut self) -> Result<(), ProbeError> {
        let client = self.client().await?;
        match self.get(&client).await {
            // Puppet's own 404 (not Jetty's HTML page): this server predates /simple/server.
            Err(ProbeError::Status { status: 404, body })
                if body.starts_with("not found") && self.path == DEFAULT_STATUS_PATH =>
            {
                tracing::info!(
                    "Puppet Server has no {DEFAULT_STATUS_PATH} (older than 6.14); using {LEGACY_STATUS_PATH} from now on"
                );
                self.path = LEGACY_STATUS_PATH.to_owned();
                self.get(&client).await
            }
            other => other,
        }
    }

    async fn client(&mut self) -> Result<reqwest::Client, ProbeError> {
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
            .map_err(|e| ProbeError::Client(e.to_string()))??;
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
            .map_err(|e| ProbeError::Client(chain(&e)))?;
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

    async fn get(&self, client: &reqwest::Client) -> Result<(), ProbeError> {
        let url = format!(
            "{}?timeout={}",
            self.endpoint(),
            server_timeout(self.target.timeout)
        );
        let mut response = client
            .get(&url)
            .send()
            .await
            .map_err(|e| self.classify(&e))?;
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
                Err(e) => return Err(self.classify(&e)),
            }
        }
        body.truncate(BODY_LIMIT);
        if let Some(shown) = undecodable(encoding.as_deref(), &body) {
            return Err(ProbeError::Status {
                status,
                body: shown,
            });
        }
        let text = String::from_utf8_lossy(&body);
        let text = text.trim();
        match status {
            200 if text == "running" => Ok(()),
            200 | 503 if !text.is_empty() && text.len() < 64 && !text.contains('<') => Err(
                ProbeError::NotRunning(text::one_line(text, 64).into_owned()),
            ),
            404 if text.starts_with('<') => Err(ProbeError::NotReady),
            _ => Err(ProbeError::Status {
                status,
                body: one_line(text),
            }),
        }
    }

    /// Names the phase that failed: connecting, TLS (with the certificate problem spelt out),
    /// or the HTTP exchange.
    fn classify(&self, e: &reqwest::Error) -> ProbeError {
        let addr = self.target.addr;
        if e.is_timeout() {
            return ProbeError::Timeout {
                addr,
                after: self.target.timeout,
            };
        }
        for cause in causes(e) {
            if let Some(tls) = cause.downcast_ref::<rustls::Error>() {
                return self.tls_error(tls);
            }
            if cause
                .downcast_ref::<io::Error>()
                .is_some_and(|io| io.kind() == io::ErrorKind::ConnectionRefused)
            {
                return ProbeError::Refused { addr };
            }
        }
        if e.is_connect() {
            ProbeError::Connect {
                addr,
                detail: chain(e),
            }
        } else {
            ProbeError::Http {
                addr,
                detail: chain(e),
            }
        }
    }

    fn tls_error(&self, e: &rustls::Error) -> ProbeError {
        let t = &self.target;
        let ca = t.identity.localcacert.display();
        let detail = match e {
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                format!("Puppet Server's certificate is not signed by the CA in {ca} (localcacert)")
            }
            rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                presented,
                ..
            }) if presented.is_empty() => format!(
                "Puppet Server's certificate has no subjectAltName, so it cannot be verified as {} \
                 (issued by a CA older than Puppet Server 6.15.2/7.1.0?): regenerate it with \
                 `puppetserver ca generate` or reissue it with dns_alt_names",
                t.certname
            ),
            rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                presented,
                ..
            }) => format!(
                "Puppet Server's certificate is for {} but pmcheck expects {}: set --certname",
                presented.join(", "),
                t.certname
            ),
            rustls::Error::InvalidCertificate(CertificateError::NotValidForName) => format!(
                "Puppet Server's certificate is not valid for {}: set --certname",
                t.certname
            ),
            rustls::Error::InvalidCertificate(CertificateError::Expired)
            | rustls::Error::InvalidCertificate(CertificateError::ExpiredContext { .. }) => {
                "Puppet Server's certificate has expired".to_owned()
            }
            rustls::Error::AlertReceived(
                alert @ (AlertDescription::BadCertificate
                | AlertDescription::UnknownCA
                | AlertDescription::CertificateUnknown
                | AlertDescription::CertificateRequired
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateRevoked
                | AlertDescription::DecryptError
                | AlertDescription::AccessDenied),
            ) => format!(
                "Puppet Server rejected this host's certificate {} ({alert:?}): is it signed by \
                 Puppet Server's CA, current and not revoked?",
                t.identity.hostcert.display()
            ),
            other => other.to_string(),
        };
        ProbeError::Tls {
            addr: t.addr,
            detail,
        }
    }
}

/// Puppet Server's own `?timeout=` (whole seconds, at least 1), kept below our deadline so the
/// server gives up before we do and answers instead of leaving the request hanging.
pub fn server_timeout(deadline: Duration) -> u64 {
    (deadline.as_secs_f64().ceil() as u64)
        .saturating_sub(1)
        .max(1)
}

/// An error and its causes, outermost first. `io::Error::source()` skips the error it wraps, so
/// a wrapped error is reached through `get_ref()` instead: that is where rustls' errors sit.
fn causes<'e>(
    e: &'e (dyn std::error::Error + 'static),
) -> Vec<&'e (dyn std::error::Error + 'static)> {
    let mut all = vec![e];
    let mut current = e;
    while all.len() < 16 {
        let next = match current
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
        {
            Some(inner) => inner as &(dyn std::error::Error + 'static),
            None => match current.source() {
                Some(next) => next,
                None => break,
            },
        };
        all.push(next);
        current = next;
    }
    all
}

/// All the causes on one line, each said once.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::new();
    for cause in causes(e) {
        let next = cause.to_string();
        if !text.contains(&next) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&next);
        }
    }
    text
}

/// A body for the verdict's reason: one line, control characters escaped, at most 120 characters.
fn one_line(text: &str) -> String {
    match text::one_line(text, 120) {
        flat if flat.is_empty() => "(empty body)".to_owned(),
        flat => flat.into_owned(),
    }
}

/// Says what a body is when it is not text to show: compressed (pmcheck asks for none, but a
/// proxy or a misconfigured server may send it anyway) or binary.
fn undecodable(encoding: Option<&str>, body: &[u8]) -> Option<String> {
    let compressed = match encoding {
        Some(e) if !e.eq_ignore_ascii_case("identity") => Some(e.to_owned()),
        _ if body.starts_with(&[0x1f, 0x8b]) => Some("gzip".to_owned()),
        _ => None,
    };
    if let Some(encoding) = compressed {
        return Some(format!(
            "a {encoding}-compressed body of {} bytes, which pmcheck does not decode (it asks for \
             plain text; is something between pmcheck and Puppet Server compressing?)",
            body.len()
        ));
    }
    let binary = body
        .iter()
        .any(|&b| b == 0 || (b < 0x20 && !b.is_ascii_whitespace()));
    binary.then(|| format!("a binary body of {} bytes", body.len()))
}

/// The latest probe report, shared between the prober and every poll.
pub type Latest = watch::Receiver<Option<Arc<ProbeReport>>>;

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
    fn bodies_are_flattened_and_cut() {
        assert_eq!(one_line("a\n  b"), "a b");
        assert_eq!(one_line(""), "(empty body)");
        assert!(one_line(&"x".repeat(500)).ends_with("..."));
        assert_eq!(one_line("stopping\r\nX-Evil: 1"), "stopping X-Evil: 1");
    }

    #[test]
    fn compressed_and_binary_bodies_are_named_not_shown() {
        let gzip = undecodable(None, &[0x1f, 0x8b, 8, 0, 0, 0]).unwrap();
        assert_eq!(
            gzip,
            "a gzip-compressed body of 6 bytes, which pmcheck does not decode (it asks for plain \
             text; is something between pmcheck and Puppet Server compressing?)"
        );
        let br = undecodable(Some("br"), b"xyz").unwrap();
        assert!(br.starts_with("a br-compressed body"), "{br}");
        assert_eq!(
            undecodable(None, b"\x00\x01").unwrap(),
            "a binary body of 2 bytes"
        );
        assert_eq!(undecodable(Some("identity"), b"running\n"), None);
    }
}
