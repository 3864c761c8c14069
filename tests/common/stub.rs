//! An in-process TLS stub of Puppet Server that checks what the real one checks.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rcgen::KeyPair;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

use super::pki::Ca;
use super::{CERTNAME, fixture};

/// The file sync client's status, which the daemon asks aside from its probes.
const FILE_SYNC_PATH: &str = "/status/v1/services/file-sync-client-service";

/// How the stub answers.
#[derive(Clone, Debug)]
pub enum Behavior {
    /// Puppet Server 7.9.5 as captured: the pool service answers with one idle instance.
    Running,
    /// A Puppet Server as captured in this fixture (a whole `/status/v1/services?level=debug`
    /// answer): its pool service and its status service, each as it answered.
    Captured(&'static str),
    /// The pool service answers `running` with this `status.experimental` (see [`pool`]).
    Pool(String),
    /// A server without the pool service: only the simple status answers.
    Simple,
    /// Puppet Enterprise: the pool service is `pe-jruby-metrics`.
    Enterprise,
    /// Puppet Enterprise's pool service answering this (see [`pool`]): made by hand from the
    /// open-source answer, as PE could not be run here.
    EnterprisePool(String),
    /// Any status and body, with a content type.
    Reply(u16, &'static str, &'static str),
    /// Accept the TCP connection, or a request on an open one, and never say a word.
    Hang,
    /// Complete the TLS handshake and answer the file sync status (404, as open source does),
    /// but never answer a probe's request. Unlike [`Behavior::Hang`] this holds the probe
    /// whichever connection its request lands on: the HTTP client's pool hands a waiting
    /// request the first connection ready, and the daemon's file sync request opens one too.
    HangProbes,
    /// A Puppet Server older than 6.14: no pool service, no /status/v1/simple/server.
    Legacy,
}

/// The `jruby-metrics` entry of the captured Puppet Server answer, as the service path sends it.
pub fn captured_pool_service() -> String {
    captured_service(
        "puppetserver-7.9.5-status-services-debug.json",
        "jruby-metrics",
    )
}

/// `service`'s entry of a captured `/status/v1/services?level=debug` answer in `file`, as
/// `/status/v1/services/SERVICE?level=debug` sends it (the entry plus its `service_name`).
pub fn captured_service(file: &str, service: &str) -> String {
    let text = std::fs::read_to_string(fixture(file)).unwrap();
    let all: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut entry = all[service].clone();
    entry["service_name"] = service.into();
    entry.to_string()
}

/// A pool service answer with these numbers: `size` instances, `free` idle, `borrowed`
/// compiling, `waiting` queued, the lock in `lock` (`:not-in-use`, `:requested`, `:acquired`),
/// its last change now (as when the lock was just taken).
pub fn pool(size: u32, free: u32, borrowed: u32, waiting: u32, lock: &str) -> String {
    let changed = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    pool_changed(size, free, borrowed, waiting, lock, &changed)
}

/// [`pool`] with the lock's last change at `changed` (RFC 3339).
pub fn pool_changed(
    size: u32,
    free: u32,
    borrowed: u32,
    waiting: u32,
    lock: &str,
    changed: &str,
) -> String {
    let instance = serde_json::json!({"reason": {"request": {"uri": "/puppet/v3/catalog/agent"}}, "time": 0, "duration-millis": 900});
    serde_json::json!({
        "service_version": "7.9.5",
        "service_status_version": 1,
        "detail_level": "debug",
        "state": "running",
        "status": {"experimental": {
            "jruby-pool-lock-status": {"current-state": lock, "last-change-time": changed},
            "metrics": {
                "num-jrubies": size,
                "num-free-jrubies": free,
                "borrowed-instances": vec![instance.clone(); borrowed as usize],
                "requested-instances": vec![instance; waiting as usize],
                "average-free-jrubies": f64::from(free),
                "average-wait-time": if waiting > 0 { 850 } else { 0 },
                "average-borrow-time": 4000,
                "queue-limit-hit-count": 0,
                "borrow-timeout-count": 0,
            }
        }},
        "active_alerts": [],
        "service_name": "jruby-metrics",
    })
    .to_string()
}

/// What the stub saw.
#[derive(Default, Debug)]
pub struct Seen {
    /// The JVM start time the status service reports (`start-time-ms`); 0: no such service.
    pub jvm_start: AtomicU64,
    /// Requests of the probe: every one but the file sync client's status, which the daemon
    /// asks aside once a minute (counted in `file_sync_requests`).
    pub requests: AtomicUsize,
    pub file_sync_requests: AtomicUsize,
    /// Probe requests received and left unanswered ([`Behavior::Hang`], [`Behavior::HangProbes`]).
    pub unanswered: AtomicUsize,
    /// How long a probe's request waits before its answer, in milliseconds (a slow server).
    pub delay_ms: AtomicU64,
    pub snis: Mutex<Vec<Option<String>>>,
    pub requests_log: Mutex<Vec<(String, String, Option<String>)>>,
}

/// An in-process Puppet Server stand-in: TLS with a server certificate for CERTNAME (or other
/// SANs), a client certificate required and verified against its CA, SNI and Host checked.
///
/// It runs on a runtime of its own (one worker thread), so the tests that use it are plain
/// `#[test]` functions whose blocking helpers (sockets, waits) cannot stall it.
pub struct Stub {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    pub behavior: Arc<Mutex<Behavior>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Stub {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Stub {
    pub fn start(ca: &Ca, server_sans: &[&str], behavior: Behavior) -> Self {
        Self::start_trusting(ca, ca, server_sans, behavior)
    }

