//! The probe: one HTTPS GET of Puppet Server's status API, as this host, verified against the
//! Puppet CA, turned into a [`ProbeReport`] that says in plain words what was seen.
//!
//! It asks the `jruby-metrics` status service: one request says both that Puppet Server runs
//! (the service's `state`) and whether it can compile (its JRuby pool). Servers without that
//! service fall back along [`FALLBACKS`] to the `simple` status, which says `running` only.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::{AlertDescription, CertificateError};
use thiserror::Error;
use tokio::sync::watch;

use crate::file_stamp::FileStamp;
use crate::puppet::identity::{IdentityError, IdentityFiles};
use crate::puppet::pool::{Capacity, Load, Pool, ServiceStatus, Unready};
use crate::settings::Settings;
use crate::settings::duration::format_duration;
use crate::text;

/// The pool's status service of open source Puppet Server.
pub const DEFAULT_STATUS_PATH: &str = crate::settings::defaults::STATUS_PATH;
/// Where a probe goes next when a path answers 404 `not found` / `service-not-found`: the
/// pool service under Puppet Enterprise's name, the simple status of Puppet Server >= 6.14,
/// then that of older servers (what the Puppet agent falls back to).
pub const FALLBACKS: [&str; 4] = [
    DEFAULT_STATUS_PATH,
    "/status/v1/services/pe-jruby-metrics",
    "/status/v1/simple/server",
    "/status/v1/simple/master",
];
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
        }
    }

    /// A probe that could not be made at all, for `cause`: inetd's answer when the settings
    /// themselves are bad.
    pub fn not_made(cause: CannotProbe) -> Self {
        Self::new(ProbeOutcome::CannotTell(cause), Duration::ZERO, None)
    }

    /// `running` (with the pool's numbers when known), or what went wrong, in plain words.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

/// What one probe found out about Puppet Server, kept apart from the node's verdict (which also
/// weighs the drain record and the report's age).
#[derive(Debug)]
pub enum ProbeOutcome {
    /// Puppet Server answered `running` and can compile; the load, when it reported its pool.
    Healthy(Option<Load>),
    /// Puppet Server answers but cannot compile yet (starting, pool locked or empty).
    NotReady(Unready),
    /// Puppet Server was asked and is not fit for agents: the error says how.
    Unhealthy(ProbeError),
    /// The probe could not be made, so pmcheck cannot tell how Puppet Server is.
    CannotTell(CannotProbe),
}

impl ProbeOutcome {
    /// Whether Puppet Server answered `running` and can compile.
    pub fn is_healthy(&self) -> bool {
        matches!(self, ProbeOutcome::Healthy(_))
    }
}

/// `running`, or what went wrong, in the words the verdict and `pmcheck status` show.
impl std::fmt::Display for ProbeOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeOutcome::Healthy(_) => f.write_str("running"),
            ProbeOutcome::NotReady(e) => e.fmt(f),
            ProbeOutcome::Unhealthy(e) => e.fmt(f),
            ProbeOutcome::CannotTell(e) => e.fmt(f),
        }
    }
}

