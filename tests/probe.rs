//! What the probe makes of Puppet Server: every way it fails, a pool that cannot compile, the
//! status paths of older servers and Puppet Enterprise.

mod common;

use std::time::Duration;

use common::*;

const SOON: Duration = Duration::from_secs(10);

#[test]
fn every_way_puppet_server_fails_is_down_with_its_cause() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    let cases = [
        (
            Behavior::Reply(503, "error", "text/plain"),
            "DOWN - Puppet Server reports `error`, not `running`",
        ),
        (
            Behavior::Reply(
                500,
                "Internal Server Error: java.lang.OutOfMemoryError\n at x",
                "text/plain",
            ),
            "DOWN - Puppet Server answered HTTP 500: Internal Server Error: java.lang.OutOfMemoryError at x",
        ),
        (
            Behavior::Reply(200, r#"{"kind":"surprise"}"#, "application/json"),
            "DOWN - Puppet Server's status answer (HTTP 200) is not a service status: missing field `state`",
        ),
    ];
    for (behavior, expected) in cases {
        s.stub.set(behavior.clone());
        let a = d.wait_for(SOON, expected, |a| a.body.starts_with(expected));
        assert_eq!(a.status, 503, "{behavior:?}");
        s.stub.set(Behavior::Running);
        d.wait_for(SOON, "OK again", is("OK"));
    }
}

/// Up but unable to compile: 503 NOTREADY, so the node stays out until it can. (With no
/// pause grace: a lock or a refill after the pool was ready is a pause, tests/pauses.rs.)
#[test]
fn a_puppet_server_that_cannot_compile_yet_is_not_ready() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&["--pause-grace", "0s"]);
    d.wait_for(SOON, "OK", is("OK"));
    let cases = [
        (
            Behavior::Reply(200, "starting", "text/plain"),
            "NOTREADY - Puppet Server reports `starting`, not `running`",
        ),
        (
            Behavior::Reply(
                503,
                r#"{"state":"stopping","status":{},"service_name":"jruby-metrics"}"#,
                "application/json",
            ),
            "NOTREADY - Puppet Server reports `stopping`, not `running`",
        ),
        (
            Behavior::Reply(404, "<html><body>HTTP ERROR 404</body></html>", "text/html"),
            "NOTREADY - Puppet Server answered 404: it is still starting",
        ),
        (
            Behavior::Pool(pool_changed(
                2,
                2,
                0,
                0,
                ":acquired",
                "2026-11-22T10:34:55.412Z",
            )),
            "NOTREADY - Puppet Server's JRuby pool is locked since 2026-11-22T10:34:55.412Z",
        ),
        (
            Behavior::Pool(pool(2, 0, 0, 0, ":not-in-use")),
            "NOTREADY - Puppet Server has none of its 2 JRubies yet",
        ),
    ];
    for (behavior, expected) in cases {
        s.stub.set(behavior.clone());
        let a = d.wait_for(SOON, expected, |a| a.body.starts_with(expected));
        assert_eq!(a.status, 503, "{behavior:?}");
        assert_eq!(a.status_line.split(' ').nth(2), Some("Not"), "{a:?}");
        s.stub.set(Behavior::Running);
        d.wait_for(SOON, "OK again", is("OK"));
    }
}

/// A busy node stays in the pool (200) and says so with its numbers; the weight says how much.
#[test]
fn pool_states_give_their_words_and_weights() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    let cases = [
        (
            pool(4, 4, 0, 0, ":not-in-use"),
            "OK - Puppet Server is running, 4 of 4 JRubies free",
            100,
            "warm",
        ),
        (
            pool(4, 1, 0, 0, ":not-in-use"),
            "OK - warming: 1 of 4 JRubies ready",
            25,
            "warming",
        ),
        (
            pool(4, 3, 1, 0, ":not-in-use"),
            "OK - Puppet Server is running, 3 of 4 JRubies free",
            75,
            "warm",
        ),
        (
            pool(4, 0, 4, 3, ":not-in-use"),
            "OK - busy: 0 of 4 JRubies free, 3 requests waiting, average wait 850 ms",
            10,
            "busy",
        ),
        (
            pool(4, 4, 0, 0, ":requested"),
            "OK - busy: 4 of 4 JRubies free, average wait 0 ms, a pool flush is waiting for running compiles",
            100,
            "busy",
        ),
    ];
    for (answer, text, weight, load) in cases {
        s.stub.set(Behavior::Pool(answer));
        let a = d.wait_for(SOON, text, |a| a.body.starts_with(text));
        assert_eq!(a.status, 200, "busy is still 200: {a:?}");
        let json = d.wait_for_json(SOON, text, |j| j.answer.reason.starts_with(&text[5..]));
        assert_eq!(json.answer.weight, weight, "{text}");
        assert_eq!(
            serde_json::to_value(json.answer.load).unwrap(),
            serde_json::Value::from(load),
            "{text}"
        );
    }
}

