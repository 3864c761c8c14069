//! `pmcheck serve`, the HTTP side: HAProxy's exact bytes, methods, the JSON and its route, the
//! drain seen by the running daemon, and polls that never wait for Puppet Server.

mod common;

use std::time::{Duration, Instant};

use common::*;
use pmcheck::health::answer::Answer;
use pmcheck::health::verdict::Verdict;
use pmcheck::protocol::Status;

const SOON: Duration = Duration::from_secs(10);

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
/// poller itself. JSON on `/` is a poll's answer, for this host too: no pollers there.
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
    let view = Status::from_json(&status.body).unwrap();
    assert_eq!(view.answer.verdict, Verdict::Ok);
    let clients: Vec<_> = view.pollers.iter().map(|p| p.client.clone()).collect();
    assert_eq!(clients, [Some("HAProxy".to_owned())], "{:?}", view.pollers);
    let json = request(
        d.addr,
        "GET / HTTP/1.1\r\nhost: a\r\naccept: application/json\r\nuser-agent: pmcheck/0.1.0\r\nconnection: close\r\n\r\n",
    );
    let poll: serde_json::Value = serde_json::from_str(&json.body).unwrap();
    assert_eq!(poll["verdict"], "OK", "{json:?}");
    assert!(poll.get("pollers").is_none(), "{json:?}");
    assert!(Answer::from_json(&json.body).is_ok(), "{json:?}");
    assert_eq!(json.header("deprecation"), None);
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
    d.wait_for_log(SOON, "verdict changed verdict=DRAINED ");
    d.wait_probes(3, SOON);
    assert_eq!(
        d.logged("verdict changed "),
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
            .starts_with("DRAINED - drain file is empty; it still counts as drained"),
        "{a:?}"
    );
    // Moved away whole, not emptied then removed: the daemon, drained no longer, may write its
    // slow start's record there at any moment.
    let away = tempfile::tempdir().unwrap();
    std::fs::rename(s.state.path(), away.path().join("state")).unwrap();
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

/// Issue 54, part 5: with `pmcheck.socket`, 4 of 8 restarts showed HAProxy `L7STS 503` from
/// half a second of STARTING. A poll that comes before the first probe waits for it in the
/// socket's queue (a second at most) and gets the real answer.
#[test]
fn a_poll_before_the_first_probe_waits_for_it() {
    let s = Setup::new(Behavior::Running);
    s.stub
        .seen
        .delay_ms
        .store(300, std::sync::atomic::Ordering::SeqCst);
    let d = Daemon::start(&s.args(&["--interval", "10s"]));
    // Polled once the first probe's request is in, its answer 300 ms away.
    let deadline = Instant::now() + Duration::from_secs(10);
    let seen = &s.stub.seen.requests;
    while seen.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no first probe");
        std::thread::sleep(Duration::from_millis(5));
    }
    let a = d.poll();
    assert_eq!(a.status, 200, "{a:?}");
    assert!(a.body.starts_with("OK - "), "{a:?}");
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
    // did not wait for a probe, however slowly this machine runs. The time is taken before
    // the age is asked for: the daemon reads the age after this request was sent (a
    // millisecond allowed for its rounding).
    let polled = polling.elapsed();
    let aged = d.probe_age().unwrap_or_default();
    assert!(
        aged + Duration::from_millis(1) >= hung + polled,
        "a probe landed during the polls: age {hung:?} then {aged:?}, {polled:?} later"
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

/// Issue 46 (a new operator): the first probe after an install timed out, the node that had
/// served for 12 minutes was answered and logged DOWN, and its weight ramped up again. The
/// daemon's first probe is its coldest: one that times out is made again before any answer
/// but STARTING, which changes nothing in HAProxy.
#[test]
fn a_first_probe_that_times_out_is_made_again_before_any_answer() {
    let s = Setup::new(Behavior::HangProbes);
    let d = s.daemon(&["--agent-listen", "127.0.0.1:0"]);
    let deadline = Instant::now() + SOON;
    while s.stub.unanswered() == 0 {
        assert!(Instant::now() < deadline, "the first probe never came");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The first probe's request hangs until its 1 s deadline; the next one is answered.
    s.stub.set(Behavior::Running);
    let mut said = Vec::new();
    loop {
        let reply = d.poll();
        let word = reply
            .body
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_owned();
        if word == "OK" {
            break;
        }
        assert!(Instant::now() < deadline, "never OK: {said:?}");
        said.push(word);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(said.iter().all(|w| w == "STARTING"), "{said:?}");
    d.wait_for_log(SOON, "the first probe timed out");
    assert_eq!(
        d.logged("verdict changed verdict=DOWN "),
        0,
        "no DOWN was logged"
    );
    // Nothing came back, so nothing ramps: the first OK asks for the whole weight.
    let (line, _) = agent_line(d.agent_addr(), None);
    assert!(line.starts_with("up ready 100%"), "{line}");
}

/// Issue 46 (a new operator): a package upgrade restarted pmcheck mid-ramp and the weight went
/// from 31% straight to 100%, since a new daemon starts steady. The ramp under way is kept in
/// the state directory, and a new daemon resumes it.
#[test]
fn a_restarted_daemon_resumes_the_slow_start_under_way() {
    let s = Setup::new(Behavior::Reply(503, "text/plain", "starting"));
    let args = ["--agent-listen", "127.0.0.1:0", "--slow-start", "60s"];
    let d = s.daemon(&args);
    d.wait_for(SOON, "DOWN", is("DOWN"));
    s.stub.set(Behavior::Running);
    d.wait_for(SOON, "OK", is("OK"));
    let weight = |d: &Daemon| {
        let (line, _) = agent_line(d.agent_addr(), None);
        (line
            .strip_prefix("up ready ")
            .and_then(|l| l.split('%').next()))
        .and_then(|n| n.parse::<u8>().ok())
        .unwrap_or_else(|| panic!("no weight: {line}"))
    };
    assert!(weight(&d) < 50, "ramping");
    let record = s.state.path().join("ramp");
    let deadline = Instant::now() + SOON;
    while !record.exists() {
        assert!(Instant::now() < deadline, "the ramp was not kept");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(d);
    let again = s.daemon(&args);
    again.wait_for(SOON, "OK", is("OK"));
    let said = " resuming the slow start a previous pmcheck began ";
    again.wait_for_log(SOON, said);
    // As people write a duration (`0.3s`), not humantime's `312ms 580us 205ns`.
    let log = again.log.lock().unwrap();
    let line = log.iter().find(|l| l.contains(said)).unwrap();
    let ago = logged_field(line, said, "began_ago").unwrap();
    let tenths = ago.strip_suffix('s').and_then(|n| n.split_once('.'));
    assert!(tenths.is_some_and(|(_, t)| t.len() == 1), "{line}");
    drop(log);
    let resumed = weight(&again);
    assert!(
        (10..50).contains(&resumed),
        "resumed at {resumed}%, not 100%"
    );
}
