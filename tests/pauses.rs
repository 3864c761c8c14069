//! Moments that hit every compile master at once (a code deploy's pool lock, a pool flush, a
//! multithreaded JRuby's replacement): a pool that was ready since Puppet Server started is
//! *paused*, answered OK at the floor weight for at most `--pause-grace`, never NOTREADY at
//! once; a pool that was never ready since the last refused connection stays NOTREADY.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use pmcheck::puppet::pool::Load;

const FAST: &[&str] = &["--interval", "100ms", "--timeout", "1s"];
const SOON: Duration = Duration::from_secs(10);
const EMPTY: fn() -> Behavior = || Behavior::Pool(pool(2, 0, 0, 0, ":not-in-use"));
const LOCKED: fn() -> Behavior = || Behavior::Pool(pool(2, 2, 0, 0, ":acquired"));

fn daemon(s: &Setup, extra: &[&str]) -> Daemon {
    let mut all = FAST.to_vec();
    all.extend_from_slice(extra);
    Daemon::start(&s.args(&all))
}

fn starts(text: &'static str) -> impl Fn(&Reply) -> bool {
    move |a| a.body.starts_with(text)
}

#[test]
fn a_flush_after_the_pool_was_ready_is_a_pause_at_the_floor_weight() {
    let s = Setup::new(Behavior::Running);
    s.stub
        .seen
        .jvm_start
        .store(1_795_343_659_248, Ordering::SeqCst);
    let d = daemon(&s, &["--agent-listen", "127.0.0.1:0"]);
    d.wait_for(SOON, "OK", starts("OK - Puppet Server is running"));
    assert_eq!(series(&d.scrape(), "pmcheck_paused"), Some("0"));
    s.stub.set(EMPTY());
    let a = d.wait_for(
        SOON,
        "paused",
        starts("OK - paused: JRuby pool refilling after a flush since "),
    );
    assert_eq!(a.status, 200, "{a:?}");
    let json = d.status();
    assert_eq!(json.answer.load, Some(Load::Paused), "{json:?}");
    assert_eq!(
        json.answer.weight, 10,
        "every paused master at the floor: load stays spread"
    );
    let line = agent_line(d.agent_addr(), None).0;
    assert!(line.starts_with("up ready 10% #OK - paused: "), "{line}");
    assert_eq!(series(&d.scrape(), "pmcheck_paused"), Some("1"));
    assert!(series(&d.scrape(), "pmcheck_pause_started_timestamp_seconds").is_some());
    // Refilled: OK with the pool's own words, and no pause left.
    s.stub.set(Behavior::Running);
    d.wait_for(
        SOON,
        "OK again",
        starts("OK - Puppet Server is running, 1 of 1"),
    );
    assert_eq!(series(&d.scrape(), "pmcheck_paused"), Some("0"));
    assert!(series(&d.scrape(), "pmcheck_pause_started_timestamp_seconds").is_none());
}

#[test]
fn a_lock_shorter_than_the_grace_is_ok_and_a_longer_one_is_not_ready() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s, &["--pause-grace", "2s"]);
    d.wait_for(SOON, "OK", starts("OK - Puppet Server is running"));
    // Shorter: paused, then OK.
    s.stub.set(LOCKED());
    d.wait_for(
        SOON,
        "paused",
        starts("OK - paused: JRuby pool locked since "),
    );
    s.stub.set(Behavior::Running);
    d.wait_for(SOON, "OK", starts("OK - Puppet Server is running"));
    // Longer: paused for the grace, then NOTREADY naming the grace.
    s.stub.set(Behavior::Pool(pool(2, 2, 0, 0, ":ACQUIRED")));
    let t0 = Instant::now();
    d.wait_for(
        SOON,
        "paused",
        starts("OK - paused: JRuby pool locked since "),
    );
    let a = d.wait_for(
        SOON,
        "NOTREADY after the grace",
        starts("NOTREADY - paused: JRuby pool locked since "),
    );
    assert!(t0.elapsed() >= Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(a.status, 503);
    assert_contains!(a.body, ": longer than --pause-grace 2s", "{a:?}");
}

