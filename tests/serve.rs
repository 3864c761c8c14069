//! `pmcheck serve` against an in-process TLS stub of Puppet Server.

mod common;

use std::time::{Duration, Instant};

use common::*;
use pmcheck::health::answer::Answer;
use pmcheck::health::verdict::Verdict;

const FAST: &[&str] = &["--interval", "100ms", "--timeout", "1s"];
const SOON: Duration = Duration::from_secs(10);

impl Setup {
    fn daemon(&self, extra: &[&str]) -> Daemon {
        let mut all = FAST.to_vec();
        all.extend_from_slice(extra);
        Daemon::start(&self.args(&all))
    }
}

fn is(word: &'static str) -> impl Fn(&Reply) -> bool {
    move |a| a.body.starts_with(word)
}

#[test]
fn healthy_puppet_server_answers_200_ok_with_sni_and_host_equal_to_the_certname() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    let a = d.wait_for(SOON, "OK", is("OK"));
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(
        a.body,
        "OK - Puppet Server is running, 1 of 1 JRubies free\n"
    );
    let log = s.stub.seen.requests_log.lock().unwrap().clone();
    let (method, uri, host) = &log[0];
    assert_eq!(method, "GET", "never HEAD: Puppet's auth.conf denies it");
    assert_eq!(
        uri,
        "/status/v1/services/jruby-metrics?level=debug&timeout=1"
    );
    assert_eq!(
        host.as_deref(),
        Some(format!("{CERTNAME}:{}", s.stub.addr.port()).as_str())
    );
    assert_eq!(
        s.stub.seen.snis.lock().unwrap()[0].as_deref(),
        Some(CERTNAME)
    );
}

#[test]
fn haproxy_request_bytes_get_exact_answers() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    let checks = [
        // option httpchk (no arguments)
        "OPTIONS / HTTP/1.0\r\n\r\n",
        // option httpchk GET /health
        "GET /health HTTP/1.0\r\n\r\n",
        // http-check send meth GET uri /x ver HTTP/1.1 hdr Host foo
        "GET /x HTTP/1.1\r\nhost: foo\r\nconnection: close\r\n\r\n",
        // http-check send-state
        "GET / HTTP/1.1\r\nhost: foo\r\nx-haproxy-server-state: UP 1/3; address=127.0.0.1; port=8140; name=puppet/p1; node=lb1; weight=1/1; scur=0/0; qcur=0\r\nconnection: close\r\n\r\n",
        // a GET with Content-Length: 0, as some checkers send
        "GET / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    ];
    for raw in checks {
        let a = request(d.addr, raw);
        assert_eq!(a.status, 200, "{raw:?} -> {a:?}");
        let version = if raw.contains("HTTP/1.0") {
            "HTTP/1.0"
        } else {
            "HTTP/1.1"
        };
        assert_eq!(a.status_line, format!("{version} 200 OK"), "{raw:?}");
        assert_eq!(
            a.header("content-length"),
            Some(a.body.len().to_string().as_str()),
            "{raw:?}"
        );
        assert_eq!(a.header("cache-control"), Some("no-store"), "{raw:?}");
        assert_eq!(
            a.body,
            "OK - Puppet Server is running, 1 of 1 JRubies free\n"
        );
    }
}

#[test]
fn http_1_1_keeps_the_connection_open_unless_asked() {
    use std::io::{Read, Write};
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    let mut stream = std::net::TcpStream::connect(d.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    for _ in 0..2 {
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 512];
        let n = stream.read(&mut buf).unwrap();
        let a = parse_answer(&String::from_utf8_lossy(&buf[..n]));
        assert_eq!(a.status, 200, "{a:?}");
    }
}

