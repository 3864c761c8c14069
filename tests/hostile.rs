//! Hostile clients and odd files: each defect a hostile test run found in pmcheck, kept here so
//! that it cannot come back. A health checker that can be knocked over takes the pool with it.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use common::operator::closed_port;
use common::*;

const SOON: Duration = Duration::from_secs(10);

fn drain_path(s: &Setup) -> std::path::PathBuf {
    s.state.path().join("drain")
}

/// Runs `pmcheck ARGS` with a deadline: a command that hangs fails the test instead of it.
fn pmcheck_within(within: Duration, args: &[&str]) -> std::process::Output {
    let mut child = pmcheck()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    if exited_within(&mut child, within).is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("`pmcheck {}` hung for {within:?}", args.join(" "));
    }
    child.wait_with_output().unwrap()
}

fn signal(d: &Daemon, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &d.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits for the daemon to exit, returning its exit code; fails after `within`.
fn exit_code(d: &mut Daemon, within: Duration) -> Option<i32> {
    let status = exited_within(d.child(), within);
    status
        .unwrap_or_else(|| panic!("pmcheck did not stop within {within:?}"))
        .code()
}

#[test]
fn a_fifo_at_the_drain_path_is_refused_and_nothing_hangs() {
    let s = Setup::new(Behavior::Running);
    let mut d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    nix::unistd::mkfifo(
        &drain_path(&s),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let a = d.wait_for(SOON, "UNKNOWN", is("UNKNOWN"));
    assert_eq!(a.status, 503, "fail closed: {a:?}");
    assert_contains!(
        a.body,
        "is a FIFO (named pipe), not a regular file",
        "{a:?}"
    );
    // The daemon keeps answering and probing, and the commands do not hang either.
    d.wait_probes(2, SOON);
    let state = s.state.path().display().to_string();
    let out = pmcheck_within(
        SOON,
        &["drain", "--state-dir", &state, "--reason", "over a fifo"],
    );
    assert!(out.status.success(), "{out:?}");
    d.wait_for(SOON, "DRAINED", is("DRAINED - over a fifo"));
    let out = pmcheck_within(SOON, &["undrain", "--state-dir", &state]);
    assert!(out.status.success(), "{out:?}");
    d.wait_for(SOON, "OK", is("OK"));
    nix::unistd::mkfifo(
        &drain_path(&s),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    d.wait_for(SOON, "UNKNOWN", is("UNKNOWN"));
    signal(&d, "TERM");
    assert_eq!(exit_code(&mut d, SOON), Some(0), "SIGTERM stops it");
}

#[test]
fn a_symlink_to_dev_zero_is_refused_unread() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    std::os::unix::fs::symlink("/dev/zero", drain_path(&s)).unwrap();
    let a = d.wait_for(SOON, "UNKNOWN", is("UNKNOWN"));
    assert_contains!(
        a.body,
        "is a symbolic link, which pmcheck does not follow",
        "{a:?}"
    );
    d.wait_probes(3, SOON);
    let rss = flood::rss_kib(d.pid()).expect("VmRSS");
    assert!(
        rss < 64 * 1024,
        "nothing was read from /dev/zero: {rss} KiB resident"
    );
}

#[test]
fn a_huge_record_is_refused_and_a_long_reason_is_cut_in_every_answer() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    // Written aside and renamed in: the watcher may read a file still being written, and see a
    // shorter run of `{` that is merely not JSON (the one failure of CI's run at 6884dff).
    replace(&drain_path(&s), &vec![b'{'; 1024 * 1024]);
    let a = d.wait_for(SOON, "UNKNOWN", is("UNKNOWN"));
    assert_contains!(a.body, "is 1048576 bytes, more than the 8192", "{a:?}");
    // A hand-written record under the size limit with a 4,000-character reason.
    let record = serde_json::json!({
        "reason": format!("{}\r\nX-Injected: yes", "r".repeat(4000)),
        "by": "someone",
        "since": "2026-11-22T10:00:00Z",
    });
    replace(&drain_path(&s), record.to_string().as_bytes());
    let a = d.wait_for(SOON, "DRAINED", is("DRAINED"));
    assert!(a.body.len() < 600, "bounded: {} bytes", a.body.len());
    assert_eq!(a.body.lines().count(), 1, "{a:?}");
    assert!(a.status_line.len() < 120, "{a:?}");
    let json = request(d.addr, "GET / HTTP/1.0\r\naccept: application/json\r\n\r\n");
    // (Loopback's JSON also carries the certificates' dates and production's deploy record,
    // about 600 bytes here.)
    assert!(
        json.body.len() < 2600,
        "bounded JSON: {} bytes",
        json.body.len()
    );
    assert!(!json.raw.contains("\r\nX-Injected"), "{json:?}");
}

#[test]
fn drain_refuses_a_reason_too_long_or_on_several_lines() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().display().to_string();
    let long = "x".repeat(300);
    let out = pmcheck_within(SOON, &["drain", "--state-dir", &dir, "--reason", &long]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_contains!(err, "300 characters long; keep it to 256");
    let out = pmcheck_within(SOON, &["drain", "--state-dir", &dir, "--reason", "a\nb"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(!state.path().join("drain").exists(), "nothing written");
}

#[test]
fn sighup_reloads_and_usr1_usr2_do_no_harm() {
    let s = Setup::new(Behavior::Running);
    let mut d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    assert_eq!(d.logged("loaded the TLS identity"), 1);
    signal(&d, "HUP");
    d.wait_for_log(
        SOON,
        "re-reading the certificates, the drain record and the key file signal=HUP",
    );
    d.wait_for_log(SOON, "re-read the drain record");
    let deadline = Instant::now() + SOON;
    while d.logged("loaded the TLS identity") < 2 {
        assert!(
            Instant::now() < deadline,
            "the identity was not reloaded: {:?}",
            d.log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&d, "USR1");
    signal(&d, "USR2");
    d.wait_for_log(
        SOON,
        "signal ignored (SIGHUP re-reads the files, SIGTERM stops) signal=USR2",
    );
    assert!(d.child().try_wait().unwrap().is_none(), "still running");
    assert_eq!(d.wait_for(SOON, "OK", is("OK")).status, 200);
    signal(&d, "TERM");
    assert_eq!(exit_code(&mut d, SOON), Some(0));
}

/// Issue 46 (a new operator): Puppet Server moved to another port in webserver.conf kept being
/// probed on the old one. Issue 54: and a stop's hold waited for a healthy probe the old port
/// never gave, so the node stayed drained for good, and nothing was said until a reload.
/// Puppet Server reads the file only at its start: the change is said as it is written, and the
/// probe moves when the old listener refuses, where the stop's hold is let go of once Puppet
/// Server is healthy there.
#[test]
fn a_listener_moved_in_webserver_conf_is_followed_once_the_old_one_refuses() {
    let mut s = Setup::new(Behavior::Running);
    let confd = tempfile::tempdir().unwrap();
    let web = confd.path().join("webserver.conf");
    let conf =
        |port: u16| format!("webserver: {{\n    ssl-host: 127.0.0.1\n    ssl-port: {port}\n}}\n");
    std::fs::write(&web, conf(s.stub.addr.port())).unwrap();
    let mut args = s.fast_args(&["--puppetserver-confd", &confd.path().display().to_string()]);
    let given = args.iter().position(|a| a == "--puppet-addr").unwrap();
    args.drain(given..given + 2);
    let mut d = Daemon::start(&args);
    // OK proves the probe found the stub through webserver.conf.
    d.wait_for(SOON, "OK", is("OK"));
    let old = s.stub.addr;
    let moved = closed_port();
    // Written as editors write: a new file renamed over the old. No reload.
    let edited = confd.path().join("webserver.conf.new");
    std::fs::write(&edited, conf(moved.port())).unwrap();
    std::fs::rename(&edited, &web).unwrap();
    let named = format!(
        "webserver.conf names another listener; pmcheck probes the old one, which still answers, and moves to the new one at the first probe the old one refuses (the restart of Puppet Server that applies the file) file={} from={old} to={moved}",
        web.display(),
    );
    d.wait_for_log(SOON, &named);
    assert_eq!(d.logged(&named), 1, "said once");
    assert_eq!(
        d.wait_for(SOON, "OK", is("OK")).status,
        200,
        "still probing the stub"
    );
    // Puppet Server restarts onto the new port: the stop's hold, then the old port refuses.
    let url = format!("http://{}/", d.addr);
    let stop = s.pmcheck("on-stop", &["--url", &url, "--max-wait", "1s"]);
    assert!(stop.status.success(), "{stop:?}");
    d.wait_for(SOON, "DRAINED by the stop", is("DRAINED"));
    let placeholder = Stub::start(&s.ca, &[CERTNAME], Behavior::Hang);
    drop(std::mem::replace(&mut s.stub, placeholder));
    d.wait_for_log(
        SOON,
        &format!(
            "Puppet Server's listener moved: the old one refuses and webserver.conf names the new one; probing the new one from now on file={} from={old} to={moved}",
            web.display()
        ),
    );
    let back = Stub::start_on(moved, &s.ca, &s.ca, &[CERTNAME], Behavior::Running);
    let now = std::time::UNIX_EPOCH.elapsed().unwrap().as_millis();
    (back.seen.jvm_start).store(now.try_into().unwrap(), std::sync::atomic::Ordering::SeqCst);
    d.wait_for(
        SOON,
        "OK on the new listener, the stop's hold let go of",
        is("OK"),
    );
    d.wait_for_json(
        SOON,
        "agent connections counted at the new listener",
        |status| (status.traffic.as_ref()).is_some_and(|t| t.listener == moved),
    );
    signal(&d, "TERM");
    assert_eq!(exit_code(&mut d, SOON), Some(0));
}

/// Issue 54: a certname or ssldir changed in puppet.conf is not taken up under a running prober
/// (another name may need a certificate Puppet has not signed): it is said as the file is
/// written, once, with the restart that takes it up.
#[test]
fn a_certname_changed_in_puppet_conf_is_said_with_the_restart_that_takes_it() {
    let s = Setup::new(Behavior::Running);
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("puppet.conf");
    let write = |certname: &str| {
        let edited = dir.path().join("puppet.conf.new");
        std::fs::write(&edited, format!("[main]\ncertname = {certname}\n")).unwrap();
        std::fs::rename(&edited, &conf).unwrap();
    };
    write(CERTNAME);
    let mut args = s.fast_args(&[]);
    for flag in ["--puppet-conf", "--certname"] {
        let at = args.iter().position(|a| a == flag).unwrap();
        args.drain(at..at + 2);
    }
    args.extend(["--puppet-conf".into(), conf.display().to_string()]);
    let d = Daemon::start(&args);
    // OK proves the certname came from puppet.conf: the stub's certificate names it.
    d.wait_for(SOON, "OK", is("OK"));
    let said = "Puppet's files now set this otherwise";
    write("puppet02.example.test");
    d.wait_for_log(
        SOON,
        &format!("{said}; pmcheck takes it up at its next start: systemctl restart pmcheck setting=certname running={CERTNAME} now=puppet02.example.test"),
    );
    // Back as it runs: quiet; a change after that is said again, once.
    write(CERTNAME);
    write("puppet03.example.test");
    d.wait_for_log(SOON, "now=puppet03.example.test");
    assert_eq!(
        d.wait_for(SOON, "OK", is("OK")).status,
        200,
        "probing as before"
    );
    assert_eq!(d.logged(said), 2, "{:?}", d.log.lock().unwrap());
}

/// Pads a PEM file to `len` bytes with newlines (PEM readers skip them), so that two different
/// certificates can have the same size.
fn padded(pem: &str, len: usize) -> Vec<u8> {
    let mut bytes = pem.as_bytes().to_vec();
    assert!(bytes.len() <= len);
    bytes.resize(len, b'\n');
    bytes
}

#[test]
fn a_certificate_rewritten_in_place_with_its_size_and_mtime_kept_is_noticed() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    let key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(fixture("rsa.pkcs8.pem")).unwrap())
        .unwrap();
    let ours = s.ca.issue(CERTNAME, &[], &key);
    replace(&s.files.hostcert, &padded(&ours, 4096));
    d.wait_probes(2, SOON);
    assert_eq!(d.poll().status, 200, "the padded certificate works");
    // Another CA's certificate for the same key, written over the same inode, same size, and
    // the old mtime put back: only the change time tells.
    let theirs = Ca::new("else").issue(CERTNAME, &[], &key);
    let mtime = std::fs::metadata(&s.files.hostcert)
        .unwrap()
        .modified()
        .unwrap();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&s.files.hostcert)
        .unwrap();
    file.write_all(&padded(&theirs, 4096)).unwrap();
    file.set_modified(mtime).unwrap();
    drop(file);
    let a = d.wait_for(SOON, "DOWN", is("DOWN"));
    assert_contains!(a.body, "rejected this host's certificate", "{a:?}");
}

#[test]
fn a_key_made_unreadable_is_unknown() {
    let s = Setup::new(Behavior::Running);
    // As root the key stays readable whatever its mode: run the daemon as nobody.
    let command = if running_as_root() {
        for dir in [s.files.dir.path(), s.state.path()] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        for file in [
            &s.files.hostcert,
            &s.files.hostprivkey,
            &s.files.localcacert,
        ] {
            std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(bin())
            .env_clear()
            .envs(no_puppet_env())
            .env("RUST_LOG", "info");
        c
    } else {
        pmcheck()
    };
    let d = Daemon::start_with(command, &s.fast_args(&[]));
    d.wait_for(SOON, "OK", is("OK"));
    std::fs::set_permissions(&s.files.hostprivkey, std::fs::Permissions::from_mode(0o000)).unwrap();
    let a = d.wait_for(SOON, "UNKNOWN", is("UNKNOWN"));
    assert_contains!(a.body, "cannot read hostprivkey", "{a:?}");
    assert_contains!(a.body, "Permission denied", "{a:?}");
}

#[test]
fn pem_wrapped_garbage_is_named_as_such_not_as_a_mismatch() {
    let s = Setup::new(Behavior::Running);
    replace(
        &s.files.hostcert,
        b"-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
    );
    let d = s.daemon(&[]);
    let a = d.wait_for(SOON, "UNKNOWN", is("UNKNOWN"));
    assert_contains!(a.body, "not a valid X.509 certificate", "{a:?}");
    assert!(!a.body.contains("do not fit together"), "{a:?}");
}

#[test]
fn line_breaks_from_puppet_server_stay_out_of_answers_and_logs() {
    let s = Setup::new(Behavior::Reply(
        503,
        "stopping\r\nX-Injected: 1",
        "text/plain",
    ));
    let d = s.daemon(&[]);
    let a = d.wait_for(SOON, "DOWN", is("DOWN"));
    assert_eq!(
        a.body,
        "DOWN - Puppet Server reports `stopping X-Injected: 1`, not `running`\n"
    );
    assert!(!a.raw.contains("\r\nX-Injected"), "{a:?}");
    d.wait_for_log(SOON, "verdict changed verdict=DOWN ");
    assert_eq!(
        d.logged("X-Injected"),
        1,
        "on the verdict line: {:?}",
        d.log.lock().unwrap()
    );
    assert_eq!(
        d.logged(
            r#"verdict changed verdict=DOWN reason="Puppet Server reports `stopping X-Injected: 1`"#
        ),
        1
    );
}

#[test]
fn serve_creates_a_missing_state_directory_and_warns_about_a_world_writable_one() {
    let s = Setup::new(Behavior::Running);
    let missing = s.state.path().join("new/state");
    let missing_text = missing.display().to_string();
    let args = common::args(&s.files, s.stub.addr, &missing, FAST);
    let d = Daemon::start(&args);
    assert_eq!(
        d.wait_for(SOON, "OK", is("OK")).status,
        200,
        "not UNKNOWN for want of a directory"
    );
    let mode = std::fs::metadata(&missing).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755);
    assert_eq!(d.logged("created the state directory"), 1);
    drop(d);

    std::fs::set_permissions(&missing, std::fs::Permissions::from_mode(0o777)).unwrap();
    let d = Daemon::start(&args);
    d.wait_for_log(SOON, "is writable by every user (mode 777)");
    let config = common::args(&s.files, s.stub.addr, &missing, &[]);
    let mut config: Vec<&str> = config.iter().map(String::as_str).collect();
    config.insert(0, "config");
    let out = pmcheck_within(SOON, &config);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_contains!(
        text,
        &format!("warning: state directory {missing_text} is writable by every user"),
        "{out:?}"
    );
}

#[test]
fn the_drain_record_says_who_really_drained() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().display().to_string();
    // `pmcheck drain` with these variables set: who the record says drained.
    let drained_by = |vars: &[(&str, &str)]| {
        let out = pmcheck()
            .envs(vars.iter().copied())
            .args(["drain", "--state-dir", &dir])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let record: serde_json::Value =
            serde_json::from_slice(&std::fs::read(state.path().join("drain")).unwrap()).unwrap();
        record["holders"][0]["by"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let spoofed = [
        ("USER", "mallory"),
        ("LOGNAME", "mallory"),
        ("SUDO_USER", "mallory"),
        ("SUDO_UID", "4242"),
    ];
    assert_eq!(
        drained_by(&spoofed),
        whoami(),
        "USER and a SUDO_USER without a matching SUDO_UID are not believed"
    );
    if running_as_root() {
        // What sudo sets for a real person.
        let sudo = [("SUDO_USER", "nobody"), ("SUDO_UID", "65534")];
        assert_eq!(drained_by(&sudo), "nobody via sudo");
    }
}

#[test]
fn drain_over_a_directory_says_so_and_does_not_blame_permissions() {
    let state = tempfile::tempdir().unwrap();
    std::fs::create_dir(state.path().join("drain")).unwrap();
    std::fs::write(state.path().join("drain/x"), "").unwrap();
    let dir = state.path().display().to_string();
    let out = pmcheck_within(SOON, &["drain", "--state-dir", &dir]);
    assert_eq!(out.status.code(), Some(73), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_contains!(
        err,
        "/drain is a directory, not a record: remove it by hand"
    );
    assert!(!err.contains("as root"), "{err}");
}

#[test]
fn drain_sweeps_the_temporary_files_of_killed_drains() {
    let state = tempfile::tempdir().unwrap();
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let leftover = state.path().join(format!(".drain.{dead}.tmp"));
    std::fs::write(&leftover, "{\"reas").unwrap();
    let dir = state.path().display().to_string();
    let out = pmcheck_within(SOON, &["undrain", "--state-dir", &dir]);
    assert!(out.status.success(), "{out:?}");
    assert!(!leftover.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reads_a_bounded_answer() {
    // A server that streams an endless body.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut stream, _) = listener.accept().await.unwrap();
        // The request first, as a server does.
        let mut request = Vec::new();
        let mut byte = [0; 1];
        while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap_or(0) == 1 {
            request.push(byte[0]);
        }
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            .await;
        let chunk = format!("{:x}\r\n{}\r\n", 8192, "x".repeat(8192));
        // Bounded: 100 MiB at most, and it stops when the client goes.
        for _ in 0..12_800 {
            if stream.write_all(chunk.as_bytes()).await.is_err() {
                break;
            }
        }
    });
    let url = format!("http://{addr}/");
    let out = tokio::task::spawn_blocking(move || pmcheck_within(SOON, &["status", "--url", &url]))
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(69),
        "not pmcheck: unavailable {out:?}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_contains!(err, "larger than 64 KiB");
    server.abort();
}

#[test]
fn allow_closes_other_sources_before_reading_a_byte() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&["--allow", "127.0.0.2/32", "--allow", "10.0.0.0/8"]);
    d.wait_for_log(
        SOON,
        "accepting polls only from these networks allow=127.0.0.2/32,10.0.0.0/8",
    );
    let poll = |source: &str| {
        let mut stream = connect_from(source, d.addr, SOON).unwrap();
        let _ = stream.write_all(b"OPTIONS / HTTP/1.0\r\n\r\n");
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    };
    let deadline = Instant::now() + SOON;
    while !poll("127.0.0.2").starts_with("HTTP/1.0 200") {
        assert!(Instant::now() < deadline, "the allowed source is answered");
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..50 {
        assert_eq!(poll("127.0.0.1"), "", "no answer outside --allow");
    }
    d.wait_for_log(
        SOON,
        "from outside --allow in the last 10s count=1 peer=127.0.0.1",
    );
    assert!(
        d.logged("outside --allow") <= 2,
        "said a few times, not 50: {:?}",
        d.log.lock().unwrap()
    );
}

/// Anyone who can open the state directory (0755) could hold a `flock` of it: on e5ddf73 a
/// shared one by user nobody blocked every drain, the emergency one too, forever. Changes
/// now lock `STATE_DIR/lock` (0660, the directory's group): a lock of the directory blocks
/// nothing, and a lock held by whoever can open the file bounds the wait and names them.
#[test]
fn a_lock_of_the_state_directory_blocks_no_drain_and_a_held_lock_is_named() {
    use nix::fcntl::{Flock, FlockArg};
    use std::os::unix::fs::MetadataExt as _;
    let s = Setup::new(Behavior::Running);
    let state = s.state.path().display().to_string();
    let dir = std::fs::File::open(s.state.path()).unwrap();
    let dir_lock = Flock::lock(dir, FlockArg::LockShared).unwrap();
    let out = pmcheck_within(
        SOON,
        &["drain", "--reason", "emergency", "--state-dir", &state],
    );
    assert!(out.status.success(), "{out:?}");
    drop(dir_lock);
    let lock = s.state.path().join("lock");
    assert_eq!(std::fs::metadata(&lock).unwrap().mode() & 0o777, 0o660);

    let held = Flock::lock(std::fs::File::open(&lock).unwrap(), FlockArg::LockExclusive).unwrap();
    let out = pmcheck_within(Duration::from_secs(30), &["undrain", "--state-dir", &state]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        err.contains(&format!("{} is held by ", lock.display()))
            && err.contains("was not released within 10s"),
        "{err}"
    );
    if std::fs::read_to_string("/proc/locks").is_ok_and(|l| l.contains("FLOCK")) {
        assert_contains!(err, &format!("PID {} (", std::process::id()), "{err}");
    }
    drop(held);
    assert!(
        s.state.path().join("drain").exists(),
        "the record is unchanged"
    );
}

/// Every file the daemon or a command reads goes through one reader that refuses what is not a
/// regular file before reading and bounds the size. On e5ddf73 a FIFO at the CRL hung `check`
/// for more than 30 s, a FIFO at a deploy record froze the daemon's code readings, and the
/// daemon then ignored SIGTERM; a 59 MB CRL cost `check` 285 MB. On c8a278e root's `check`
/// still ran the `open()` of what stood there (`/dev/watchdog` arms on open): here a link to a
/// FIFO, whose opens inotify counts, is examined and never opened.
#[test]
fn a_fifo_or_a_huge_file_where_a_crl_or_deploy_record_belongs_hangs_nothing() {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let s = Setup::new(Behavior::Running);
    let fifo = s.files.dir.path().join("device");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let opens = Inotify::init(InitFlags::IN_NONBLOCK).unwrap();
    opens.add_watch(&fifo, AddWatchFlags::IN_OPEN).unwrap();
    let crl = s.files.dir.path().join("crl.pem");
    std::os::unix::fs::symlink(&fifo, &crl).unwrap();
    let crl_arg = crl.display().to_string();
    let mut check: Vec<String> = vec!["check".into()];
    check.extend(s.args(&["--hostcrl", &crl_arg]));
    let check: Vec<&str> = check.iter().map(String::as_str).collect();
    let out = pmcheck_within(SOON, &check);
    let line = String::from_utf8_lossy(&out.stdout);
    assert_contains!(
        line,
        &format!("hostcrl {crl_arg} cannot be read: it is a FIFO (named pipe), not a regular file")
    );
    match opens.read_events() {
        Err(nix::errno::Errno::EAGAIN) => {}
        seen => panic!("`check` opened the FIFO at the CRL: {seen:?}"),
    }

    // A daemon with a FIFO at the CRL and at a deploy record: it answers, shows why, and
    // stops at SIGTERM.
    let env = s.files.dir.path().join("environments/production");
    std::fs::create_dir_all(&env).unwrap();
    nix::unistd::mkfifo(
        &env.join(".r10k-deploy.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let conf = s.files.dir.path().join("puppet.conf");
    std::fs::write(
        &conf,
        format!(
            "[server]\nenvironmentpath = {}\n",
            env.parent().unwrap().display()
        ),
    )
    .unwrap();
    let conf_arg = conf.display().to_string();
    let mut args = s.args(&["--hostcrl", &crl_arg, "--code-environment", "production"]);
    let at = args.iter().position(|a| a == "--puppet-conf").unwrap();
    args[at + 1] = conf_arg;
    let mut d = Daemon::start(&args);
    let answer = d.wait_for_json(SOON, "the deploy record read", |a| {
        a.code.as_ref().is_some_and(|c| !c.is_empty())
    });
    let code = &answer.code.as_ref().unwrap()[0];
    assert_eq!(code.state, "unreadable", "{code:?}");
    assert!(
        code.why
            .as_deref()
            .is_some_and(|w| w.contains("it is a FIFO (named pipe), not a regular file")),
        "{code:?}"
    );
    signal(&d, "TERM");
    assert_eq!(exit_code(&mut d, SOON), Some(0), "SIGTERM stops it");

    // A CRL over 16 MiB is refused by its size, unread.
    std::fs::remove_file(&crl).unwrap();
    let huge = std::fs::File::create(&crl).unwrap();
    huge.set_len(16 * 1024 * 1024 + 1).unwrap();
    let out = pmcheck_within(SOON, &check);
    let line = String::from_utf8_lossy(&out.stdout);
    assert_contains!(
        line,
        &format!(
            "hostcrl {crl_arg} cannot be read: it is 16385 KiB, more than the 16384 KiB such a file may be"
        )
    );
}

/// Whatever the daemon refuses to read at the record's path it answers UNKNOWN for, naming
/// `pmcheck undrain`; and `pmcheck undrain` clears it: a link itself (never what it points to),
/// a FIFO, an empty directory. The node is back to OK after each.
#[test]
fn undrain_clears_what_the_daemon_refuses_to_read() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("precious");
    std::fs::write(&target, "not pmcheck's").unwrap();
    type Plant<'a> = (&'a str, &'a dyn Fn(&std::path::Path));
    let plant: [Plant; 3] = [
        ("a symbolic link", &|p| {
            std::os::unix::fs::symlink(&target, p).unwrap()
        }),
        ("a FIFO", &|p| {
            nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap()
        }),
        ("an empty directory", &|p| std::fs::create_dir(p).unwrap()),
    ];
    for (what, plant) in plant {
        plant(&drain_path(&s));
        let a = d.wait_for(SOON, "UNKNOWN", is("UNKNOWN"));
        assert_contains!(a.body, "pmcheck undrain", "{what}: {a:?}");
        let out = s.pmcheck("undrain", &[]);
        assert_eq!(out.status.code(), Some(0), "{what}: {out:?}");
        assert_contains!(
            stdout(&out),
            "which pmcheck could not read as a drain record",
            "{what}: {out:?}"
        );
        assert!(std::fs::symlink_metadata(drain_path(&s)).is_err(), "{what}");
        d.wait_for(SOON, "OK again", is("OK"));
    }
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "not pmcheck's");
}

/// An `--allow` that leaves out loopback shuts the operator's own commands out: `config` warns
/// before the restart, and `status` says the daemon refused it by --allow, not that it is down.
#[test]
fn an_allow_without_loopback_is_warned_of_and_named_when_it_refuses() {
    let s = Setup::new(Behavior::Running);
    let config = pmcheck()
        .args(["config", "--certname", "x", "--env-file", "none"])
        .args(["--allow", "192.0.2.10/32"])
        .output()
        .unwrap();
    assert_contains!(
        stdout(&config),
        "warning: --allow (PMCHECK_ALLOW) 192.0.2.10/32 admits neither 127.0.0.1 nor ::1",
        "{config:?}"
    );
    let with_loopback = pmcheck()
        .args(["config", "--certname", "x", "--env-file", "none"])
        .args(["--allow", "192.0.2.10/32", "--allow", "127.0.0.1/32"])
        .output()
        .unwrap();
    assert!(
        !stdout(&with_loopback).contains("admits neither"),
        "{with_loopback:?}"
    );
    let d = s.daemon(&["--allow", "192.0.2.10/32"]);
    d.wait_for_log(
        SOON,
        "accepting polls only from these networks allow=192.0.2.10/32",
    );
    let url = format!("http://{}/", d.addr);
    let status = |env_file: &str| {
        let out = (pmcheck().env("PMCHECK_ENV_FILE", env_file))
            .args(["status", "--url", &url])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(69), "{out:?}");
        assert!(
            !stderr(&out).contains("is `pmcheck serve` running"),
            "{out:?}"
        );
        stderr(&out)
    };
    // No environment file to read: both causes.
    assert_contains!(status("none"), "refused by its --allow (PMCHECK_ALLOW)");
    assert_contains!(status("none"), "or it shed the connection under load");
    // The service's file says which: its PMCHECK_ALLOW leaves this host out.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pmcheck");
    std::fs::write(&file, "PMCHECK_ALLOW=192.0.2.10/32\n").unwrap();
    let said = status(&file.display().to_string());
    let named = format!(
        "refused by its --allow: PMCHECK_ALLOW in {} is 192.0.2.10/32",
        file.display()
    );
    assert_contains!(said, &named);
    assert!(!said.contains("shed"), "{said}");
}
