//! The pmcheck binary run as a child process that is always killed, and what it answers.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::http::{Reply, request};

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

/// The pmcheck binary, with a clean environment, on a host with nothing of Puppet installed:
/// see [`no_puppet`]. A test's own flags and variables beat these.
pub fn pmcheck() -> Command {
    let mut command = Command::new(bin());
    command
        .env_clear()
        .envs(no_puppet_env())
        .env("PMCHECK_URL", nobody_url())
        .env("USER", "tester")
        .env("RUST_LOG", "info");
    command
}

/// Where the operator's commands find no daemon unless a test names one (`--url`): a loopback
/// port bound for the tests' whole run and never listening refuses every connection, as the
/// default `http://127.0.0.1:9200/` does on a machine without pmcheck. A pmcheck running on
/// this machine (a compile master, another worktree's test) then changes no test's answer.
pub fn nobody_url() -> &'static str {
    static NOBODY: std::sync::OnceLock<(socket2::Socket, String)> = std::sync::OnceLock::new();
    let (_, url) = NOBODY.get_or_init(|| {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("a TCP socket");
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        socket.bind(&loopback.into()).expect("a loopback port");
        let port = (socket.local_addr().ok().and_then(|a| a.as_socket()))
            .expect("the bound port")
            .port();
        (socket, format!("http://127.0.0.1:{port}/"))
    });
    url
}

/// The environment that puts a pmcheck on the host of [`no_puppet`], for a test that builds its
/// own command (through setpriv, or a shell that passes a socket) after `env_clear()`.
pub fn no_puppet_env() -> [(&'static str, std::ffi::OsString); 3] {
    let host = no_puppet();
    [
        ("PMCHECK_PUPPET_CONF", host.join("puppet.conf").into()),
        (
            "PMCHECK_PUPPETSERVER_CONFD",
            host.join("puppetserver/conf.d").into(),
        ),
        ("PMCHECK_ENV_FILE", "none".into()),
    ]
}

/// A host with nothing of Puppet installed, for every process a test starts, whatever the
/// machine running the tests has: a puppet.conf that puts each of Puppet's directories under
/// this directory, and an empty conf.d of Puppet Server. Without it, a default would come from
/// the machine's own /etc/puppet or /etc/puppetlabs (the in-process tests fake the same with
/// `settings::Host`), and a test would pass or fail by what the machine has installed.
pub fn no_puppet() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-puppet");
    let confd = dir.join("puppetserver/conf.d");
    std::fs::create_dir_all(&confd).unwrap();
    let conf: String = ["confdir", "vardir", "ssldir", "codedir", "logdir", "rundir"]
        .iter()
        .fold("[main]\n".to_owned(), |conf, name| {
            conf + &format!("{name} = {}/{name}\n", dir.display())
        });
    let path = dir.join("puppet.conf");
    if std::fs::read_to_string(&path).ok().as_deref() != Some(conf.as_str()) {
        // Tests run in parallel processes: each writes the same text aside, then renames.
        let aside = dir.join(format!("puppet.conf.{}", std::process::id()));
        std::fs::write(&aside, &conf).unwrap();
        std::fs::rename(&aside, &path).unwrap();
    }
    dir
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

    /// Unless `args` say how load balancers prove themselves, they do with the kit's key
    /// ([`super::lb::lb_key_file`]), if `command` runs pmcheck itself as the tests' user (the
    /// key file is theirs; a daemon run as another user through setpriv has none).
    pub fn start_with(mut command: Command, args: &[String]) -> Self {
        let proof_given = command.get_program() != bin().as_os_str()
            || args
                .iter()
                .any(|a| a.starts_with("--lb-key-file") || a.starts_with("--lb-address"));
        command.arg("serve");
        if !proof_given {
            command.arg("--lb-key-file").arg(super::lb::lb_key_file());
        }
        let child = command
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
                let addr =
                    logged_field(&line, " listening ", "address").map(|a| a.parse::<SocketAddr>());
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

    /// The agent-check address, from the daemon's "answering HAProxy agent checks" line.
    pub fn agent_addr(&self) -> SocketAddr {
        const NEEDLE: &str = " answering HAProxy agent checks ";
        self.wait_for_log(Duration::from_secs(10), NEEDLE);
        let log = self.log.lock().unwrap();
        log.iter()
            .find_map(|l| logged_field(l, NEEDLE, "address"))
            .and_then(|a| a.parse().ok())
            .expect("an agent-check address")
    }

    /// A scrape of `/metrics` as curl makes it (the classic text format), which must answer 200.
    pub fn scrape(&self) -> String {
        let reply = request(
            self.addr,
            "GET /metrics HTTP/1.1\r\nHost: pmcheck\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(reply.status, 200, "{}", reply.raw);
        reply.body
    }

    /// GET /status from this host, as `pmcheck status` asks it: the operator's view.
    pub fn status(&self) -> pmcheck::protocol::Status<'static> {
        let reply = request(
            self.addr,
            "GET /status HTTP/1.1\r\nHost: pmcheck\r\nConnection: close\r\n\r\n",
        );
        pmcheck::protocol::Status::from_json(&reply.body)
            .unwrap_or_else(|e| panic!("not the operator's view ({e}): {reply:?}"))
    }

    /// Asks for the operator's view (`/status`) until `pred` holds, failing after `within`.
    pub fn wait_for_json(
        &self,
        within: Duration,
        what: &str,
        pred: impl Fn(&pmcheck::protocol::Status<'static>) -> bool,
    ) -> pmcheck::protocol::Status<'static> {
        let deadline = Instant::now() + within;
        loop {
            let answer = self.status();
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

/// The value of the field `key` of a log line whose message is `message` (with the spaces
/// around it), as the daemon writes it: ` key=value`, the value bare (no space in it).
pub fn logged_field<'l>(line: &'l str, message: &str, key: &str) -> Option<&'l str> {
    let fields = line.split_once(message)?.1;
    (fields.split(' ')).find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
}

/// The value of one series of a scrape (its name and labels exactly as written), if present.
pub fn series<'t>(text: &'t str, series: &str) -> Option<&'t str> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
}