#[test]
fn head_matches_get_without_body_and_other_methods_get_405() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    let get = d.wait_for(SOON, "OK", is("OK"));
    let head = request(
        d.addr,
        "HEAD / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(head.status, 200);
    assert_eq!(head.body, "", "HEAD has no body");
    assert_eq!(head.header("content-length"), get.header("content-length"));
    for method in ["POST", "PUT", "DELETE", "PATCH", "TRACE"] {
        let a = request(
            d.addr,
            &format!(
                "{method} / HTTP/1.1\r\nhost: a\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            ),
        );
        assert_eq!(a.status, 405, "{method}: {a:?}");
        assert_eq!(a.header("allow"), Some("GET, HEAD, OPTIONS"));
        assert_eq!(
            a.header("content-length"),
            Some(a.body.len().to_string().as_str())
        );
    }
    let options = request(d.addr, "OPTIONS / HTTP/1.0\r\n\r\n");
    assert_eq!(options.header("allow"), Some("GET, HEAD, OPTIONS"));
}

#[test]
fn json_answer_has_verdict_reason_drain_and_probe() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    let a = request(
        d.addr,
        "GET / HTTP/1.1\r\nhost: a\r\naccept: application/json\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(a.header("content-type"), Some("application/json"));
    let answer = Answer::from_json(&a.body).unwrap();
    assert_eq!(answer.verdict, Verdict::Ok);
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.reason,
        "Puppet Server is running, 1 of 1 JRubies free"
    );
    assert_eq!(answer.drain, None);
    assert!(answer.probe.ok);
    assert_eq!(
        answer.probe.detail,
        "Puppet Server is running, 1 of 1 JRubies free"
    );
    let pool = answer.pool.expect("the pool's numbers");
    assert_eq!((pool.size, pool.free, pool.waiting), (1, 1, 0));
    assert_eq!(answer.weight, 100);
    assert!(answer.probe.latency_ms.is_some());
    assert!(answer.probe.age_ms.unwrap() < 5_000);
    assert_eq!(
        answer.probe.endpoint.as_deref(),
        Some(
            format!(
                "https://{CERTNAME}:{}/status/v1/services/jruby-metrics",
                s.stub.addr.port()
            )
            .as_str()
        )
    );
}