/// Requests refused at `max-queued-requests` make the node busy while they keep coming, not
/// for ever: the count is cumulative, the probe looks at what changed since the last one.
#[test]
fn new_queue_limit_refusals_make_a_node_busy_until_they_stop() {
    let with_hits = |n: u32| {
        pool(4, 4, 0, 0, ":not-in-use").replace(
            "\"queue-limit-hit-count\":0",
            &format!("\"queue-limit-hit-count\":{n}"),
        )
    };
    let s = Setup::new(Behavior::Pool(with_hits(0)));
    let d = s.daemon(&[]);
    d.wait_for(SOON, "warm", |a| {
        a.body.starts_with("OK - Puppet Server is running")
    });
    s.stub.set(Behavior::Pool(with_hits(5)));
    let busy = "OK - busy: 4 of 4 JRubies free, average wait 0 ms, 5 requests refused at the queue limit since start";
    let a = d.wait_for(SOON, busy, |a| a.body.starts_with(busy));
    assert_eq!(a.status, 200);
    d.wait_for(SOON, "warm again once no new refusal comes", |a| {
        a.body
            .starts_with("OK - Puppet Server is running, 4 of 4 JRubies free")
    });
}

/// Busy is never out, but a pool with none free whose borrows only time out or are refused,
/// none succeeding, for longer than `--wedged-after` is: NOTREADY with the counts, until a
/// borrow succeeds. On e5ddf73 such a pool answered `200 OK - busy` for as long as it lasted.
#[test]
fn a_pool_that_only_fails_its_borrows_is_out_until_a_borrow_succeeds() {
    let counted = |borrows: u64, timeouts: u64, refusals: u64| {
        Behavior::Pool(
            pool(2, 0, 2, 5, ":not-in-use")
                .replace(
                    "\"queue-limit-hit-count\":0",
                    &format!("\"queue-limit-hit-count\":{refusals}"),
                )
                .replace(
                    "\"borrow-timeout-count\":0",
                    &format!("\"borrow-timeout-count\":{timeouts},\"borrow-count\":{borrows}"),
                ),
        )
    };
    let s = Setup::new(counted(10, 0, 0));
    let d = s.daemon(&["--wedged-after", "1s"]);
    d.wait_for(SOON, "busy", |a| a.body.starts_with("OK - busy: 0 of 2"));
    s.stub.set(counted(10, 1, 0));
    let a = d.wait_for(SOON, "wedged", |a| a.status != 200);
    assert!(
        a.body.starts_with(
            "NOTREADY - Puppet Server's JRuby pool is wedged: none free and no borrow succeeded since "
        ) && a.body.contains(", 1 borrow timed out and 0 refused (")
            && a.body.contains("): longer than --wedged-after 1s"),
        "{a:?}"
    );
    // More refusals, still no success: still out.
    s.stub.set(counted(10, 1, 4));
    d.wait_for(SOON, "the refusals counted", |a| {
        a.body.contains("1 borrow timed out and 4 refused")
    });
    // One borrow succeeds: busy again, in.
    s.stub.set(counted(11, 1, 4));
    let a = d.wait_for(SOON, "busy again", |a| a.status == 200);
    assert!(a.body.starts_with("OK - busy: 0 of 2"), "{a:?}");
}

#[test]
fn puppet_enterprise_and_servers_without_the_pool_service_are_followed() {
    for (behavior, path) in [
        (Behavior::Enterprise, "/status/v1/services/pe-jruby-metrics"),
        (Behavior::Simple, "/status/v1/simple/server"),
    ] {
        let s = Setup::new(behavior);
        let d = s.daemon(&[]);
        let a = d.wait_for(SOON, "OK", is("OK"));
        d.wait_for(SOON, "a few more probes", |_| s.stub.requests() >= 6);
        let log = s.stub.seen.requests_log.lock().unwrap().clone();
        let first = log
            .iter()
            .filter(|(_, uri, _)| uri.starts_with("/status/v1/services/jruby-metrics"))
            .count();
        assert_eq!(first, 1, "the fallback is remembered: {log:?}");
        assert!(log.last().unwrap().1.starts_with(path), "{log:?}");
        if path.contains("pe-jruby") {
            assert_eq!(
                a.body,
                "OK - Puppet Server is running, 1 of 1 JRubies free\n"
            );
            assert_contains!(log.last().unwrap().1, "level=debug", "{log:?}");
        } else {
            assert_eq!(
                a.body, "OK - Puppet Server is running\n",
                "no pool numbers to show"
            );
        }
    }
}

