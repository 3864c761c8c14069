//! The systemd protocols without systemd as PID 1: socket activation (`LISTEN_FDS`/`LISTEN_PID`,
//! passed as systemd passes them) and `sd_notify` (READY, WATCHDOG, STOPPING).

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn recv(socket: &UnixDatagram, within: Duration) -> String {
    socket.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 1024];
    let n = socket.recv(&mut buf).expect("a notification from pmcheck");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Starts pmcheck the way systemd does: a listening socket as fd 3, `LISTEN_FDS=1` and
/// `LISTEN_PID` set to pmcheck's own PID (the shell's, which `exec` keeps).
fn socket_activated(listener: std::net::TcpListener, listen_pid: &str, args: &[String]) -> Daemon {
    let script = format!("export LISTEN_FDS=1 LISTEN_PID={listen_pid}; exec \"$0\" serve \"$@\"");
    let mut command = Command::new("sh");
    command
        .args(["-c", &script, env!("CARGO_BIN_EXE_pmcheck")])
        .args(args);
    like_systemd(&mut command, listener);
    Daemon::adopt(command.spawn().unwrap())
}

/// What systemd gives a unit's process: a clean environment (with the test's Puppet paths and
/// `RUST_LOG=info`), no stdin or stdout, stderr piped (for the test to read), `listener` as fd 3.
fn like_systemd(command: &mut Command, listener: std::net::TcpListener) {
    use command_fds::{CommandFdExt, FdMapping};
    command
        .env_clear()
        .envs(no_puppet_env())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
        .fd_mappings(vec![FdMapping {
            parent_fd: listener.into(),
            child_fd: 3,
        }])
        .expect("fd 3 is free in the child");
}

#[test]
fn serve_takes_its_listening_socket_from_systemd() {
    let s = Setup::new(Behavior::Running);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // A --listen too: with sockets from systemd it is ignored, and said so.
    let daemon = socket_activated(
        listener,
        "$$",
        &s.args(&["--interval", "100ms", "--listen", "127.0.0.1:0"]),
    );
    assert_eq!(daemon.addr, addr, "serves on the socket it was given");
    assert_eq!(
        daemon.logged("ignoring --listen/PMCHECK_LISTEN"),
        1,
        "{:?}",
        daemon.log.lock().unwrap()
    );
    assert_eq!(
        daemon.logged("using listening sockets from systemd sockets=1"),
        1,
        "{:?}",
        daemon.log.lock().unwrap()
    );
    assert_eq!(
        daemon.logged(" listening address="),
        1,
        "only the inherited socket"
    );
    let answer = daemon.wait_for(Duration::from_secs(10), "OK", |a| a.status == 200);
    assert_eq!(
        answer.body,
        "OK - Puppet Server is running, 1 of 1 JRubies free\n"
    );
}

#[test]
fn sockets_meant_for_another_process_are_left_alone() {
    let s = Setup::new(Behavior::Running);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let inherited = listener.local_addr().unwrap();
    let daemon = socket_activated(listener, "1", &s.args(&["--listen", "127.0.0.1:0"]));
    assert_ne!(
        daemon.addr, inherited,
        "LISTEN_PID names another process: bind --listen instead"
    );
    assert_eq!(daemon.logged("from systemd"), 0);
}

/// A notify socket as systemd's (in a directory kept while the test runs), and `pmcheck`
/// told of it with `env` besides.
fn notified(env: &[(&str, &str)]) -> (tempfile::TempDir, UnixDatagram, Command) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    let mut command = pmcheck();
    command
        .env("NOTIFY_SOCKET", &path)
        .envs(env.iter().copied());
    (dir, socket, command)
}

#[test]
fn serve_notifies_ready_watchdog_and_stopping() {
    let s = Setup::new(Behavior::Running);
    let (_dir, socket, command) = notified(&[("WATCHDOG_USEC", "200000")]);
    let mut daemon = Daemon::start_with(command, &s.args(&[]));

    let first = recv(&socket, Duration::from_secs(10));
    assert!(first.starts_with("READY=1"), "{first:?}");
    let started = Instant::now();
    let ping = recv(&socket, Duration::from_secs(5));
    assert_eq!(ping, "WATCHDOG=1");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "pings at half of WatchdogSec"
    );

    let status = Command::new("kill")
        .args(["-TERM", &daemon.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let message = recv(&socket, Duration::from_secs(5));
        if message == "STOPPING=1" {
            break;
        }
        assert_eq!(message, "WATCHDOG=1", "only watchdog pings before STOPPING");
        assert!(Instant::now() < deadline, "no STOPPING=1 after SIGTERM");
    }
    let code = daemon.child().wait().unwrap().code();
    assert_eq!(code, Some(0));
}

