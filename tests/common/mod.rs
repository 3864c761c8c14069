//! Test kit: a PKI made on the spot, an in-process TLS stub of Puppet Server that checks what the
//! real one checks, and the pmcheck binary run as a child process that is always killed.

#![allow(dead_code)]

pub mod flood;
pub mod lb;
pub mod operator;

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

pub const CERTNAME: &str = "puppet01.example.test";

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A Puppet-like CA that signs server and host certificates.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("Puppet CA: {name}"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `key`, with `sans` as subjectAltNames (none, like pre-6.15.2 Puppet CAs).
    pub fn issue(&self, cn: &str, sans: &[&str], key: &KeyPair) -> String {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.signed_by(key, &self.issuer).unwrap().pem()
    }
}

/// The files pmcheck is pointed at.
pub struct HostFiles {
    pub dir: tempfile::TempDir,
    pub hostcert: PathBuf,
    pub hostprivkey: PathBuf,
    pub localcacert: PathBuf,
}

impl HostFiles {
    /// hostcert signed by `ca` for the key in `pkcs8_fixture`, hostprivkey as `key_fixture`.
    pub fn new(ca: &Ca, pkcs8_fixture: &str, key_fixture: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let files = Self {
            hostcert: dir.path().join("hostcert.pem"),
            hostprivkey: dir.path().join("hostprivkey.pem"),
            localcacert: dir.path().join("ca.pem"),
            dir,
        };
        files.install(ca, pkcs8_fixture, key_fixture, ca);
        files
    }

    /// Replaces the files atomically, as Puppet does on renewal: write aside, rename over.
    pub fn install(&self, ca: &Ca, pkcs8_fixture: &str, key_fixture: &str, trust: &Ca) {
        let key =
            KeyPair::from_pem(&std::fs::read_to_string(fixture(pkcs8_fixture)).unwrap()).unwrap();
        let cert = ca.issue(CERTNAME, &[], &key);
        replace(&self.hostcert, cert.as_bytes());
        replace(
            &self.hostprivkey,
            &std::fs::read(fixture(key_fixture)).unwrap(),
        );
        replace(&self.localcacert, trust.pem().as_bytes());
    }

    pub fn args(&self) -> Vec<String> {
        vec![
            "--hostcert".into(),
            self.hostcert.display().to_string(),
            "--hostprivkey".into(),
            self.hostprivkey.display().to_string(),
            "--localcacert".into(),
            self.localcacert.display().to_string(),
            "--certname".into(),
            CERTNAME.into(),
        ]
    }
}

/// A CA, this host's files signed by it, a stub Puppet Server and a state directory.
pub struct Setup {
    pub ca: Ca,
    pub files: HostFiles,
    pub stub: Stub,
    pub state: tempfile::TempDir,
}

impl Setup {
    /// With an RSA key in PKCS#1 form, as Puppet writes it.
    pub fn new(behavior: Behavior) -> Self {
        Self::with_key(behavior, "rsa.pkcs8.pem", "rsa.pkcs1.pem")
    }

    pub fn with_key(behavior: Behavior, pkcs8_fixture: &str, key_fixture: &str) -> Self {
        let ca = Ca::new("test");
        let files = HostFiles::new(&ca, pkcs8_fixture, key_fixture);
        let stub = Stub::start(&ca, &[CERTNAME], behavior);
        let state = tempfile::tempdir().unwrap();
        Self {
            ca,
            files,
            stub,
            state,
        }
    }

    /// The settings options that point pmcheck at the stub and the state directory.
    pub fn args(&self, extra: &[&str]) -> Vec<String> {
        args(&self.files, self.stub.addr, self.state.path(), extra)
    }

    /// Runs `pmcheck COMMAND --state-dir STATE EXTRA...`.
    pub fn pmcheck(&self, command: &str, extra: &[&str]) -> std::process::Output {
        pmcheck()
            .arg(command)
            .args(["--state-dir", &self.state.path().display().to_string()])
            .args(extra)
            .output()
            .unwrap()
    }
}

pub fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// How the stub answers.
#[derive(Clone, Debug)]
pub enum Behavior {
    /// Puppet Server 7.9.5 as captured: the pool service answers with one idle instance.
    Running,
    /// The pool service answers `running` with this `status.experimental` (see [`pool`]).
    Pool(String),
    /// A server without the pool service: only the simple status answers.
    Simple,
    /// Puppet Enterprise: the pool service is `pe-jruby-metrics`.
    Enterprise,
    /// Any status and body, with a content type.
    Reply(u16, &'static str, &'static str),
    /// Accept the TCP connection, or a request on an open one, and never say a word.
    Hang,
    /// A Puppet Server older than 6.14: no pool service, no /status/v1/simple/server.
    Legacy,
}