/// `/status` is the operator's route: JSON whatever the `Accept`, with the pollers, and never a
/// poller itself. The old way (`Accept: application/json` on `/`) still answers, and says where
/// the route moved.
#[test]
fn the_operators_json_has_a_route_of_its_own() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    let haproxy = "GET / HTTP/1.0\r\nuser-agent: HAProxy\r\n\r\n";
    let plain = request(d.addr, haproxy);
    assert_eq!(
        plain.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(plain.header("deprecation"), None);
    let status = request(
        d.addr,
        "GET /status HTTP/1.1\r\nhost: a\r\nuser-agent: curl/8.14\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(status.status, 200, "{status:?}");
    assert_eq!(status.header("content-type"), Some("application/json"));
    assert_eq!(status.header("deprecation"), None);
    let answer = Answer::from_json(&status.body).unwrap();
    assert_eq!(answer.verdict, Verdict::Ok);
    let pollers = answer.pollers.expect("this host's view lists the pollers");
    let clients: Vec<_> = pollers.iter().map(|p| p.client.clone()).collect();
    assert_eq!(clients, [Some("HAProxy".to_owned())], "{pollers:?}");
    let old = request(
        d.addr,
        "GET / HTTP/1.1\r\nhost: a\r\naccept: application/json\r\nuser-agent: pmcheck/0.1.0\r\nconnection: close\r\n\r\n",
    );
    assert!(Answer::from_json(&old.body).unwrap().pollers.is_some());
    assert!(
        old.header("deprecation")
            .is_some_and(|v| v.starts_with('@')),
        "{old:?}"
    );
    assert_eq!(
        old.header("link"),
        Some("</status>; rel=\"successor-version\"")
    );
}

#[test]
fn drain_and_undrain_are_seen_by_the_running_daemon() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    let out = s.pmcheck("drain", &["--reason", "upgrading to 7.9.6"]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let by = format!("(by {} since ", whoami());
    assert_contains!(stdout, &format!("drained: upgrading to 7.9.6 {by}"));
    // The daemon looks at the record every quarter second.
    let a = d.wait_for(SOON, "DRAINED", |a| a.status == 503);
    // The answer keeps who and when short, so that HAProxy's ~100 characters keep the reason.
    assert!(
        a.body
            .starts_with(&format!("DRAINED - upgrading to 7.9.6 (by {} ", whoami())),
        "{a:?}"
    );
    assert!(!a.body.contains(" since "), "{a:?}");
    assert_contains!(a.body, "Puppet Server is running", "{a:?}");
    assert!(
        a.status_line.starts_with(&format!(
            "HTTP/1.1 503 Drained: upgrading to 7.9.6 (by {} ",
            whoami()
        )),
        "{a:?}"
    );
    // Draining again replaces the record.
    let out = s.pmcheck("drain", &["--reason", "second"]);
    assert_contains!(
        String::from_utf8_lossy(&out.stdout),
        "replaced the previous drain: upgrading"
    );
    d.wait_for(SOON, "the new record", is("DRAINED - second"));
    let out = s.pmcheck("undrain", &[]);
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("undrained: removed"),
        "{out:?}"
    );
    d.wait_for(SOON, "OK after undrain", |a| a.status == 200);
    let out = s.pmcheck("undrain", &[]);
    assert!(out.status.success(), "undrain is idempotent");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("not drained"),
        "{out:?}"
    );
    // A drain survives a restart of the daemon.
    s.pmcheck("drain", &["--reason", "kept"]);
    drop(d);
    let d = s.daemon(&[]);
    let a = d.wait_for(SOON, "a finished probe", |a| {
        !a.body.starts_with("STARTING")
    });
    assert!(a.body.starts_with("DRAINED - kept"), "{a:?}");
    d.wait_for_log(SOON, "verdict DRAINED");
    d.wait_probes(3, SOON);
    assert_eq!(
        d.logged("verdict "),
        1,
        "one line per change: {:?}",
        d.log.lock().unwrap()
    );
}

#[test]
fn drain_for_expires_by_itself_and_status_says_so() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    let out = s.pmcheck("drain", &["--reason", "short", "--for", "1s"]);
    assert_contains!(String::from_utf8_lossy(&out.stdout), " until ", "{out:?}");
    d.wait_for(SOON, "DRAINED", |a| a.status == 503);
    let a = d.wait_for(SOON, "the drain to expire", |a| a.status == 200);
    assert_contains!(a.body, "drain expired: short", "{a:?}");
    let out = pmcheck()
        .args(["status", "--url", &format!("http://{}/", d.addr)])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("OK (HTTP 200)"), "{text}");
    assert_contains!(text, "EXPIRED");
}

#[test]
fn a_garbled_drain_file_still_drains_and_a_missing_state_dir_fails_closed() {
    let s = Setup::new(Behavior::Running);
    let d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    std::fs::write(s.state.path().join("drain"), "").unwrap();
    let a = d.wait_for(SOON, "DRAINED", |a| a.status == 503);
    assert!(
        a.body
            .starts_with("DRAINED - drain file is not a valid drain record"),
        "{a:?}"
    );
    std::fs::remove_file(s.state.path().join("drain")).unwrap();
    std::fs::remove_dir(s.state.path()).unwrap();
    let a = d.wait_for(SOON, "UNKNOWN", is("UNKNOWN"));
    assert_eq!(a.status, 503);
    assert!(
        a.body
            .starts_with("UNKNOWN - cannot tell whether this node is drained"),
        "{a:?}"
    );
    assert!(
        a.body.contains(&s.state.path().display().to_string()),
        "{a:?}"
    );
    std::fs::create_dir(s.state.path()).unwrap();
    d.wait_for(SOON, "healed by itself", |a| a.status == 200);
}

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
        let json = d.wait_for_json(SOON, text, |j| j.reason.starts_with(&text[5..]));
        assert_eq!(json.weight, weight, "{text}");
        assert_eq!(
            serde_json::to_value(json.load).unwrap(),
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
    d.wait_for_log(SOON, "trying /status/v1/services/jruby-metrics again");
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
    d.wait_for_log(SOON, "verdict DOWN");
    d.wait_probes(3, SOON);
    assert_eq!(
        d.logged("verdict DOWN"),
        1,
        "logged once per change, not per probe"
    );
}

