//! The operator's commands run as children against a daemon: a daemon ready for them, polls
//! that are not counted as a load balancer's, and the drain record as the commands leave it.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::*;

pub const SOON: Duration = Duration::from_secs(15);
/// The stand-in load balancer's address: not the tests' own 127.0.0.1.
pub const LB: &str = "127.0.0.2";

/// A daemon with an agent check, once its first probe is done. The test's own polls say they
/// are pmcheck's, so that they are not counted as a load balancer's.
pub fn daemon(s: &Setup) -> Daemon {
    let d = Daemon::start(&s.args(&["--agent-listen", "127.0.0.1:0", "--interval", "100ms"]));
    let deadline = Instant::now() + SOON;
    let poll =
        "GET / HTTP/1.1\r\nHost: pmcheck\r\nUser-Agent: pmcheck/test\r\nConnection: close\r\n\r\n";
    while request(d.addr, poll).body.starts_with("STARTING") {
        assert!(Instant::now() < deadline, "no first probe");
        std::thread::sleep(Duration::from_millis(20));
    }
    d
}

/// A poll that says it is pmcheck's own, so that the daemon does not count the test as a
/// load balancer.
pub fn quiet_poll(d: &Daemon) -> Reply {
    let poll =
        "GET / HTTP/1.1\r\nHost: pmcheck\r\nUser-Agent: pmcheck/test\r\nConnection: close\r\n\r\n";
    request(d.addr, poll)
}

/// A child pmcheck, killed by PID on drop if it is still running; its stderr is read as it
/// comes, so a test can wait for a line (more than once) and still get all of it at the end.
pub struct Running(pub Child, Option<Stderr>);

/// The lines a child wrote to stderr so far, and whether it has closed it.
type Lines = Arc<(Mutex<(Vec<String>, bool)>, Condvar)>;

pub struct Stderr {
    lines: Lines,
    reader: std::thread::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    /// Runs `pmcheck COMMAND --state-dir STATE ARGS...`.
    pub fn start(s: &Setup, command: &str, args: &[&str]) -> Self {
        Self::start_with_env(s, command, args, &[])
    }

    /// The same, with these variables set too.
    pub fn start_with_env(s: &Setup, command: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = pmcheck()
            .envs(env.iter().copied())
            .arg(command)
            .args(["--state-dir", &s.state.path().display().to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("pmcheck runs");
        let stderr = child.stderr.take().expect("piped stderr");
        let lines: Lines = Arc::new((Mutex::new((Vec::new(), false)), Condvar::new()));
        let shared = Arc::clone(&lines);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                shared.0.lock().unwrap().0.push(line);
                shared.1.notify_all();
            }
            shared.0.lock().unwrap().1 = true;
            shared.1.notify_all();
        });
        Self(child, Some(Stderr { lines, reader }))
    }

    /// Sends `signal` to the command, as systemd or a terminal would.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// Waits until a line of stderr contains `needle` (at most [`SOON`]); returns the lines
    /// up to that one.
    pub fn stderr_until(&mut self, needle: &str) -> Vec<String> {
        let (lock, changed) = &*self.1.as_ref().expect("stderr is read").lines;
        let deadline = Instant::now() + SOON;
        let mut seen = lock.lock().unwrap();
        loop {
            if let Some(at) = seen.0.iter().position(|l| l.contains(needle)) {
                return seen.0[..=at].to_vec();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !seen.1 && !left.is_zero(),
                "no line with {needle:?} on stderr: {:?}",
                seen.0
            );
            seen = changed.wait_timeout(seen, left).unwrap().0;
        }
    }

    /// Waits for the exit, at most `within`.
    pub fn finish(mut self, within: Duration) -> Output {
        let status = exited_within(&mut self.0, within)
            .unwrap_or_else(|| panic!("pmcheck still runs after {within:?}"));
        let mut stdout = String::new();
        if let Some(mut out) = self.0.stdout.take() {
            let _ = out.read_to_string(&mut stdout);
        }
        // The reader ends with the pipe: once every process that holds it has exited.
        let mut stderr = String::new();
        if let Some(Stderr { lines, reader }) = self.1.take() {
            let _ = reader.join();
            for line in &lines.0.lock().unwrap().0 {
                stderr.push_str(line);
                stderr.push('\n');
            }
        }
        Output {
            status,
            stdout: stdout.into_bytes(),
            stderr: stderr.into_bytes(),
        }
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn url(d: &Daemon) -> String {
    format!("http://{}/", d.addr)
}

pub fn record(s: &Setup) -> Option<serde_json::Value> {
    let bytes = std::fs::read(s.state.path().join("drain")).ok()?;
    Some(serde_json::from_slice(&bytes).expect("a JSON record"))
}

/// The kinds of the drain record's holders.
pub fn holders(s: &Setup) -> Vec<String> {
    record(s)
        .and_then(|r| r["holders"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|h| h["kind"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// The drain event log's events, every line of which must be one JSON object; none when
/// there is no log.
pub fn logged_events(s: &Setup) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(s.state.path().join("drain-events.log")).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: a broken line {l:?}")))
        .collect()
}

/// The logged events' actions, in order.
pub fn logged_actions(s: &Setup) -> Vec<String> {
    logged_events(s)
        .iter()
        .map(|e| e["action"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// A port nothing listens on.
pub fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}
