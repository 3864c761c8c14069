//! `GET /metrics` of a daemon against the TLS stub of Puppet Server: the series follow a drain
//! and a stopped Puppet Server, a scrape is not a poll and never a probe, and `promtool check
//! metrics` (Prometheus's own linter) accepts every scrape.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;

const SOON: Duration = Duration::from_secs(10);
const PROMETHEUS: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// Where the polls come from: a load balancer, not this host's scrapes.
const LB: &str = "127.0.0.2";

fn scrape_as(d: &Daemon, method: &str, accept: Option<&str>) -> Reply {
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    request(
        d.addr,
        &format!(
            "{method} /metrics HTTP/1.1\r\nHost: pmcheck\r\n{accept}Connection: close\r\n\r\n"
        ),
    )
}

fn verdict_is(word: &str) -> impl Fn(&str) -> bool + '_ {
    move |text| value(text, &format!("pmcheck_verdict{{verdict=\"{word}\"}}")) == Some(1.0)
}

fn wait_scrape(d: &Daemon, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + SOON;
    loop {
        let text = d.scrape();
        if pred(&text) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "waited for {what}; last scrape:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Runs `promtool ARGS` with `input` on stdin: whether it succeeded, and what it said. `None`
/// when promtool is not installed (outside CI; under CI=true that fails the test).
fn promtool(args: &[&str], input: &str) -> Option<(bool, String)> {
    let mut child = match Command::new("promtool")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true and promtool is missing: install Debian's prometheus package (scripts/test does)"
            );
            eprintln!(
                "!!!!!!!! SKIPPED promtool {}: promtool is not installed (apt-get install prometheus)",
                args.join(" ")
            );
            return None;
        }
        Err(e) => panic!("cannot run promtool: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Some((out.status.success(), said))
}

/// A daemon probing a stub whose pool service answers `answer`, and its first scrape with the pool.
fn with_pool(answer: String) -> (Setup, Daemon, String) {
    let s = Setup::new(Behavior::Pool(answer));
    let d = Daemon::start(&s.args(&["--interval", "100ms"]));
    let text = wait_scrape(&d, "the pool", |t| {
        value(t, "pmcheck_puppetserver_jruby_pool_size").is_some()
    });
    (s, d, text)
}

#[test]
fn the_series_follow_a_drain_and_a_stopped_puppet_server() {
    let (s, d, text) = with_pool(pool(4, 1, 3, 2, ":not-in-use"));
    assert!(verdict_is("OK")(&text), "busy is still OK:\n{text}");
    for (series, want) in [
        ("pmcheck_puppetserver_jruby_pool_size", 4.0),
        ("pmcheck_puppetserver_jruby_free", 1.0),
        ("pmcheck_puppetserver_jruby_borrowed", 3.0),
        ("pmcheck_puppetserver_jruby_requested", 2.0),
        ("pmcheck_puppetserver_jruby_average_wait_seconds", 0.85),
        ("pmcheck_puppetserver_jruby_average_borrow_seconds", 4.0),
        ("pmcheck_puppetserver_jruby_queue_limit_hits_total", 0.0),
        (
            r#"pmcheck_puppetserver_jruby_pool_lock{state="not-in-use"}"#,
            1.0,
        ),
        ("pmcheck_drained", 0.0),
    ] {
        assert_eq!(value(&text, series), Some(want), "{series} in\n{text}");
    }
    let weight = value(&text, "pmcheck_agent_weight_ratio").expect("a weight");
    assert!(
        weight > 0.0 && weight < 1.0,
        "a busy node asks for less: {weight}"
    );
    assert!(value(&text, "pmcheck_drain_started_timestamp_seconds").is_none());

    let out = s.pmcheck("drain", &["--reason", "kernel", "--for", "1h"]);
    assert!(out.status.success(), "{out:?}");
    let text = wait_scrape(&d, "DRAINED", verdict_is("DRAINED"));
    assert!(!verdict_is("OK")(&text), "{text}");
    assert_eq!(value(&text, "pmcheck_drained"), Some(1.0), "{text}");
    let since = value(&text, "pmcheck_drain_started_timestamp_seconds").expect("a start");
    let until = value(&text, "pmcheck_drain_expires_timestamp_seconds").expect("an expiry");
    assert!((epoch_now() - since).abs() < 10.0, "started {since}");
    assert!((until - since - 3600.0).abs() < 2.0, "{since} .. {until}");
    let floor = f64::from(pmcheck::health::weight::FLOOR) / 100.0;
    assert_eq!(value(&text, "pmcheck_agent_weight_ratio"), Some(floor));

    let out = s.pmcheck("undrain", &[]);
    assert!(out.status.success(), "{out:?}");
    let text = wait_scrape(&d, "OK again", verdict_is("OK"));
    assert_eq!(value(&text, "pmcheck_drained"), Some(0.0), "{text}");
    assert!(value(&text, "pmcheck_drain_started_timestamp_seconds").is_none());

    let refused = r#"pmcheck_probe_failures_total{cause="refused"}"#;
    assert_eq!(value(&text, refused), Some(0.0), "{text}");
    let probes_before = value(&text, "pmcheck_probe_duration_seconds_count").unwrap();
    drop(s.stub);
    // The first probe after may fail mid-exchange, on the connection kept alive from before
    // (cause "exchange"); the next ones find nothing listening.
    let text = wait_scrape(&d, "DOWN, refused", |t| {
        verdict_is("DOWN")(t) && value(t, refused).is_some_and(|n| n >= 1.0)
    });
    assert_eq!(
        value(&text, r#"pmcheck_probe_failures_total{cause="tls"}"#),
        Some(0.0)
    );
    assert!(value(&text, "pmcheck_probe_duration_seconds_count").unwrap() > probes_before);
    assert!(
        !text.contains("pmcheck_puppetserver_"),
        "no probe read a pool, so no pool series:\n{text}"
    );
}

#[test]
fn a_scrape_is_neither_a_poll_nor_a_probe() {
    let s = Setup::new(Behavior::Running);
    // One probe at start, the next an hour later: any further request would be the scrapes'.
    let d = Daemon::start(&s.args(&["--interval", "1h", "--agent-listen", "127.0.0.1:0"]));
    let text = wait_scrape(&d, "a first probe", verdict_is("OK"));
    let probes = s.stub.requests();
    let polls = |t: &str| value(t, r#"pmcheck_polls_total{kind="http",verdict="OK"}"#).unwrap();
    let before = polls(&text);
    for _ in 0..50 {
        d.scrape();
    }
    // The polls come from another address than the scrapes: a scrape taken for a poll would
    // make a second poller.
    for _ in 0..3 {
        let mut stream = connect_from(LB, d.addr, SOON).unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: pmcheck\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        assert!(raw.starts_with("HTTP/1.1 200 "), "{raw}");
    }
    let mut line = String::new();
    connect_from(LB, d.agent_addr(), SOON)
        .unwrap()
        .read_to_string(&mut line)
        .unwrap();
    assert!(line.starts_with("up ready"), "{line}");
    // An agent poll is counted once its connection has ended, which may be just after the
    // client read the line: under load, the next scrape can come first.
    let agent = r#"pmcheck_polls_total{kind="agent",verdict="OK"}"#;
    let text = wait_scrape(&d, "the agent poll to be counted", |t| {
        value(t, agent).is_some_and(|n| n > 0.0)
    });
    assert_eq!(s.stub.requests(), probes, "scrapes never probe");
    assert_eq!(polls(&text), before + 3.0, "only the polls count:\n{text}");
    assert_eq!(value(&text, agent), Some(1.0));
    assert_eq!(
        value(&text, "pmcheck_pollers"),
        Some(1.0),
        "127.0.0.1, once:\n{text}"
    );
    assert_eq!(
        value(&text, "pmcheck_probe_duration_seconds_count"),
        Some(1.0)
    );
}

#[test]
fn prometheus_gets_openmetrics_and_everyone_else_the_classic_format() {
    let s = Setup::new(Behavior::Running);
    let d = Daemon::start(&s.args(&["--interval", "100ms"]));
    wait_scrape(&d, "a first probe", verdict_is("OK"));
    let open = scrape_as(&d, "GET", Some(PROMETHEUS));
    assert_eq!(
        open.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(open.body.ends_with("# EOF\n"), "{}", open.body);
    let classic = scrape_as(&d, "GET", None);
    assert_eq!(
        classic.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(!classic.body.contains("# EOF"), "{}", classic.body);
    let head = scrape_as(&d, "HEAD", None);
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    let length: usize = head.header("content-length").unwrap().parse().unwrap();
    assert!(
        length > 1000,
        "HEAD says how long the GET would be: {length}"
    );
    let post = request(
        d.addr,
        "POST /metrics HTTP/1.1\r\nHost: pmcheck\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(post.status, 405);
    // Every other path is still the health check (/status is the operator's: tests/serve.rs).
    for path in ["/", "/metrics/", "/metricsx", "/status/", "/health"] {
        let reply = request(
            d.addr,
            &format!("GET {path} HTTP/1.1\r\nHost: pmcheck\r\nConnection: close\r\n\r\n"),
        );
        assert!(reply.body.starts_with("OK - "), "{path}: {}", reply.raw);
    }
}

#[test]
fn promtool_accepts_every_scrape() {
    let (s, d, healthy) = with_pool(pool(2, 0, 2, 1, ":requested"));
    assert!(s.pmcheck("drain", &["--for", "2h"]).status.success());
    let drained = wait_scrape(&d, "the drain", |t| {
        value(t, "pmcheck_drain_expires_timestamp_seconds").is_some()
    });
    // Then Puppet Server stops under the drain: failures counted, no pool series.
    drop(s.stub);
    let down = wait_scrape(&d, "refused probes", |t| {
        value(t, r#"pmcheck_probe_failures_total{cause="refused"}"#) >= Some(1.0)
            && value(t, "pmcheck_puppetserver_jruby_pool_size").is_none()
    });
    for (state, text) in [
        ("healthy and busy", healthy),
        ("drained", drained),
        ("drained, Puppet Server stopped", down),
    ] {
        let Some((ok, said)) = promtool(&["check", "metrics"], &text) else {
            return;
        };
        assert!(
            ok && said.trim().is_empty(),
            "promtool on the {state} scrape: {said}\n{text}"
        );
    }
}

/// The shipped example alerts are valid rules, and their unit tests (each alert fires when it
/// should and not before) pass.
#[test]
fn the_shipped_alert_rules_pass_promtool() {
    let rules = "packaging/prometheus/pmcheck-alerts.yml";
    let Some((ok, said)) = promtool(&["check", "rules", rules], "") else {
        return;
    };
    assert!(ok && said.contains("SUCCESS: 11 rules found"), "{said}");
    let tests = "packaging/prometheus/pmcheck-alerts.test.yml";
    let Some((ok, said)) = promtool(&["test", "rules", tests], "") else {
        return;
    };
    assert!(ok && said.contains("SUCCESS"), "{said}");
}

/// The value of one series (name and labels exactly as written), if present, as a number.
fn value(text: &str, name: &str) -> Option<f64> {
    series(text, name).map(|v| v.parse().unwrap_or_else(|_| panic!("{name} = {v:?}")))
}