#[test]
fn a_lock_or_an_empty_pool_during_start_up_is_not_a_pause() {
    let s = Setup::new(LOCKED());
    let d = daemon(&s, &[]);
    let a = d.wait_for(
        SOON,
        "NOTREADY",
        starts("NOTREADY - Puppet Server's JRuby pool is locked"),
    );
    assert_eq!(a.status, 503);
    s.stub.set(EMPTY());
    d.wait_for(
        SOON,
        "NOTREADY",
        starts("NOTREADY - Puppet Server has none of its 2 JRubies yet"),
    );
    d.wait_probes(3, SOON);
    assert!(
        d.poll().body.starts_with("NOTREADY"),
        "never ready: never paused"
    );
}

#[test]
fn after_a_refused_connection_the_pool_must_be_ready_again_before_a_pause() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s, &[]);
    d.wait_for(SOON, "OK", starts("OK - Puppet Server is running"));
    let addr = s.stub.addr;
    drop(s.stub);
    d.wait_for(SOON, "refused", starts("DOWN - connection to"));
    // A reload or a restart: the port opens on an empty pool; that is starting, not paused.
    let back = Stub::start_on(addr, &s.ca, &s.ca, &[CERTNAME], EMPTY());
    d.wait_for(
        SOON,
        "NOTREADY",
        starts("NOTREADY - Puppet Server has none of its 2 JRubies yet"),
    );
    back.set(Behavior::Running);
    d.wait_for(SOON, "OK", starts("OK - Puppet Server is running"));
    back.set(EMPTY());
    d.wait_for(SOON, "paused", starts("OK - paused: "));
}

#[test]
fn another_jvm_than_the_one_that_was_ready_is_not_a_pause() {
    let s = Setup::new(Behavior::Running);
    s.stub.seen.jvm_start.store(1000, Ordering::SeqCst);
    let d = daemon(&s, &[]);
    d.wait_for(SOON, "OK", starts("OK - Puppet Server is running"));
    // A restart between two probes (no refused connection seen): the start time tells.
    s.stub.seen.jvm_start.store(2000, Ordering::SeqCst);
    s.stub.set(EMPTY());
    d.wait_for(
        SOON,
        "NOTREADY",
        starts("NOTREADY - Puppet Server has none"),
    );
    d.wait_probes(3, SOON);
    assert!(d.poll().body.starts_with("NOTREADY"));
}

#[test]
fn no_grace_answers_a_flush_not_ready_at_once() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s, &["--pause-grace", "0s"]);
    d.wait_for(SOON, "OK", starts("OK - Puppet Server is running"));
    s.stub.set(EMPTY());
    let a = d.wait_for(SOON, "NOTREADY", |a| {
        !a.body.starts_with("OK - Puppet Server is running")
    });
    assert!(
        a.body.starts_with("NOTREADY - Puppet Server has none"),
        "{a:?}"
    );
}

#[test]
fn a_multithreaded_jruby_speaks_of_borrow_slots_and_its_replacement_is_a_pause() {
    let confd = tempfile::tempdir().unwrap();
    std::fs::write(
        confd.path().join("puppetserver.conf"),
        "jruby-puppet: {\n    multithreaded: true\n    max-active-instances: 3\n}\n",
    )
    .unwrap();
    let captured = std::fs::read_to_string(fixture(
        "puppetserver-7.9.5-multithreaded-services-debug.json",
    ))
    .unwrap();
    let all: serde_json::Value = serde_json::from_str(&captured).unwrap();
    let service = all["jruby-metrics"].to_string();
    let s = Setup::new(Behavior::Pool(service.clone()));
    let dir = confd.path().display().to_string();
    let d = daemon(&s, &["--puppetserver-confd", &dir]);
    d.wait_for(
        SOON,
        "borrow slots",
        starts("OK - Puppet Server is running, 3 of 3 borrow slots free (one multithreaded JRuby)"),
    );
    assert_eq!(d.status().answer.weight, 100);
    // Two compiles: the weight follows the free slots.
    s.stub.set(Behavior::Pool(pool(3, 1, 2, 0, ":not-in-use")));
    d.wait_for_json(SOON, "a third of the slots", |a| a.answer.weight == 33);
    // Replaced at max-requests-per-instance, with no lock event: a pause.
    s.stub.set(Behavior::Pool(pool(3, 0, 0, 0, ":not-in-use")));
    d.wait_for(
        SOON,
        "paused",
        starts("OK - paused: the multithreaded JRuby being replaced since "),
    );
    let config = s.pmcheck("config", &["--puppetserver-confd", &dir]);
    let table = String::from_utf8_lossy(&config.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("multithreaded "))
        .unwrap_or_default();
    assert!(
        row.contains(" true ") && row.contains("jruby-puppet.multithreaded in "),
        "{table}"
    );
}