/// A fallback is for the server that needed it: once Puppet Server has gone away (an
/// upgrade, say), the probe starts from the pool service again.
#[test]
fn a_fallback_does_not_outlive_the_server_that_needed_it() {
    let s = Setup::new(Behavior::Simple);
    let d = s.daemon(&[]);
    d.wait_for(SOON, "OK without pool numbers", |a| {
        a.body == "OK - Puppet Server is running\n"
    });
    let addr = s.stub.addr;
    drop(s.stub);
    d.wait_for(SOON, "refused", |a| a.body.contains("refused"));
    let _upgraded = Stub::start_on(addr, &s.ca, &s.ca, &[CERTNAME], Behavior::Running);
    d.wait_for(SOON, "the pool again", |a| {
        a.body == "OK - Puppet Server is running, 1 of 1 JRubies free\n"
    });
    d.wait_for_log(
        SOON,
        "trying the configured status path again once it is back path=/status/v1/services/jruby-metrics",
    );
}

#[test]
fn connection_refused_is_down_and_named() {
    let s = Setup::new(Behavior::Running);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let d = Daemon::start(&args(&s.files, addr, s.state.path(), FAST));
    let answer = d.wait_for(SOON, "DOWN", is("DOWN"));
    assert_eq!(answer.status, 503);
    assert_contains!(
        answer.body,
        &format!("connection to {addr} refused"),
        "{answer:?}"
    );
    d.wait_for_log(SOON, "verdict changed verdict=DOWN ");
    d.wait_probes(3, SOON);
    assert_eq!(
        d.logged("verdict changed verdict=DOWN "),
        1,
        "logged once per change, not per probe"
    );
}

#[test]
fn older_servers_fall_back_to_the_master_path_and_remember_it() {
    let s = Setup::new(Behavior::Legacy);
    let d = s.daemon(&[]);
    let a = d.wait_for(SOON, "OK", is("OK"));
    assert_eq!(a.status, 200);
    d.wait_for(SOON, "a few more probes", |_| s.stub.requests() >= 4);
    let log = s.stub.seen.requests_log.lock().unwrap().clone();
    let server_hits = log
        .iter()
        .filter(|(_, uri, _)| uri.starts_with("/status/v1/simple/server"))
        .count();
    assert_eq!(server_hits, 1, "the fallback is remembered: {log:?}");
}

/// Puppet Server 7.9.5 (Debian 12) and 8.7.0 (Debian 13, Java 21), each as captured: the same
/// six services and pool fields, read alike. The JVM's start time is read from each one's
/// status service (Java 21 renamed a garbage collector there, which pmcheck does not read):
/// an empty pool under another JVM is then a restart, not a pause of the JVM that was ready.
#[test]
fn puppet_server_7_and_8_as_captured_are_read_alike() {
    for file in [
        "puppetserver-7.9.5-status-services-debug.json",
        "puppetserver-8.7.0-services-debug.json",
    ] {
        let s = Setup::new(Behavior::Captured(file));
        let d = s.daemon(&[]);
        let a = d.wait_for(SOON, "OK", is("OK"));
        assert_eq!(a.status, 200, "{file}: {a:?}");
        assert!(
            a.body
                .starts_with("OK - Puppet Server is running, 1 of 1 JRubies free"),
            "{file}: {a:?}"
        );
        s.stub
            .seen
            .jvm_start
            .store(1, std::sync::atomic::Ordering::SeqCst);
        s.stub.set(Behavior::Pool(pool(1, 0, 0, 0, ":not-in-use")));
        let a = d.wait_for(SOON, "not OK", |a| !a.body.starts_with("OK"));
        assert!(
            a.body.starts_with("NOTREADY - Puppet Server has none"),
            "{file}: another JVM's empty pool is not a pause: {a:?}"
        );
    }
}
