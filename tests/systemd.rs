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
    use command_fds::{CommandFdExt, FdMapping};
    let script = format!("export LISTEN_FDS=1 LISTEN_PID={listen_pid}; exec \"$0\" serve \"$@\"");
    let mut command = Command::new("sh");
    command
        .env_clear()
        .envs(no_puppet_env())
        .env("RUST_LOG", "info")
        .args(["-c", &script, env!("CARGO_BIN_EXE_pmcheck")])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
        .fd_mappings(vec![FdMapping {
            parent_fd: listener.into(),
            child_fd: 3,
        }])
        .expect("fd 3 is free in the child");
    Daemon::adopt(command.spawn().unwrap())
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
        daemon.logged("using 1 listening socket(s) from systemd"),
        1,
        "{:?}",
        daemon.log.lock().unwrap()
    );
    assert_eq!(
        daemon.logged("listening on"),
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

#[test]
fn serve_notifies_ready_watchdog_and_stopping() {
    let s = Setup::new(Behavior::Running);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    let mut command = pmcheck();
    command
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "200000");
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

#[test]
fn watchdog_for_another_process_is_ignored() {
    let s = Setup::new(Behavior::Running);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    let mut command = pmcheck();
    command
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "100000")
        .env("WATCHDOG_PID", "1");
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
