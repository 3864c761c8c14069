//! xinetd mode: one request on stdin, one answer on stdout, the same verdict and body.

mod common;

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use common::*;

/// xinetd mode: one request on stdin, one answer on stdout, same verdict and body.
fn inetd_setup() -> Setup {
    Setup::with_key(Behavior::Running, "ec.pkcs8.pem", "ec.sec1.pem")
}

#[test]
fn inetd_answers_one_poll_from_one_probe() {
    let s = inetd_setup();
    let answer = inetd(&s, b"OPTIONS / HTTP/1.0\r\n\r\n", true);
    assert_eq!(answer.status_line, "HTTP/1.0 200 OK", "{answer:?}");
    assert_eq!(
        answer.body,
        "OK - Puppet Server is running, 1 of 1 JRubies free\n"
    );
    assert_eq!(
        answer.header("content-length"),
        Some(answer.body.len().to_string().as_str())
    );
    assert_eq!(s.stub.requests(), 1, "one probe for one poll");
}

#[test]
fn inetd_answers_only_the_first_of_two_pipelined_requests() {
    let s = inetd_setup();
    let answer = inetd(
        &s,
        b"GET / HTTP/1.1\r\nhost: x\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\n\r\n",
        false,
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        answer.raw.matches("HTTP/1.1 200").count(),
        1,
        "exactly one answer: {answer:?}"
    );
}

#[test]
fn inetd_answers_drained() {
    let s = inetd_setup();
    std::fs::write(s.state.path().join("drain"), "").unwrap();
    let answer = inetd(&s, b"GET / HTTP/1.0\r\n\r\n", true);
    assert_eq!(answer.status, 503);
    assert!(answer.body.starts_with("DRAINED - "), "{answer:?}");
}

#[test]
fn inetd_refuses_an_oversized_request() {
    let s = inetd_setup();
    let huge = format!(
        "GET / HTTP/1.1\r\nx-padding: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let answer = inetd(&s, huge.as_bytes(), true);
    assert_ne!(
        answer.status, 200,
        "an oversized request is refused: {answer:?}"
    );
}

/// Settings that cannot be resolved still get an answer: under xinetd stderr is the socket.
#[test]
fn inetd_answers_unknown_when_the_settings_are_bad() {
    let undrained = tempfile::tempdir().unwrap();
    let mut child = pmcheck()
        .args(["inetd", "--puppet-conf", "/nonexistent/puppet.conf"])
        .args(["--state-dir", &undrained.path().display().to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"OPTIONS / HTTP/1.0\r\n\r\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let answer = parse_answer(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(
        answer.body.starts_with(
            "UNKNOWN - cannot probe Puppet Server: --puppet-conf /nonexistent/puppet.conf"
        ),
        "{answer:?}"
    );
}

#[test]
fn inetd_ends_an_unfinished_request_at_the_read_deadline() {
    let s = inetd_setup();
    let started = std::time::Instant::now();
    let answer = inetd(&s, b"GET / HTTP/1.1\r\n", false);
    assert_eq!(
        answer.status, 0,
        "an unfinished request gets no answer: {answer:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the read deadline ends it: {:?}",
        started.elapsed()
    );
}
