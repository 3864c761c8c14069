//! The one client of the local Puppet Server: HTTPS as this host (its certificate, verified
//! against the Puppet CA, the certname as SNI and Host), rebuilt when Puppet renews the files in
//! place, on SIGHUP or when Puppet Server's listener moves ([`Address`]), with bounded bodies
//! and every failure named. The prober owns it; every
//! other reader of Puppet Server's status (file sync, the JVM's start) borrows it, so the
//! identity is loaded once and one connection is kept alive.

use std::io;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::time::Duration;

use rustls::Error::{AlertReceived, InvalidCertificate};
use rustls::{AlertDescription, CertificateError};
use tokio::sync::{Mutex, watch};

use crate::file_stamp::FileStamp;
use crate::puppet::identity::IdentityFiles;
use crate::puppet::probe_error::{CannotProbe, ProbeError, TlsProblem, causes, plain_name};
use crate::puppet::status_api::{JVM_STATUS_PATH, server_timeout};
use crate::settings::Settings;

/// Everything one probe needs: the resolved settings (the certname, the status path, the
/// deadlines), the identity files they name, and where Puppet Server listens now.
#[derive(Debug, Clone)]
pub struct ProbeTarget {
    /// The resolved settings.
    pub settings: Settings,
    /// The certificate, key and CA to use.
    pub identity: IdentityFiles,
    /// Where to connect, whatever the name.
    pub addr: Address,
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
            addr: fixed(settings.puppet_addr.value),
            settings: settings.clone(),
        }
    }
}

/// Puppet Server over HTTPS, as this host.
#[derive(Debug)]
pub struct PuppetClient {
    /// Who to ask, where, as whom, and how long to wait.
    target: ProbeTarget,
    /// The client built from the identity files as they were (their stamps), for the listener
    /// then. Held while one is built, so two readers starting together load the identity once.
    built: Mutex<Option<Built>>,
}

type Built = ([Option<FileStamp>; 3], SocketAddr, reqwest::Client);

/// Where Puppet Server listens: fixed for a single probe, followed by the daemon
/// (`crate::responder::puppet_files`).
pub type Address = watch::Receiver<SocketAddr>;

/// An address that never moves.
pub fn fixed(addr: SocketAddr) -> Address {
    watch::channel(addr).1
}

impl PuppetClient {
    /// A client of the Puppet Server `target` names; the TLS client is built at the first
    /// request.
    pub fn new(target: ProbeTarget) -> Self {
        Self {
            target,
            built: Mutex::new(None),
        }
    }

    /// SIGHUP: the next request loads the certificate files again.
    pub async fn reload(&self) {
        *self.built.lock().await = None;
    }

    /// Where Puppet Server listens now.
    pub fn addr(&self) -> SocketAddr {
        *self.target.addr.borrow()
    }

    /// `path` on Puppet Server, without a query.
    pub fn url(&self, path: &str) -> String {
        format!(
            "https://{}:{}{path}",
            self.target.settings.certname.value,
            self.addr().port()
        )
    }

    /// A status path's URL, with Puppet Server's own deadline below ours; a status service's
    /// at `?level=debug`, the only level with the pool's numbers and the JVM's start.
    pub fn status_url(&self, path: &str) -> String {
        let level = if path.starts_with("/status/v1/services") {
            "level=debug&"
        } else {
            ""
        };
        format!(
            "{}?{level}timeout={}",
            self.url(path),
            server_timeout(self.target.settings.given.puppet.timeout)
        )
    }