/// Why a probe could not be made: a problem on this host, not in Puppet Server.
#[derive(Debug, Error)]
pub enum CannotProbe {
    /// The certificate, key or CA file is missing, unreadable or unusable.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// reqwest refused the TLS configuration.
    #[error("cannot set up the HTTPS client: {}", chain(.0))]
    Client(#[source] reqwest::Error),
    /// The task loading the identity files died.
    #[error("cannot set up the HTTPS client: loading the identity files failed: {0}")]
    Loader(#[source] tokio::task::JoinError),
    /// The settings could not be resolved (inetd still answers, with this as the reason).
    #[error(transparent)]
    Settings(#[from] crate::settings::SettingsError),
}

/// How Puppet Server failed the probe, phase by phase.
#[derive(Debug, Error)]
pub enum ProbeError {
    /// Nothing listens on the port.
    #[error(
        "connection to {addr} refused: Puppet Server is not listening (stopped, restarting or still starting)"
    )]
    Refused {
        /// Where pmcheck connected.
        addr: SocketAddr,
    },
    /// The TCP connection failed otherwise (unreachable, reset during connect, ...).
    #[error("cannot connect to {addr}: {}", chain(.source))]
    Connect {
        /// Where pmcheck connected.
        addr: SocketAddr,
        /// What reqwest saw.
        source: reqwest::Error,
    },
    /// The TLS handshake failed; the problem says which side and what to do.
    #[error("TLS with Puppet Server at {addr} failed: {problem}")]
    Tls {
        /// Where pmcheck connected.
        addr: SocketAddr,
        /// What was wrong.
        problem: TlsProblem,
    },
    /// No answer within the probe's deadline.
    #[error("no answer from Puppet Server at {addr} within {timeout}", timeout = format_duration(*.after))]
    Timeout {
        /// Where pmcheck connected.
        addr: SocketAddr,
        /// The deadline.
        after: Duration,
    },
    /// An HTTP status pmcheck does not expect, with what the body was.
    #[error("Puppet Server answered HTTP {status}: {body}")]
    Status {
        /// The HTTP status code.
        status: u16,
        /// The body, or what kind of body it was.
        body: Body,
    },
    /// The status service answered with a failed state (`error`, `unknown`, ...).
    #[error("Puppet Server reports `{0}`, not `running`")]
    NotRunning(String),
    /// A JSON status answer that is not a service status.
    #[error("Puppet Server's status answer (HTTP {status}) is not a service status: {problem}")]
    Unreadable {
        /// The HTTP status code.
        status: u16,
        /// What serde_json said.
        problem: String,
    },
    /// The HTTP exchange broke after connecting.
    #[error("HTTP exchange with Puppet Server at {addr} failed: {}", chain(.source))]
    Http {
        /// Where pmcheck connected.
        addr: SocketAddr,
        /// What reqwest saw.
        source: reqwest::Error,
    },
}

/// A TLS handshake failure, spelt out for the operator who has to fix it.
#[derive(Debug, Error)]
pub enum TlsProblem {
    /// Puppet Server's certificate chains to another CA.
    #[error("Puppet Server's certificate is not signed by the CA in {} (localcacert)", ca.display())]
    UnknownIssuer {
        /// The localcacert file.
        ca: PathBuf,
    },
    /// A certificate without subjectAltName cannot be verified by name at all.
    #[error(
        "Puppet Server's certificate has no subjectAltName, so it cannot be verified as {certname} \
         (issued by a CA older than Puppet Server 6.15.2/7.1.0?): regenerate it with \
         `puppetserver ca generate` or reissue it with dns_alt_names"
    )]
    NoAltName {
        /// The name pmcheck expects.
        certname: String,
    },
    /// The certificate names other hosts.
    #[error("Puppet Server's certificate is for {} but pmcheck expects {certname}: set --certname", presented.join(", "))]
    WrongName {
        /// The names in the certificate.
        presented: Vec<String>,
        /// The name pmcheck expects.
        certname: String,
    },
    /// The certificate is not valid for the name (rustls gave no names).
    #[error("Puppet Server's certificate is not valid for {certname}: set --certname")]
    NotValidForName {
        /// The name pmcheck expects.
        certname: String,
    },
    /// Puppet Server's certificate has expired.
    #[error("Puppet Server's certificate has expired")]
    Expired,
    /// Puppet Server refused this host's certificate.
    #[error(
        "Puppet Server rejected this host's certificate {} ({alert:?}): is it signed by \
         Puppet Server's CA, current and not revoked?",
        hostcert.display()
    )]
    Rejected {
        /// The TLS alert Puppet Server sent.
        alert: AlertDescription,
        /// The hostcert file.
        hostcert: PathBuf,
    },
    /// Anything else rustls reports.
    #[error(transparent)]
    Other(rustls::Error),
}

/// A response body as the verdict shows it: text on one line, or what kind of bytes it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Text, on one line and bounded.
    Text(String),
    /// Nothing at all.
    Empty,
    /// Compressed with `encoding`, which pmcheck does not decode.
    Compressed {
        /// The content encoding (from the header, or `gzip` from the magic bytes).
        encoding: String,
        /// How many bytes were read.
        len: usize,
    },
    /// Bytes that are not text.
    Binary {
        /// How many bytes were read.
        len: usize,
    },
}

