//! `pmcheck check`, the monitoring plugin: its one line, perfdata and exit codes.

mod common;

use std::time::Duration;

use common::*;

const SOON: Duration = Duration::from_secs(10);

fn check_setup() -> (Setup, Vec<String>) {
    let s = Setup::with_key(Behavior::Running, "ec.pkcs8.pem", "ec.sec1.pem");
    let a = s.args(&[]);
    (s, a)
}

#[test]
fn check_says_ok_with_perfdata_on_one_line() {
    let (_s, a) = check_setup();
    let ok = run("check", &a);
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    let line = stdout(&ok);
    assert!(
        line.starts_with("PMCHECK OK - Puppet Server is running, 1 of 1 JRubies free | time="),
        "{line}"
    );
    // The pool as perfdata, gauges bounded by the pool's size.
    assert_contains!(
        line,
        "s;;;0 jrubies_free=1;;;0;1 jrubies_borrowed=0;;;0;1 jrubies_waiting=0;;;0 "
    );
    // Then the days left of the certificates (the test CA's last 2,000 years: no warning).
    assert_contains!(line, " weight=100%;;;0;100 hostcert_days=");
    assert_contains!(line, ";30:;7: localcacert_days=");
    assert_eq!(line.lines().count(), 1);
    // A plugin says its line and nothing else when all is well (no INFO about the identity).
    let quiet = pmcheck()
        .env_remove("RUST_LOG")
        .arg("check")
        .args(&a)
        .output()
        .unwrap();
    assert_eq!(quiet.status.code(), Some(0), "{quiet:?}");
    assert_eq!(
        stderr(&quiet),
        "",
        "a healthy check writes nothing to stderr"
    );
}

#[test]
fn check_says_warning_when_drained() {
    let (s, a) = check_setup();
    assert!(s.pmcheck("drain", &["--reason", "maint"]).status.success());
    let warn = run("check", &a);
    assert_eq!(warn.status.code(), Some(1), "{warn:?}");
    assert!(
        stdout(&warn).starts_with(&format!("PMCHECK WARNING - maint (by {} ", whoami())),
        "{warn:?}"
    );
}

#[test]
fn check_says_critical_when_puppet_server_is_unhealthy_even_when_drained() {
    let (s, a) = check_setup();
    assert!(s.pmcheck("drain", &["--reason", "maint"]).status.success());
    s.stub.set(Behavior::Reply(503, "error", "text/plain"));
    let crit = run("check", &a);
    assert_eq!(
        crit.status.code(),
        Some(2),
        "unhealthy beats drained: {crit:?}"
    );
    assert!(stdout(&crit).starts_with("PMCHECK CRITICAL - "), "{crit:?}");
    assert_contains!(stdout(&crit), "reports `error`", "{crit:?}");
}

#[test]
fn check_says_unknown_for_usage_and_settings_errors() {
    let (s, _) = check_setup();
    let bad = pmcheck()
        .args(["check", "--timeout", "soon"])
        .output()
        .unwrap();
    assert_eq!(
        bad.status.code(),
        Some(3),
        "a usage error is UNKNOWN for check: {bad:?}"
    );
    let missing = s.state.path().join("nope.conf");
    let bad = pmcheck()
        .args(["check", "--puppet-conf", &missing.display().to_string()])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(3), "{bad:?}");
    assert!(
        stdout(&bad).starts_with("PMCHECK UNKNOWN - --puppet-conf"),
        "{bad:?}"
    );
}

#[test]
fn check_says_unknown_without_its_key() {
    let (s, a) = check_setup();
    assert!(s.pmcheck("drain", &["--reason", "maint"]).status.success());
    std::fs::remove_file(&s.files.hostprivkey).unwrap();
    let unknown = run("check", &a);
    assert_eq!(
        unknown.status.code(),
        Some(3),
        "no key, no verdict on Puppet: {unknown:?}"
    );
    assert!(
        stdout(&unknown).starts_with("PMCHECK UNKNOWN - maint"),
        "{unknown:?}"
    );
    assert_contains!(
        stdout(&unknown),
        "Puppet Server's health is unknown: cannot read hostprivkey",
        "{unknown:?}"
    );
}

#[test]
fn check_says_unknown_when_the_drain_state_is_unreadable() {
    let (s, a) = check_setup();
    std::fs::create_dir(s.state.path().join("drain")).unwrap();
    let unknown = run("check", &a);
    assert_eq!(
        unknown.status.code(),
        Some(3),
        "unreadable drain state: {unknown:?}"
    );
}

/// Run as root (or a monitoring agent's user), `check` may read what the daemon cannot, a key
/// of mode 0600: where the daemon at `--url` answers otherwise, the line says what HAProxy is
/// told, and a daemon that keeps the node out makes the check CRITICAL.
#[test]
fn check_says_where_the_daemon_answers_otherwise() {
    let (_s, a) = check_setup();
    let mut broken = a.clone();
    let at = broken.iter().position(|x| x == "--hostprivkey").unwrap();
    broken[at + 1] = "/nonexistent/private_keys/host.pem".into();
    let d = Daemon::start(&broken);
    d.wait_for(SOON, "UNKNOWN", is("UNKNOWN"));
    let check_against = |url: &str| {
        pmcheck()
            .arg("check")
            .args(&a)
            .args(["--url", url])
            .output()
            .unwrap()
    };
    let url = format!("http://{}/", d.addr);
    let out = check_against(&url);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let line = stdout(&out);
    assert!(
        line.starts_with("PMCHECK CRITICAL - Puppet Server is running"),
        "{line}"
    );
    assert_contains!(
        line,
        &format!(
            "; but the daemon at {url}, which HAProxy follows, answers UNKNOWN - cannot probe Puppet Server: cannot read hostprivkey /nonexistent/private_keys/host.pem"
        ),
        "{line}"
    );
    // A daemon that agrees adds nothing.
    let agreeing = Daemon::start(&a);
    agreeing.wait_for(SOON, "OK", is("OK"));
    let out = check_against(&format!("http://{}/", agreeing.addr));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(!stdout(&out).contains("the daemon at"), "{out:?}");
}