    /// The HTTP client, rebuilt when the certificate, key or CA changed on disk, or the
    /// listener moved.
    pub async fn http(&self) -> Result<reqwest::Client, CannotProbe> {
        let addr = self.addr();
        let mut built = self.built.lock().await;
        let known = (built.as_ref())
            .filter(|(_, at, _)| *at == addr)
            .map(|(was, _, client)| (*was, client.clone()));
        // One trip off the runtime's workers, so a slow disk cannot stall polls: three stats
        // before every probe, and the files read only when one changed.
        let identity = self.target.identity.clone();
        let read = tokio::task::spawn_blocking(move || {
            let stamps = [
                &identity.hostcert,
                &identity.hostprivkey,
                &identity.localcacert,
            ]
            .map(|p| FileStamp::of(p));
            match known {
                Some((was, client)) if was == stamps && stamps.iter().all(Option::is_some) => {
                    Ok(ControlFlow::Break(client))
                }
                _ => (identity.client_config()).map(|tls| ControlFlow::Continue((stamps, tls))),
            }
        });
        let (stamps, tls) = match read.await.map_err(CannotProbe::Loader)?? {
            ControlFlow::Break(client) => return Ok(client),
            ControlFlow::Continue(fresh) => fresh,
        };
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .resolve(&self.target.settings.certname.value, addr)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .http1_only()
            .timeout(self.target.settings.given.puppet.timeout)
            // Reuse one connection between probes (Jetty keeps idle connections for 30 s), so
            // Puppet Server is not asked for a full handshake every interval.
            .pool_max_idle_per_host(1)
            .pool_idle_timeout(Duration::from_secs(20))
            .user_agent(crate::protocol::USER_AGENT)
            .build()
            .map_err(CannotProbe::Client)?;
        // Once at start and once per renewal: worth a line.
        let identity = &self.target.identity;
        tracing::info!(
            hostcert = %identity.hostcert.display(),
            hostprivkey = %identity.hostprivkey.display(),
            localcacert = %identity.localcacert.display(),
            "loaded the TLS identity"
        );
        *built = Some((stamps, addr, client.clone()));
        Ok(client)
    }

    /// The body, read until it ends or holds more than `limit` bytes (the caller truncates or
    /// refuses): a Puppet Server gone wrong cannot make pmcheck hold an endless answer.
    pub async fn body(
        &self,
        response: &mut reqwest::Response,
        limit: usize,
    ) -> Result<Vec<u8>, ProbeError> {
        let mut body = Vec::new();
        while body.len() <= limit
            && let Some(chunk) = response.chunk().await.map_err(|e| self.classify(e))?
        {
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// Another service's status (`?level=debug`): Puppet Enterprise's file sync client, for
    /// the operator. The HTTP status and at most 64 KiB of the body; what failed, in words.
    pub async fn service_status(&self, service: &str) -> Result<(u16, Vec<u8>), String> {
        const LIMIT: usize = 64 * 1024;
        let client = self.http().await.map_err(|e| e.to_string())?;
        let url = self.status_url(&format!("/status/v1/services/{service}"));
        let mut response =
            (client.get(&url).send().await).map_err(|e| self.classify(e).to_string())?;
        let status = response.status().as_u16();
        let body = (self.body(&mut response, LIMIT).await).map_err(|e| e.to_string())?;
        if body.len() > LIMIT {
            return Err(format!(
                "{service}'s status is larger than {} KiB",
                LIMIT / 1024
            ));
        }
        Ok((status, body))
    }

    /// The JVM's start time (status-service, `?level=debug`); `None` when Puppet Server does
    /// not say it: then the refused connection alone tells a restart.
    pub async fn jvm_start(&self, client: &reqwest::Client) -> Option<u64> {
        let url = self.status_url(JVM_STATUS_PATH);
        let response = client.get(&url).send().await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        let answer: serde_json::Value =
            serde_json::from_slice(&response.bytes().await.ok()?).ok()?;
        answer
            .pointer("/status/experimental/jvm-metrics/start-time-ms")?
            .as_u64()
    }

    /// Names the phase that failed: connecting, TLS (with the certificate problem spelt out),
    /// or the HTTP exchange.
    pub fn classify(&self, e: reqwest::Error) -> ProbeError {
        let addr = self.addr();
        if e.is_timeout() {
            return ProbeError::Timeout {
                addr,
                after: self.target.settings.given.puppet.timeout,
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
        let certname = || self.target.settings.certname.value.clone();
        match e {
            InvalidCertificate(CertificateError::UnknownIssuer) => TlsProblem::UnknownIssuer {
                ca: self.target.identity.localcacert.clone(),
            },
            InvalidCertificate(CertificateError::NotValidForNameContext { presented, .. }) => {
                if presented.is_empty() {
                    TlsProblem::NoAltName {
                        certname: certname(),
                    }
                } else {
                    TlsProblem::WrongName {
                        presented: presented.iter().map(|p| plain_name(p)).collect(),
                        certname: certname(),
                        certname_from: self.target.settings.certname.source.to_string(),
                    }
                }
            }
            InvalidCertificate(CertificateError::NotValidForName) => TlsProblem::NotValidForName {
                certname: certname(),
            },
            InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. },
            ) => TlsProblem::Expired,
            AlertReceived(
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
                hostcert: self.target.identity.hostcert.clone(),
            },
            other => TlsProblem::Other(other.clone()),
        }
    }
}