#[test]
fn numbers_that_cannot_be_true_make_the_pool_unreadable() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s, &[]);
    d.wait_for(SOON, "OK", starts("OK"));
    let cases = [
        (pool(1, 100, 0, 0, ":not-in-use"), "100 of 1 JRubies free"),
        (
            pool(4, 4, 0, 0, ":not-in-use").replace(
                "\"average-wait-time\":0",
                "\"average-wait-time\":18446744073709551615",
            ),
            "an average wait of 18446744073709551615 ms (more than a day)",
        ),
        (
            pool(4, 4, 0, 0, ":not-in-use")
                .replace("\"average-wait-time\":0", "\"average-wait-time\":-5"),
            "a time of -5 ms cannot be true",
        ),
        (
            pool(4, 4, 0, 0, ":not-in-use")
                .replace("\"num-free-jrubies\":4", "\"num-free-jrubies\":-1"),
            "invalid value: integer `-1`",
        ),
    ];
    for (answer, words) in cases {
        assert_contains!(answer, "jrubies");
        s.stub.set(Behavior::Pool(answer));
        let a = d.wait_for(SOON, words, |a| a.body.contains(words));
        assert_eq!(a.status, 503, "{a:?}");
        assert!(
            a.body
                .starts_with("DOWN - Puppet Server's status answer (HTTP 200)"),
            "{a:?}"
        );
        s.stub.set(Behavior::Running);
        d.wait_for(SOON, "OK", starts("OK"));
    }
}

/// One transient `service-not-found` must not blind the probe to the pool for good: it tries
/// the pool service again every 30 probes, and at SIGHUP.
#[test]
fn the_fallback_to_the_simple_status_is_retried() {
    let s = Setup::new(Behavior::Simple);
    let d = daemon(&s, &[]);
    d.wait_for(SOON, "OK without pool numbers", |a| {
        a.body == "OK - Puppet Server is running\n"
    });
    s.stub.set(Behavior::Running);
    d.wait_for(SOON, "the pool again after some probes", |a| {
        a.body == "OK - Puppet Server is running, 1 of 1 JRubies free\n"
    });
    // And at SIGHUP, whatever the interval.
    let s = Setup::new(Behavior::Simple);
    let d = Daemon::start(&s.args(&["--interval", "1h", "--timeout", "1s"]));
    d.wait_for(SOON, "OK without pool numbers", |a| {
        a.body == "OK - Puppet Server is running\n"
    });
    s.stub.set(Behavior::Running);
    let status = std::process::Command::new("kill")
        .args(["-HUP", &d.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    d.wait_for(SOON, "the pool after SIGHUP", |a| {
        a.body == "OK - Puppet Server is running, 1 of 1 JRubies free\n"
    });
}

/// Puppet Enterprise's file sync locks the pool (`pe-jruby-metrics`) at each code deploy, on
/// every compiler at once: a pause. (Answers made by hand from the open-source ones: PE could
/// not be run here.)
#[test]
fn a_puppet_enterprise_code_deploy_lock_is_a_pause() {
    let s = Setup::new(Behavior::EnterprisePool(pool(4, 4, 0, 0, ":not-in-use")));
    let d = daemon(&s, &[]);
    d.wait_for(
        SOON,
        "OK",
        starts("OK - Puppet Server is running, 4 of 4 JRubies free"),
    );
    d.wait_for_log(
        SOON,
        "using the next from now on path=/status/v1/services/jruby-metrics next=/status/v1/services/pe-jruby-metrics",
    );
    s.stub
        .set(Behavior::EnterprisePool(pool(4, 4, 0, 0, ":acquired")));
    let a = d.wait_for(
        SOON,
        "paused",
        starts("OK - paused: JRuby pool locked since "),
    );
    assert_eq!(a.status, 200);
    assert_eq!(d.status().answer.weight, 10);
    s.stub
        .set(Behavior::EnterprisePool(pool(4, 4, 0, 0, ":not-in-use")));
    d.wait_for(
        SOON,
        "OK again",
        starts("OK - Puppet Server is running, 4 of 4"),
    );
}

/// A refill can keep Puppet Server's status API from answering for seconds (measured on the
/// real 7.9.5 on 2 cores): no answer within the deadline during a pause keeps the pause, for
/// the same grace; without a pause, it is DOWN as always.
#[test]
fn no_answer_during_a_pause_keeps_the_pause_within_the_grace() {
    let s = Setup::new(Behavior::Running);
    let d = Daemon::start(&s.args(&[
        "--interval",
        "100ms",
        "--timeout",
        "300ms",
        "--pause-grace",
        "3s",
    ]));
    d.wait_for(SOON, "OK", starts("OK - Puppet Server is running"));
    s.stub.set(EMPTY());
    d.wait_for(
        SOON,
        "paused",
        starts("OK - paused: JRuby pool refilling after a flush"),
    );
    s.stub.set(Behavior::Hang);
    let a = d.wait_for(SOON, "still paused, slow", |a| {
        a.body
            .contains("; Puppet Server's status API is slow to answer meanwhile")
    });
    assert_eq!(a.status, 200, "{a:?}");
    let a = d.wait_for(
        SOON,
        "NOTREADY past the grace",
        starts("NOTREADY - paused: "),
    );
    assert_contains!(a.body, "longer than --pause-grace 3s", "{a:?}");
}

/// A lock says when it was taken: one held since long before pmcheck looked is no moment.
#[test]
fn a_lock_taken_long_ago_is_not_ready_at_once() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s, &[]);
    d.wait_for(SOON, "OK", starts("OK - Puppet Server is running"));
    let long_ago =
        humantime::format_rfc3339_millis(std::time::SystemTime::now() - Duration::from_secs(600))
            .to_string();
    s.stub.set(Behavior::Pool(pool_changed(
        2,
        2,
        0,
        0,
        ":acquired",
        &long_ago,
    )));
    let a = d.wait_for(SOON, "NOTREADY", |a| {
        !a.body.starts_with("OK - Puppet Server")
    });
    assert!(
        a.body
            .starts_with("NOTREADY - paused: JRuby pool locked since "),
        "{a:?}"
    );
    assert_contains!(a.body, "(10m): longer than --pause-grace 1m", "{a:?}");
}