    /// `ca` signs the server certificate; only clients signed by `client_ca` get in.
    pub fn start_trusting(
        ca: &Ca,
        client_ca: &Ca,
        server_sans: &[&str],
        behavior: Behavior,
    ) -> Self {
        Self::start_on(
            "127.0.0.1:0".parse().unwrap(),
            ca,
            client_ca,
            server_sans,
            behavior,
        )
    }

    /// A stub on `addr`: a Puppet Server that comes back on the port an earlier one had.
    pub fn start_on(
        addr: SocketAddr,
        ca: &Ca,
        client_ca: &Ca,
        server_sans: &[&str],
        behavior: Behavior,
    ) -> Self {
        let key = KeyPair::generate().unwrap();
        let cert_pem = ca.issue(CERTNAME, server_sans, &key);
        let chain = vec![CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(client_ca.pem().as_bytes()).unwrap())
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("stub-puppetserver")
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime.block_on(TcpListener::bind(addr)).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let behavior = Arc::new(Mutex::new(behavior));
        runtime.spawn(serve_stub(
            listener,
            acceptor,
            Arc::clone(&seen),
            Arc::clone(&behavior),
        ));
        Self {
            addr,
            seen,
            behavior,
            runtime: Some(runtime),
        }
    }

    pub fn set(&self, behavior: Behavior) {
        *self.behavior.lock().unwrap() = behavior;
    }

    pub fn requests(&self) -> usize {
        self.seen.requests.load(Ordering::SeqCst)
    }