/// The pings stand for progress, not for a timer: a prober wedged after its first probe (the
/// test seam `TEST_PMCHECK_WEDGE_PROBER`) stops them once its latest report is twice as old as
/// the verdict's own limit (here 2 x 2 x (100ms + 200ms)), and the daemon says why, once.
#[test]
fn a_wedged_prober_stops_the_watchdogs_pings() {
    let s = Setup::new(Behavior::Running);
    let (_dir, socket, command) = notified(&[
        ("WATCHDOG_USEC", "200000"),
        ("TEST_PMCHECK_WEDGE_PROBER", "1"),
    ]);
    let daemon = Daemon::start_with(
        command,
        &s.args(&["--interval", "100ms", "--timeout", "200ms"]),
    );
    assert!(recv(&socket, Duration::from_secs(10)).starts_with("READY=1"));
    assert_eq!(
        recv(&socket, Duration::from_secs(5)),
        "WATCHDOG=1",
        "it pings while the first report is fresh"
    );
    // Taking the pings as systemd does (a full queue would drop them), until the line.
    socket
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = [0u8; 64];
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.logged("not pinging systemd's watchdog") == 0 {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            daemon.log.lock().unwrap()
        );
        let _ = socket.recv(&mut buf);
    }
    // A ping sent before the line may still be queued; none comes after.
    socket
        .set_read_timeout(Some(Duration::from_millis(1000)))
        .unwrap();
    let mut late = 0;
    while socket.recv(&mut buf).is_ok() {
        late += 1;
        assert!(late <= 1, "pings went on after the daemon said it stopped");
    }
    assert_eq!(
        daemon.logged(r#"not pinging systemd's watchdog: systemd restarts pmcheck once that long passes without a ping (WatchdogSec) why="the prober has made no probe for"#),
        1,
        "{:?}",
        daemon.log.lock().unwrap()
    );
}

#[test]
fn watchdog_for_another_process_is_ignored() {
    let s = Setup::new(Behavior::Running);
    let (_dir, socket, command) = notified(&[("WATCHDOG_USEC", "100000"), ("WATCHDOG_PID", "1")]);
    let _daemon = Daemon::start_with(command, &s.args(&[]));
    assert!(recv(&socket, Duration::from_secs(10)).starts_with("READY=1"));
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(
        socket.recv(&mut buf).is_err(),
        "WATCHDOG_PID names another process: no pings"
    );
}

/// A process started as systemd starts a unit's: stderr is a journal stream (`JOURNAL_STREAM`
/// names it) and `/run/systemd/journal/socket` is journald's, here a socket of the test's,
/// mounted there in a mount namespace of pmcheck's own. Killed when dropped.
struct Journaled {
    child: std::process::Child,
    journald: UnixDatagram,
    entries: Vec<Entry>,
}

/// One journal entry's fields, decoded from journald's native protocol: `NAME=value\n`, or
/// `NAME\n`, the value's length as 64-bit little-endian, the value and `\n`.
#[derive(Debug, Clone)]
struct Entry(Vec<(String, String)>);