#[test]
fn a_server_certificate_from_another_ca_is_refused() {
    let s = Setup::new(Behavior::Running);
    let rogue = Ca::new("rogue");
    let impostor = Stub::start_trusting(&rogue, &s.ca, &[CERTNAME], Behavior::Running);
    let d = Daemon::start(&args(&s.files, impostor.addr, s.state.path(), FAST));
    let a = d.wait_for(SOON, "DOWN", is("DOWN"));
    assert_contains!(a.body, "certificate is not signed by the CA in", "{a:?}");
    assert_eq!(
        impostor.requests(),
        0,
        "no request may reach an unverified server"
    );
}

#[test]
fn a_localcacert_with_several_certificates_works() {
    let s = Setup::new(Behavior::Running);
    let other = Ca::new("another CA first in the file");
    common::replace(
        &s.files.localcacert,
        format!("{}{}", other.pem(), s.ca.pem()).as_bytes(),
    );
    let d = s.daemon(&[]);
    let a = d.wait_for(SOON, "a finished probe", |a| {
        !a.body.starts_with("STARTING")
    });
    assert_eq!(a.status, 200, "{a:?}");
}

#[test]
fn a_server_certificate_without_san_gets_a_precise_message() {
    let ca = Ca::new("old");
    let files = HostFiles::new(&ca, "rsa.pkcs8.pem", "rsa.pkcs1.pem");
    let stub = Stub::start(&ca, &[], Behavior::Running);
    let state = tempfile::tempdir().unwrap();
    let d = Daemon::start(&args(&files, stub.addr, state.path(), FAST));
    let a = d.wait_for(SOON, "DOWN", is("DOWN"));
    assert_contains!(a.body, "has no subjectAltName", "{a:?}");
}

/// A certificate for other names says them as names, and where pmcheck's certname came from.
#[test]
fn a_server_certificate_for_another_name_names_both_and_the_certnames_source() {
    let ca = Ca::new("names");
    let files = HostFiles::new(&ca, "rsa.pkcs8.pem", "rsa.pkcs1.pem");
    let stub = Stub::start(&ca, &["puppet", "puppet.example.com"], Behavior::Running);
    let state = tempfile::tempdir().unwrap();
    let d = Daemon::start(&args(&files, stub.addr, state.path(), FAST));
    let a = d.wait_for(SOON, "DOWN", is("DOWN"));
    assert_contains!(
        a.body,
        &format!(
            "certificate is for puppet, puppet.example.com but pmcheck expects {CERTNAME} \
             (the certname, from command line): set --certname"
        ),
        "{a:?}"
    );
    assert!(!a.body.contains("DnsName"), "{a:?}");
}

#[test]
fn a_client_certificate_puppet_server_does_not_trust_is_down() {
    let s = Setup::new(Behavior::Running);
    let other = Ca::new("other");
    s.files
        .install(&other, "rsa.pkcs8.pem", "rsa.pkcs1.pem", &s.ca);
    let d = s.daemon(&[]);
    // Under load TLS 1.3's late alert can lose the race with the request (hyper: "connection
    // was not ready"), still DOWN; the next probe reads the alert.
    let a = d.wait_for(SOON, "DOWN, the certificate rejected", |a| {
        assert!(!a.body.starts_with("OK"), "{a:?}");
        a.body.contains("rejected this host's certificate")
    });
    assert!(a.body.starts_with("DOWN - "), "{a:?}");
}