    /// Probe requests left unanswered.
    pub fn unanswered(&self) -> usize {
        self.seen.unanswered.load(Ordering::SeqCst)
    }
}

async fn serve_stub(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    seen: Arc<Seen>,
    behavior: Arc<Mutex<Behavior>>,
) {
    let mut hung = Vec::new();
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        if matches!(*behavior.lock().unwrap(), Behavior::Hang) {
            hung.push(tcp);
            continue;
        }
        let acceptor = acceptor.clone();
        let seen = Arc::clone(&seen);
        let behavior = Arc::clone(&behavior);
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let sni = tls.get_ref().1.server_name().map(str::to_owned);
            seen.snis.lock().unwrap().push(sni.clone());
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                // A request on a kept-alive connection hangs too, not only a new connection.
                let probe = req.uri().path() != FILE_SYNC_PATH;
                let hang = match *behavior.lock().unwrap() {
                    Behavior::Hang => true,
                    Behavior::HangProbes => probe,
                    _ => false,
                };
                if hang && probe {
                    seen.unanswered.fetch_add(1, Ordering::SeqCst);
                }
                let answer =
                    (!hang).then(|| stub_answer(&req, probe, sni.as_deref(), &seen, &behavior));
                let delay = Duration::from_millis(seen.delay_ms.load(Ordering::SeqCst));
                async move {
                    if probe && !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    match answer {
                        Some(answer) => Ok::<_, std::convert::Infallible>(answer),
                        None => std::future::pending().await,
                    }
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

/// The answer to `req`; `probe` when it is not the file sync status (the caller tells them
/// apart already).
fn stub_answer(
    req: &Request<hyper::body::Incoming>,
    probe: bool,
    sni: Option<&str>,
    seen: &Seen,
    behavior: &Mutex<Behavior>,
) -> Response<Full<Bytes>> {
    if probe {
        seen.requests.fetch_add(1, Ordering::SeqCst);
    } else {
        seen.file_sync_requests.fetch_add(1, Ordering::SeqCst);
    }
    let host = req
        .headers()
        .get("host")
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned);
    seen.requests_log.lock().unwrap().extend(probe.then(|| {
        (
            req.method().to_string(),
            req.uri().to_string(),
            host.clone(),
        )
    }));
    let reply = |status: u16, body: &'static str| {
        Response::builder()
            .status(status)
            .header("content-type", "text/plain;charset=utf-8")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    let json = |status: u16, body: String| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json;charset=utf-8")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    let not_found = |service: &str| {
        json(
            404,
            format!(
                r#"{{"kind":"service-not-found","msg":"No status information found for service {service}"}}"#
            ),
        )
    };
    // What Jetty and Puppet Server's auth.conf do.
    let host_name = host
        .as_deref()
        .map(|h| h.rsplit_once(':').map_or(h, |(name, _)| name));
    if sni != Some(CERTNAME) || host_name != sni {
        return reply(400, "Host does not match SNI");
    }
    if req.method() != hyper::Method::GET {
        return reply(403, "Forbidden request");
    }
    let path = req.uri().path();
    let service = path.strip_prefix("/status/v1/services/");
    let current = behavior.lock().unwrap().clone();
    let reply_any = matches!(current, Behavior::Reply(..));
    let jvm_start = seen.jvm_start.load(Ordering::SeqCst);
    match (current, service) {
        (_, Some("status-service")) if jvm_start != 0 && !reply_any => json(
            200,
            serde_json::json!({
                "service_version": "1.1.1", "service_status_version": 1, "detail_level": "debug",
                "state": "running", "service_name": "status-service", "active_alerts": [],
                "status": {"experimental": {"jvm-metrics": {"start-time-ms": jvm_start, "up-time-ms": 38489}}},
            })
            .to_string(),
        ),
        (Behavior::Running, Some("jruby-metrics")) => json(200, captured_pool_service()),
        (Behavior::Captured(file), Some(name @ ("jruby-metrics" | "status-service"))) => {
            json(200, captured_service(file, name))
        }
        (Behavior::Pool(answer), Some("jruby-metrics")) => json(200, answer),
        (Behavior::EnterprisePool(answer), Some("pe-jruby-metrics")) => {
            json(200, answer.replace("\"jruby-metrics\"", "\"pe-jruby-metrics\""))
        }
        (Behavior::Enterprise, Some("pe-jruby-metrics")) => json(
            200,
            captured_pool_service().replace("\"jruby-metrics\"", "\"pe-jruby-metrics\""),
        ),
        // Made by hand: Puppet Enterprise could not be run here.
        (Behavior::Enterprise | Behavior::EnterprisePool(_), Some("file-sync-client-service")) => {
            json(
                200,
                std::fs::read_to_string(fixture("pe-file-sync-client-service-debug.json")).unwrap(),
            )
        }
        (_, Some(service)) if !reply_any => not_found(service),
        (Behavior::Running
            | Behavior::Captured(_)
            | Behavior::Simple
            | Behavior::Enterprise
            | Behavior::EnterprisePool(_)
            | Behavior::Pool(_),
            None,)
            if path.starts_with("/status/v1/simple") =>
        {
            reply(200, "running")
        }
        (Behavior::Legacy, _) if path == "/status/v1/simple/master" => reply(200, "running"),
        (Behavior::Legacy, _) if path == "/status/v1/simple/server" => {
            reply(404, "not found: server")
        }
        (Behavior::Reply(status, body, content_type), _) => Response::builder()
            .status(status)
            .header("content-type", content_type)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap(),
        _ => reply(404, "<html><body><h2>HTTP ERROR 404</h2></body></html>"),
    }
}