/// The `jruby-metrics` entry of the captured Puppet Server answer, as the service path sends it.
pub fn captured_pool_service() -> String {
    let text =
        std::fs::read_to_string(fixture("puppetserver-7.9.5-status-services-debug.json")).unwrap();
    let all: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut service = all["jruby-metrics"].clone();
    service["service_name"] = "jruby-metrics".into();
    service.to_string()
}

/// A pool service answer with these numbers: `size` instances, `free` idle, `borrowed`
/// compiling, `waiting` queued, the lock in `lock` (`:not-in-use`, `:requested`, `:acquired`).
pub fn pool(size: u32, free: u32, borrowed: u32, waiting: u32, lock: &str) -> String {
    let instance = serde_json::json!({"reason": {"request": {"uri": "/puppet/v3/catalog/agent"}}, "time": 0, "duration-millis": 900});
    serde_json::json!({
        "service_version": "7.9.5",
        "service_status_version": 1,
        "detail_level": "debug",
        "state": "running",
        "status": {"experimental": {
            "jruby-pool-lock-status": {"current-state": lock, "last-change-time": "2026-11-22T10:34:55.412Z"},
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
    pub requests: AtomicUsize,
    pub connections: AtomicUsize,
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
        seen.connections.fetch_add(1, Ordering::SeqCst);
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
                let hang = matches!(*behavior.lock().unwrap(), Behavior::Hang);
                let answer = (!hang).then(|| stub_answer(&req, sni.as_deref(), &seen, &behavior));
                async move {
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

fn stub_answer(
    req: &Request<hyper::body::Incoming>,
    sni: Option<&str>,
    seen: &Seen,
    behavior: &Mutex<Behavior>,
) -> Response<Full<Bytes>> {
    seen.requests.fetch_add(1, Ordering::SeqCst);
    let host = req
        .headers()
        .get("host")
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned);
    seen.requests_log.lock().unwrap().push((
        req.method().to_string(),
        req.uri().to_string(),
        host.clone(),
    ));
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
    match (current, service) {
        (Behavior::Running, Some("jruby-metrics")) => json(200, captured_pool_service()),
        (Behavior::Pool(answer), Some("jruby-metrics")) => json(200, answer),
        (Behavior::Enterprise, Some("pe-jruby-metrics")) => json(
            200,
            captured_pool_service().replace("\"jruby-metrics\"", "\"pe-jruby-metrics\""),
        ),
        (_, Some(service)) if !reply_any => not_found(service),
        (Behavior::Running | Behavior::Simple | Behavior::Enterprise | Behavior::Pool(_), None)
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

/// The name the system's user database gives the user running the tests: what a drain
/// record's `by` says, whatever USER claims.
pub fn whoami() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| format!("uid {}", nix::unistd::getuid()))
}

/// The binary under test: this build's, or `PMCHECK_TEST_BIN` (to show that a test catches a
/// defect of an older build, or to test an installed package).
pub fn bin() -> PathBuf {
    std::env::var_os("PMCHECK_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pmcheck")))
}

/// Waits for `child` to exit, checking every 20 ms; `None` when it is still running after
/// `within` (the caller says what that means and kills it).
pub fn exited_within(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pmcheck binary, with a clean environment.
pub fn pmcheck() -> Command {
    let mut command = Command::new(bin());
    command
        .env_clear()
        .env("USER", "tester")
        .env("RUST_LOG", "info");
    command
}

/// A running `pmcheck serve`, killed (by PID) and reaped on drop, also when a test fails.
pub struct Daemon {
    child: Child,
    pub addr: SocketAddr,
    pub log: Arc<Mutex<VecDeque<String>>>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// Starts `pmcheck serve --listen 127.0.0.1:0 ARGS` and waits for its "listening on" line.
    pub fn start(args: &[String]) -> Self {
        Self::start_with(pmcheck(), args)
    }

    pub fn start_with(mut command: Command, args: &[String]) -> Self {
        let child = command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("pmcheck runs");
        Self::adopt(child)
    }

    /// Takes over a spawned daemon whose stderr is piped.
    pub fn adopt(mut child: Child) -> Self {
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // Logged before it is announced: whoever learns the address sees the line too.
                let addr = line
                    .split("listening on ")
                    .nth(1)
                    .map(|a| a.trim().parse::<SocketAddr>());
                sink.lock().unwrap().push_back(line);
                if let Some(addr) = addr {
                    let _ = tx.send(addr);
                }
            }
        });
        let mut daemon = Self {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            log,
        };
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Ok(addr)) => daemon.addr = addr,
            other => panic!(
                "pmcheck did not report its address ({other:?}); log: {:?}",
                daemon.log.lock().unwrap()
            ),
        }
        daemon
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// GET / and the text body.
    pub fn poll(&self) -> Reply {
        request(
            self.addr,
            "GET / HTTP/1.1\r\nHost: pmcheck\r\nConnection: close\r\n\r\n",
        )
    }

    /// The agent-check address, from the daemon's "answering HAProxy agent checks on" line.
    pub fn agent_addr(&self) -> SocketAddr {
        const NEEDLE: &str = "answering HAProxy agent checks on ";
        self.wait_for_log(Duration::from_secs(10), NEEDLE);
        let log = self.log.lock().unwrap();
        log.iter()
            .find_map(|l| l.split(NEEDLE).nth(1))
            .and_then(|a| a.trim().parse().ok())
            .expect("an agent-check address")
    }

    /// GET / with `Accept: application/json`, read back as an answer.
    pub fn poll_json(&self) -> pmcheck::health::answer::Answer<'static> {
        let reply = request(
            self.addr,
            "GET / HTTP/1.1\r\nHost: pmcheck\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
        );
        pmcheck::health::answer::Answer::from_json(&reply.body)
            .unwrap_or_else(|e| panic!("not an answer ({e}): {reply:?}"))
    }

    /// Polls for JSON until `pred` holds, failing after `within`.
    pub fn wait_for_json(
        &self,
        within: Duration,
        what: &str,
        pred: impl Fn(&pmcheck::health::answer::Answer<'static>) -> bool,
    ) -> pmcheck::health::answer::Answer<'static> {
        let deadline = Instant::now() + within;
        loop {
            let answer = self.poll_json();
            if pred(&answer) {
                return answer;
            }
            assert!(
                Instant::now() < deadline,
                "waited {within:?} for {what}; last answer: {answer:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls until `pred` holds, failing after `within`.
    pub fn wait_for(&self, within: Duration, what: &str, pred: impl Fn(&Reply) -> bool) -> Reply {
        let deadline = Instant::now() + within;
        loop {
            let answer = self.poll();
            if pred(&answer) {
                return answer;
            }
            assert!(
                Instant::now() < deadline,
                "waited {within:?} for {what}; last answer: {answer:?}; log: {:?}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the log has a line containing `needle`.
    pub fn wait_for_log(&self, within: Duration, needle: &str) {
        let deadline = Instant::now() + within;
        while self.logged(needle) == 0 {
            assert!(
                Instant::now() < deadline,
                "no log line with {needle:?} within {within:?}: {:?}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `n` more probe reports have landed (their age starts again from zero).
    pub fn wait_probes(&self, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        let age = || self.probe_age();
        let (mut seen, mut last) = (0, age());
        while seen < n {
            assert!(
                Instant::now() < deadline,
                "fewer than {n} probes within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
            let now = age();
            if now < last {
                seen += 1;
            }
            last = now;
        }
    }

    /// The age of the latest probe report, from the JSON answer.
    pub fn probe_age(&self) -> Option<Duration> {
        let a = request(
            self.addr,
            "GET / HTTP/1.1\r\nhost: t\r\naccept: application/json\r\nconnection: close\r\n\r\n",
        );
        let json: serde_json::Value = serde_json::from_str(&a.body).ok()?;
        json["probe"]["age_ms"].as_u64().map(Duration::from_millis)
    }

    pub fn logged(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }
}

/// An HTTP answer, parsed from the raw bytes on the wire.
#[derive(Debug, Clone)]
pub struct Reply {
    pub raw: String,
    pub status_line: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A TCP connection from `source` (another loopback address, say) to `to`, whose reads give up
/// after `within`.
pub fn connect_from(source: &str, to: SocketAddr, within: Duration) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    let source: SocketAddr = format!("{source}:0").parse().expect("an address");
    socket.bind(&source.into())?;
    socket.connect(&to.into())?;
    socket.set_read_timeout(Some(within))?;
    Ok(socket.into())
}

/// Sends `raw` bytes and reads until the server closes.
pub fn request(addr: SocketAddr, raw: &str) -> Reply {
    let mut stream = TcpStream::connect(addr).expect("pmcheck accepts");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(raw.as_bytes()).unwrap();
    let mut bytes = Vec::new();
    stream
        .read_to_end(&mut bytes)
        .expect("the server closes the connection");
    parse_answer(&String::from_utf8_lossy(&bytes))
}

pub fn parse_answer(raw: &str) -> Reply {
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default().to_owned();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Reply {
        raw: raw.to_owned(),
        status_line,
        status,
        headers,
        body: body.to_owned(),
    }
}

/// Common arguments: fast probes against `stub`, drain record in `state`.
pub fn args(files: &HostFiles, stub: SocketAddr, state: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = files.args();
    args.extend([
        "--puppet-addr".into(),
        stub.to_string(),
        "--state-dir".into(),
        state.display().to_string(),
        "--puppet-conf".into(),
        "/dev/null".into(),
    ]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}