#[test]
fn every_client_key_format_puppet_writes_works() {
    let ca = Ca::new("keys");
    let stub = Stub::start(&ca, &[CERTNAME], Behavior::Running);
    let state = tempfile::tempdir().unwrap();
    for (pkcs8, key) in [
        ("rsa.pkcs8.pem", "rsa.pkcs1.pem"),
        ("ec.pkcs8.pem", "ec.sec1.pem"),
        ("rsa.pkcs8.pem", "rsa.pkcs8.pem"),
        ("ec.pkcs8.pem", "ec.pkcs8.pem"),
    ] {
        let files = HostFiles::new(&ca, pkcs8, key);
        let d = Daemon::start(&args(&files, stub.addr, state.path(), FAST));
        let a = d.wait_for(SOON, "a finished probe", |a| {
            !a.body.starts_with("STARTING")
        });
        assert_eq!(a.status, 200, "{key}: {a:?}");
    }
}

#[test]
fn encrypted_and_missing_keys_say_exactly_that() {
    let s = Setup::new(Behavior::Running);
    for (key, expected) in [
        ("rsa.encrypted-legacy.pem", "is encrypted"),
        ("rsa.encrypted-pkcs8.pem", "is encrypted"),
        ("ec.pkcs8.pem", "do not fit together"),
    ] {
        s.files.install(&s.ca, "rsa.pkcs8.pem", key, &s.ca);
        let d = s.daemon(&[]);
        let a = d.wait_for(
            SOON,
            "UNKNOWN",
            is("UNKNOWN - cannot probe Puppet Server: "),
        );
        assert!(a.body.contains(expected), "{key}: {a:?}");
        assert!(
            a.body.contains(&s.files.hostprivkey.display().to_string()),
            "{a:?}"
        );
    }
    std::fs::remove_file(&s.files.hostprivkey).unwrap();
    let d = s.daemon(&[]);
    let a = d.wait_for(SOON, "UNKNOWN", is("UNKNOWN"));
    assert_contains!(a.body, "cannot read hostprivkey", "{a:?}");
    assert_contains!(a.body, "No such file", "{a:?}");
}

