//! HAProxy as a stand-in: polls a daemon from another loopback address at a fixed rhythm, with
//! HTTP checks (optionally carrying an `X-Haproxy-Server-State` the test sets) and agent
//! checks, both proving themselves with the load balancers' key as the packaged HAProxy
//! configuration does (`http-check send hdr X-Pmcheck-Key`, `agent-send` with the server
//! line), and keeps what each was answered. One stand-in is one server line: two from one
//! address are one load balancer that checks the node in two backends.
//!
//! Every daemon the kit starts takes that key ([`lb_key_file`]).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::connect_from;

/// How the stand-in polls.
#[derive(Debug, Clone)]
pub struct Polling {
    /// The address it polls from: another loopback address than the tests' own.
    pub from: &'static str,
    /// The daemon's HTTP address.
    pub http: SocketAddr,
    /// The daemon's agent-check address, if it makes agent checks.
    pub agent: Option<SocketAddr>,
    /// The time between two rounds of checks.
    pub every: Duration,
    /// How long before the first round.
    pub first_after: Duration,
    /// The key its checks send; `None` for a poller that proves nothing.
    pub key: Option<&'static str>,
    /// The server line its agent checks name (`agent-send "BACKEND/SERVER KEY\n"`, as the
    /// shipped backend sends it); `None` for an `agent-send` of the key alone.
    pub line: Option<&'static str>,
}

impl Polling {
    /// From 127.0.0.2, every 50 ms, starting at once.
    pub fn new(http: SocketAddr, agent: Option<SocketAddr>) -> Self {
        Self {
            from: "127.0.0.2",
            http,
            agent,
            every: Duration::from_millis(50),
            first_after: Duration::ZERO,
            key: Some(LB_KEY),
            line: None,
        }
    }
}

/// What the stand-in was answered.
#[derive(Debug, Default)]
pub struct Seen {
    /// Each HTTP check's status code and when it came.
    pub http: Vec<(Instant, u16)>,
    /// Each agent check's line.
    pub agent: Vec<(Instant, String)>,
}

/// The load balancers' key of every daemon the kit starts.
pub const LB_KEY: &str = "5e0d7c1b9a8f4e3d2c1b0a9f8e7d6c5b4a39281706f5e4d3";

/// The key file of [`LB_KEY`], 0640 as the packaged instructions say.
pub fn lb_key_file() -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lb-key");
    let text = format!("# the tests' load balancer\n{LB_KEY}\n");
    if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
        // Tests run in parallel processes: each writes the same text aside, then renames.
        let aside = path.with_extension(std::process::id().to_string());
        std::fs::write(&aside, &text).unwrap();
        std::fs::set_permissions(&aside, std::fs::Permissions::from_mode(0o640)).unwrap();
        std::fs::rename(&aside, &path).unwrap();
    }
    path
}

/// The stand-in, polling until dropped.
pub struct LoadBalancer {
    stop: Arc<AtomicBool>,
    agent_gone: Arc<AtomicBool>,
    header: Arc<Mutex<Option<String>>>,
    seen: Arc<Mutex<Seen>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LoadBalancer {
    /// Starts polling as `how` says, without a state header.
    pub fn start(how: Polling) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let agent_gone = Arc::new(AtomicBool::new(false));
        let no_agent = Arc::clone(&agent_gone);
        let header = Arc::new(Mutex::new(None::<String>));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (stopped, sent, kept) = (Arc::clone(&stop), Arc::clone(&header), Arc::clone(&seen));
        let thread = std::thread::spawn(move || {
            std::thread::sleep(how.first_after);
            while !stopped.load(Ordering::SeqCst) {
                let round = Instant::now();
                let state = sent.lock().unwrap().clone();
                if let Some(status) = http_check(how.from, how.http, state.as_deref(), how.key) {
                    kept.lock().unwrap().http.push((Instant::now(), status));
                }
                if let Some(agent) = how.agent.filter(|_| !no_agent.load(Ordering::SeqCst))
                    && let Ok(mut s) = connect_from(how.from, agent, Duration::from_secs(5))
                {
                    let send: Vec<&str> = [how.line, how.key].into_iter().flatten().collect();
                    if !send.is_empty() {
                        let _ = s.write_all(format!("{}\n", send.join(" ")).as_bytes());
                    }
                    let mut line = String::new();
                    let _ = s.read_to_string(&mut line);
                    kept.lock().unwrap().agent.push((Instant::now(), line));
                }
                std::thread::sleep(how.every.saturating_sub(round.elapsed()));
            }
        });
        Self {
            stop,
            agent_gone,
            header,
            seen,
            thread: Some(thread),
        }
    }

    /// What its HTTP checks send as `X-Haproxy-Server-State` from now on.
    pub fn send_state(&self, header: Option<&str>) {
        *self.header.lock().unwrap() = header.map(str::to_owned);
    }

    /// Makes no more agent checks, as HAProxy once `agent-check` is gone from its server line.
    pub fn stop_agent_checks(&self) {
        self.agent_gone.store(true, Ordering::SeqCst);
    }

    /// How many HTTP checks were answered `status` since `since`.
    pub fn answered(&self, status: u16, since: Instant) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.http
            .iter()
            .filter(|(at, s)| *at >= since && *s == status)
            .count()
    }

    /// The agent checks' lines since `since`.
    pub fn agent_lines(&self, since: Instant) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        (seen.agent.iter())
            .filter(|(at, _)| *at >= since)
            .map(|(_, line)| line.clone())
            .collect()
    }

    /// How many HTTP checks were answered at all.
    pub fn http_checks(&self) -> usize {
        self.seen.lock().unwrap().http.len()
    }
}

impl Drop for LoadBalancer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One HTTP check as HAProxy 2.6 sends it (`option httpchk`, `http-check send-state`); the
/// status code answered.
fn http_check(from: &str, to: SocketAddr, state: Option<&str>, key: Option<&str>) -> Option<u16> {
    let mut s = connect_from(from, to, Duration::from_secs(5)).ok()?;
    let mut request = "OPTIONS / HTTP/1.0\r\n".to_owned();
    if let Some(key) = key {
        request.push_str(&format!("x-pmcheck-key: {key}\r\n"));
    }
    if let Some(state) = state {
        request.push_str(&format!("x-haproxy-server-state: {state}\r\n"));
    }
    request.push_str("\r\n");
    s.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    text.split(' ').nth(1)?.parse().ok()
}