/// The stub's JVM started an hour ago: a pool it reports was ready before any lock now.
fn up_for_an_hour(s: &Setup) {
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    let ms = hour_ago.duration_since(std::time::UNIX_EPOCH).unwrap();
    s.stub
        .seen
        .jvm_start
        .store(ms.as_millis() as u64, Ordering::SeqCst);
}

/// `inetd` and `check` answer from one probe with no history: a pause is granted only from
/// the start Puppet Server gives (a lock's `last-change-time`), never "since now", which
/// would be new at every poll. The audit of e5ddf73: an empty pool in a JVM up for an hour
/// answered `200 OK - paused ... (0s)` to every inetd poll for 68 s, and `check` WARNING.
#[test]
fn one_shot_modes_grant_no_pause_whose_start_they_cannot_prove() {
    let s = Setup::new(EMPTY());
    up_for_an_hour(&s);
    let inetd = || inetd(&s, b"OPTIONS / HTTP/1.0\r\n\r\n", true);
    let check = || {
        let out = pmcheck().arg("check").args(s.args(&[])).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let ago = |secs: u64| {
        humantime::format_rfc3339_millis(std::time::SystemTime::now() - Duration::from_secs(secs))
            .to_string()
    };

    // A refill, and a lock whose time cannot be read: nothing says when they began. A time
    // before 1970 or after 9999 is a misreading too (the audit: one panicked `check`, exit 101).
    let locked_at = |since| Behavior::Pool(pool_changed(2, 2, 0, 0, ":acquired", since));
    for (what, behavior) in [
        ("an empty pool", EMPTY()),
        ("a lock without a time", locked_at("not a time")),
        ("a lock before 1970", locked_at("1970-01-01T00:30:00+01:00")),
        ("a lock after 9999", locked_at("9999-12-31T23:30:00-01:00")),
    ] {
        s.stub.set(behavior);
        for _ in 0..2 {
            let a = inetd();
            assert_eq!(a.status, 503, "{what}: {a:?}");
            assert!(a.body.starts_with("NOTREADY - "), "{what}: {a:?}");
            assert!(!a.body.contains("paused"), "{what}: {a:?}");
        }
        let (code, text) = check();
        assert_eq!(code, Some(2), "{what}: {text}");
        assert!(text.starts_with("PMCHECK CRITICAL"), "{what}: {text}");
    }

    // A lock taken 5 s ago is a pause of 5 s, within the grace; one taken 10 min ago is not.
    s.stub.set(Behavior::Pool(pool_changed(
        2,
        2,
        0,
        0,
        ":acquired",
        &ago(5),
    )));
    let a = inetd();
    assert_eq!(a.status, 200, "{a:?}");
    assert!(
        a.body.starts_with("OK - paused: JRuby pool locked since "),
        "{a:?}"
    );
    let (code, text) = check();
    assert_eq!(code, Some(1), "{text}");
    assert_contains!(text, "paused");
    s.stub.set(Behavior::Pool(pool_changed(
        2,
        2,
        0,
        0,
        ":acquired",
        &ago(600),
    )));
    let a = inetd();
    assert_eq!(a.status, 503, "{a:?}");
    assert_contains!(a.body, "(10m): longer than --pause-grace 1m", "{a:?}");
}

/// OpenVox since 8.13 writes a lock's `last-change-time` in the JVM's zone, with its offset
/// and up to nine fractional digits. Read as UTC, a lock taken 5 s ago in Paris would be an
/// hour in the future and no one-shot mode could grant the pause: a fleet-wide deploy lock
/// would take every inetd-mode master out at once.
#[test]
fn one_shot_modes_read_a_lock_time_in_the_jvms_zone() {
    let s = Setup::new(EMPTY());
    up_for_an_hour(&s);
    let five_ago = std::time::SystemTime::now() - Duration::from_secs(5);
    // The same moment as a JVM in Paris (UTC+01:00 in November) and in New York writes it.
    let zoned = |east_secs: i64, offset: &str| {
        let local = if east_secs >= 0 {
            five_ago + Duration::from_secs(east_secs.unsigned_abs())
        } else {
            five_ago - Duration::from_secs(east_secs.unsigned_abs())
        };
        let text = humantime::format_rfc3339_nanos(local).to_string();
        format!("{}{offset}", text.trim_end_matches('Z'))
    };
    for since in [zoned(3600, "+01:00"), zoned(-5 * 3600, "-05:00")] {
        s.stub.set(Behavior::Pool(pool_changed(
            2,
            2,
            0,
            0,
            ":acquired",
            &since,
        )));
        let a = inetd(&s, b"OPTIONS / HTTP/1.0\r\n\r\n", true);
        assert_eq!(a.status, 200, "{since}: {a:?}");
        assert!(
            a.body.starts_with("OK - paused: JRuby pool locked since "),
            "{since}: {a:?}"
        );
        let out = pmcheck().arg("check").args(s.args(&[])).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{since}: {text}");
        assert_contains!(text, "paused");
    }
}

/// A Puppet Server that reported its pool since it started and then answers
/// `service-not-found` for it is not `running` without numbers: on e5ddf73 one such answer
/// fell back to the simple status and answered 200 for 30 probes, an empty pool too, and a
/// fresh grace began when the pool came back. Now it is NOTREADY, or a pause under way goes
/// on within the same grace.
#[test]
fn a_pool_service_that_goes_away_is_not_ready_and_spends_the_grace() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s, &["--pause-grace", "2s"]);
    d.wait_for(
        SOON,
        "the pool",
        starts("OK - Puppet Server is running, 1 of 1"),
    );
    s.stub.set(Behavior::Simple);
    let a = d.wait_for(SOON, "not running without numbers", |a| {
        !a.body.starts_with("OK - Puppet Server is running, 1 of 1")
    });
    assert_eq!(a.status, 503, "{a:?}");
    assert!(
        a.body.starts_with(
            "NOTREADY - Puppet Server no longer reports its JRuby pool (/status/v1/services/jruby-metrics: service not found)"
        ),
        "{a:?}"
    );
    d.wait_probes(3, SOON);
    assert_eq!(d.poll().status, 503, "no fallback to a 200 without numbers");

    // A flush under way, then the pool service gone: the same pause, the same grace.
    s.stub.set(Behavior::Running);
    d.wait_for(
        SOON,
        "the pool again",
        starts("OK - Puppet Server is running, 1 of 1"),
    );
    s.stub.set(EMPTY());
    d.wait_for(SOON, "paused", starts("OK - paused: JRuby pool refilling"));
    s.stub.set(Behavior::Simple);
    let a = d.wait_for(SOON, "past the grace", starts("NOTREADY"));
    assert!(
        a.body.contains("refilling after a flush since ")
            && a.body.contains(": longer than --pause-grace 2s"),
        "{a:?}"
    );
}