#[test]
fn renewed_certificate_files_are_picked_up_without_a_restart() {
    let s = Setup::new(Behavior::Running);
    let other = Ca::new("before renewal");
    s.files
        .install(&other, "rsa.pkcs8.pem", "rsa.pkcs1.pem", &s.ca);
    let mut d = s.daemon(&[]);
    d.wait_for(SOON, "DOWN", is("DOWN"));
    // Renewal: a certificate from the right CA, and a different key type too.
    s.files.install(&s.ca, "ec.pkcs8.pem", "ec.sec1.pem", &s.ca);
    d.wait_for(SOON, "OK after the files changed", is("OK"));
    assert!(
        d.child().try_wait().unwrap().is_none(),
        "the same process, never restarted"
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

#[test]
fn starting_until_the_first_probe_finishes() {
    let s = Setup::new(Behavior::Hang);
    let d = Daemon::start(&s.args(&["--interval", "100ms", "--timeout", "3s"]));
    let a = d.poll();
    assert_eq!(a.status, 503, "never healthy before a real check");
    assert!(a.body.starts_with("STARTING - "), "{a:?}");
    let a = d.wait_for(SOON, "the probe to time out", is("DOWN"));
    assert_contains!(a.body, "no answer from Puppet Server", "{a:?}");
    assert_contains!(a.body, "within 3s", "{a:?}");
}

/// A Puppet Server that accepts and never answers must not slow the polls down: they are answered
/// from the latest probe result, not by waiting on Puppet Server.
#[test]
fn polls_stay_fast_while_puppet_server_hangs() {
    let s = Setup::new(Behavior::Running);
    let d = Daemon::start(&s.args(&["--interval", "100ms", "--timeout", "5s"]));
    d.wait_for(SOON, "OK", is("OK"));
    s.stub.set(Behavior::Hang);
    // A probe is stuck in the hanging server once the latest report is far older than the
    // interval (reports land every 100 ms while Puppet Server answers).
    d.wait_for(SOON, "a probe to hang", |_| {
        d.probe_age()
            .is_some_and(|age| age > Duration::from_millis(500))
    });
    let hung = d.probe_age().unwrap_or_default();
    let polling = Instant::now();
    let mut times: Vec<Duration> = (0..20)
        .map(|_| {
            let started = Instant::now();
            let a = d.poll();
            assert!(a.status == 200 || a.status == 503, "{a:?}");
            started.elapsed()
        })
        .collect();
    times.sort();
    eprintln!(
        "poll latency while Puppet Server hangs: median {:?}, max {:?}",
        times[10], times[19]
    );
    // No probe finished while the polls were answered: the report only aged. So the answers
    // did not wait for a probe, however slowly this machine runs.
    let aged = d.probe_age().unwrap_or_default();
    assert!(
        aged >= hung + polling.elapsed().mul_f64(0.9),
        "a probe landed during the polls: age {hung:?} then {aged:?}"
    );
    assert!(
        times[19] < Duration::from_millis(2500),
        "max {:?}: well under the probe deadline of 5 s",
        times[19]
    );
}

/// However many pollers, Puppet Server sees at most one status request per interval.
#[test]
fn two_hundred_concurrent_pollers_cause_one_upstream_request_per_interval() {
    let s = Setup::new(Behavior::Running);
    let d = Daemon::start(&s.args(&["--interval", "500ms", "--timeout", "1s"]));
    d.wait_for(SOON, "OK", is("OK"));
    let addr = d.addr;
    let window = Duration::from_secs(2);
    let before = s.stub.requests();
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut latencies = runtime.block_on(async move {
        let mut pollers = tokio::task::JoinSet::new();
        for _ in 0..200 {
            pollers.spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut latencies = Vec::new();
                while started.elapsed() < window {
                    let t = Instant::now();
                    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                    stream
                        .write_all(b"OPTIONS / HTTP/1.0\r\n\r\n")
                        .await
                        .unwrap();
                    let mut buf = Vec::new();
                    stream.read_to_end(&mut buf).await.unwrap();
                    assert!(
                        buf.starts_with(b"HTTP/1.0 200 OK"),
                        "{}",
                        String::from_utf8_lossy(&buf)
                    );
                    latencies.push(t.elapsed());
                }
                latencies
            });
        }
        let mut latencies = Vec::new();
        while let Some(done) = pollers.join_next().await {
            latencies.extend(done.unwrap());
        }
        latencies
    });
    let elapsed = started.elapsed();
    let upstream = s.stub.requests() - before;
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    eprintln!(
        "200 pollers for {elapsed:?}: {} polls ({:.0}/s), latency p50 {:?} p99 {:?} max {:?}; {upstream} upstream requests",
        latencies.len(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        pct(0.5),
        pct(0.99),
        latencies[latencies.len() - 1]
    );
    assert!(latencies.len() >= 200, "every poller was answered");
    let allowed = (elapsed.as_millis() / 500) as usize + 1;
    assert!(
        upstream <= allowed,
        "{upstream} upstream requests in {elapsed:?} (allowed {allowed})"
    );
    assert!(upstream >= 1, "the prober kept probing");
}

#[test]
fn sigterm_stops_the_daemon_cleanly() {
    let s = Setup::new(Behavior::Running);
    let mut d = s.daemon(&[]);
    d.wait_for(SOON, "OK", is("OK"));
    let status = std::process::Command::new("kill")
        .args(["-TERM", &d.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = exited_within(d.child(), SOON).expect("pmcheck ignored SIGTERM");
    assert_eq!(status.code(), Some(0));
}