impl Entry {
    fn decode(mut bytes: &[u8]) -> Self {
        let mut fields = Vec::new();
        while let Some(end) = bytes.iter().position(|&b| b == b'=' || b == b'\n') {
            let name = String::from_utf8_lossy(&bytes[..end]).into_owned();
            let value;
            if bytes[end] == b'=' {
                let rest = &bytes[end + 1..];
                let stop = rest.iter().position(|&b| b == b'\n').expect("a line's end");
                value = &rest[..stop];
                bytes = &rest[stop + 1..];
            } else {
                let (len, rest) = bytes[end + 1..].split_at(8);
                let len = u64::from_le_bytes(len.try_into().unwrap()) as usize;
                value = &rest[..len];
                assert_eq!(rest[len], b'\n', "a binary field ends with a newline");
                bytes = &rest[len + 1..];
            }
            fields.push((name, String::from_utf8_lossy(value).into_owned()));
        }
        Self(fields)
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Drop for Journaled {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Journaled {
    /// The first entry (read so far or next) for which `pred` holds.
    fn entry(&mut self, what: &str, pred: impl Fn(&Entry) -> bool) -> Entry {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(found) = self.entries.iter().find(|e| pred(e)) {
                return found.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no journal entry {what} in {:#?}",
                self.entries
            );
            self.journald.set_read_timeout(Some(left)).unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            if let Ok(n) = self.journald.recv(&mut buf) {
                self.entries.push(Entry::decode(&buf[..n]));
            }
        }
    }
}

/// Under systemd every log line is a journal entry with its facts as fields, so that
/// `journalctl -u pmcheck VERDICT=DRAINED` or `ACTION=drain` selects them; nothing goes to
/// stderr besides.
#[test]
fn under_systemd_every_line_is_a_journal_entry_with_its_fields() {
    let root = nix::unistd::geteuid().is_root();
    let s = Setup::new(Behavior::Running);
    let dir = tempfile::tempdir().unwrap();
    let journald = UnixDatagram::bind(dir.path().join("socket")).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Exit 97: no stand-in journald could be mounted (no mount namespace here). The new
    // namespace keeps the propagation it inherits (`unshare --propagation private` must change
    // `/`'s, which a chroot such as CI's fresh root cannot, `/` not being a mount there): its
    // /run, or else its `/`, is made private before anything is mounted, so nothing reaches
    // the namespace it came from.
    let script = "{ { mount --make-rprivate /run 2>/dev/null || mount --make-rprivate /; } \
                  && mount -t tmpfs tmpfs /run \
                  && mkdir -p /run/systemd/journal \
                  && mount --bind \"$0\" /run/systemd/journal; } || exit 97; \
                  JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2) || exit 97; \
                  export JOURNAL_STREAM LISTEN_FDS=1 LISTEN_PID=$$; bin=$1; shift; \
                  exec \"$bin\" serve \"$@\"";
    let mut command = Command::new("unshare");
    if !root {
        command.arg("--map-root-user");
    }
    command
        .args(["--mount", "--propagation", "unchanged", "sh", "-c", script])
        .arg(dir.path())
        .arg(bin())
        .args(s.args(&["--lb-address", "127.0.0.1/32"]));
    like_systemd(&mut command, listener);
    command.env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    let child = command.spawn().expect("unshare (util-linux) runs");
    let mut daemon = Journaled {
        child,
        journald,
        entries: Vec::new(),
    };
    if let Some(status) = exited_within(&mut daemon.child, Duration::from_millis(300)) {
        let mut said = String::new();
        if let Some(mut e) = daemon.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut said);
        }
        // unshare itself exits 1 when it may not make the namespaces.
        assert!(
            matches!(status.code(), Some(1 | 97)) && !said.contains("pmcheck"),
            "pmcheck ended: {status}: {said}"
        );
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true and no mount namespace for a stand-in journald ({status}): {said}"
        );
        eprintln!(
            "!!!!!!!! SKIPPED: no mount namespace for a stand-in journald ({status}): {said}"
        );
        return;
    }
    let ok = daemon.entry("VERDICT=OK", |e| e.get("VERDICT") == Some("OK"));
    let running = "Puppet Server is running, 1 of 1 JRubies free";
    assert_eq!(ok.get("SYSLOG_IDENTIFIER"), Some("pmcheck"), "{ok:?}");
    // The message people read (`journalctl -u pmcheck`) carries the fields too, as stderr does.
    assert_eq!(
        ok.get("MESSAGE"),
        Some(format!(r#"verdict changed verdict=OK reason="{running}" weight=100"#).as_str())
    );
    assert_eq!(ok.get("PRIORITY"), Some("6"), "info: {ok:?}");
    assert_eq!(ok.get("REASON"), Some(running));
    assert_eq!(ok.get("WEIGHT"), Some("100"));
    let out = s.pmcheck("drain", &["--reason", "kernel 6.1"]);
    assert!(out.status.success(), "{out:?}");
    let event = daemon.entry("ACTION=drain", |e| e.get("ACTION") == Some("drain"));
    assert_eq!(event.get("REASON"), Some("kernel 6.1"), "{event:?}");
    assert_eq!(event.get("HOLDER"), Some("drain"), "{event:?}");
    assert_eq!(event.get("UNTIL"), None, "no --for, no UNTIL: {event:?}");
    let drained = daemon.entry("VERDICT=DRAINED", |e| e.get("VERDICT") == Some("DRAINED"));
    // Who and why, apart from Puppet Server's words; no weight, as the agent line sends none.
    // (INFO is syslog's 6, info; WARN 4, warning.)
    assert!(
        (drained.get("DRAIN")).is_some_and(|d| d.contains("kernel 6.1")),
        "{drained:?}"
    );
    assert_eq!(drained.get("WEIGHT"), None, "{drained:?}");
    assert_eq!(
        drained.get("PRIORITY"),
        Some("6"),
        "info, not a warning: {drained:?}"
    );
    let reply = request(addr, "GET / HTTP/1.0\r\n\r\n");
    assert_eq!(
        reply.status, 503,
        "the socket systemd passed answers: {reply:?}"
    );
    let _ = daemon.child.kill();
    let _ = daemon.child.wait();
    let mut stderr = String::new();
    if let Some(mut e) = daemon.child.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut stderr).unwrap();
    }
    assert_eq!(stderr, "", "everything went to the journal");
}