impl std::fmt::Display for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Body::Text(text) => f.write_str(text),
            Body::Empty => f.write_str("(empty body)"),
            Body::Compressed { encoding, len } => write!(
                f,
                "a {encoding}-compressed body of {len} bytes, which pmcheck does not decode (it \
                 asks for plain text; is something between pmcheck and Puppet Server compressing?)"
            ),
            Body::Binary { len } => write!(f, "a binary body of {len} bytes"),
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
            rustls::Error::InvalidCertificate(CertificateError::Expired)
            | rustls::Error::InvalidCertificate(CertificateError::ExpiredContext { .. }) => {
                TlsProblem::Expired
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
            ) => TlsProblem::Rejected {
                alert: *alert,
                hostcert: t.identity.hostcert.clone(),
            },
            other => TlsProblem::Other(other.clone()),
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

/// The path after `path` in [`FALLBACKS`]; none for a path of the operator's own.
fn next_path(path: &str) -> Option<&'static str> {
    let at = FALLBACKS.iter().position(|p| *p == path)?;
    FALLBACKS.get(at + 1).copied()
}

/// What one status answer said.
#[derive(Debug, PartialEq)]
enum Seen {
    /// `running`, with the pool when the answer carried it.
    Running(Option<Pool>),
    /// Up, but not able to compile yet.
    Unready(Unready),
    /// The status service's own 404 for this path: try the next one.
    NotFound,
}

/// Reads a status answer: a service status in JSON (the pool service), or the `simple`
/// status's one word, whichever Puppet Server sent.
fn read_answer(status: u16, text: &str) -> Result<Seen, ProbeError> {
    let state = |state: &str| match state {
        "running" => None,
        "starting" | "stopping" => Some(Ok(Seen::Unready(Unready::State(state.to_owned())))),
        other => Some(Err(ProbeError::NotRunning(
            text::one_line(other, 64).into_owned(),
        ))),
    };
    if text.starts_with('{') {
        if status == 404 && text.contains("service-not-found") {
            return Ok(Seen::NotFound);
        }
        return match serde_json::from_str::<ServiceStatus>(text) {
            Ok(service) => match state(&service.state) {
                None if status == 200 => Ok(Seen::Running(service.pool())),
                None => Err(ProbeError::Status {
                    status,
                    body: shown(text),
                }),
                Some(seen) => seen,
            },
            Err(e) => Err(ProbeError::Unreadable {
                status,
                problem: text::one_line(&e.to_string(), 120).into_owned(),
            }),
        };
    }
    match status {
        200 if text == "running" => Ok(Seen::Running(None)),
        200 | 503 if !text.is_empty() && text.len() < 64 && !text.contains('<') => state(text)
            .unwrap_or_else(|| {
                Err(ProbeError::Status {
                    status,
                    body: shown(text),
                })
            }),
        404 if text.starts_with("not found") => Ok(Seen::NotFound),
        404 if text.starts_with('<') => Ok(Seen::Unready(Unready::RoutesMissing)),
        _ => Err(ProbeError::Status {
            status,
            body: shown(text),
        }),
    }
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
fn shown(text: &str) -> Body {
    match text::one_line(text, 120) {
        flat if flat.is_empty() => Body::Empty,
        flat => Body::Text(flat.into_owned()),
    }
}

/// Says what a body is when it is not text to show: compressed (pmcheck asks for none, but a
/// proxy or a misconfigured server may send it anyway) or binary.
fn undecodable(encoding: Option<&str>, body: &[u8]) -> Option<Body> {
    let compressed = match encoding {
        Some(e) if !e.eq_ignore_ascii_case("identity") => Some(e.to_owned()),
        _ if body.starts_with(&[0x1f, 0x8b]) => Some("gzip".to_owned()),
        _ => None,
    };
    if let Some(encoding) = compressed {
        return Some(Body::Compressed {
            encoding,
            len: body.len(),
        });
    }
    let binary = body
        .iter()
        .any(|&b| b == 0 || (b < 0x20 && !b.is_ascii_whitespace()));
    binary.then_some(Body::Binary { len: body.len() })
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
