//! The HAProxy agent check, as HAProxy and hostile clients use it: one line per connection
//! at once, whatever the client sends or does not read; the weight from the pool and the ramp;
//! drains that HAProxy can tell from failures.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;

const SOON: Duration = Duration::from_secs(10);

fn agent_daemon(s: &Setup, extra: &[&str]) -> Daemon {
    let mut args = vec!["--agent-listen", "127.0.0.1:0", "--interval", "100ms"];
    args.extend_from_slice(extra);
    let d = Daemon::start(&s.args(&args));
    d.wait_for(SOON, "a first probe", |a| !a.body.starts_with("STARTING"));
    d
}

fn wait_line(addr: SocketAddr, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + SOON;
    loop {
        let (line, _) = agent_line(addr, None);
        if pred(&line) {
            return line;
        }
        assert!(
            Instant::now() < deadline,
            "waited for {what}; last line {line:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_client_that_sends_nothing_gets_the_whole_state_at_once_then_a_close() {
    let s = Setup::new(Behavior::Running);
    let d = agent_daemon(&s, &[]);
    let (line, took) = agent_line(d.agent_addr(), None);
    assert_eq!(
        line,
        "up ready 100% #OK - Puppet Server is running, 1 of 1 JRubies free\n"
    );
    assert!(
        took < Duration::from_secs(1),
        "at once, not after a read timeout: {took:?}"
    );
}

#[test]
fn agent_send_bytes_and_half_closes_still_get_the_line() {
    let s = Setup::new(Behavior::Running);
    let d = agent_daemon(&s, &[]);
    let addr = d.agent_addr();
    let (line, _) = agent_line(addr, Some(b"ping\n"));
    assert!(line.starts_with("up ready 100% #OK"), "{line:?}");
    // A client that sends and half-closes at once, like `agent-send` on a reused socket, as
    // much as HAProxy can send (its check buffer, `tune.bufsize`: 16 KiB by default). More is
    // no load balancer's, and is not read: the close may then reset the line.
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(SOON)).unwrap();
    stream.write_all(&[b'x'; 16 * 1024]).unwrap();
    stream.shutdown(Shutdown::Write).unwrap();
    let mut line = String::new();
    stream.read_to_string(&mut line).unwrap();
    assert!(line.starts_with("up ready 100% #OK"), "{line:?}");
}

#[test]
fn clients_that_never_read_do_not_hold_the_others_up() {
    let s = Setup::new(Behavior::Running);
    let d = agent_daemon(&s, &[]);
    let addr = d.agent_addr();
    let idle: Vec<TcpStream> = (0..50).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let (line, took) = agent_line(addr, None);
    assert!(line.starts_with("up ready"), "{line:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert_eq!(d.poll().status, 200, "HTTP checks are not held up either");
    // The line waited in each idle socket, and the daemon let go of them.
    for mut stream in idle {
        stream.set_read_timeout(Some(SOON)).unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        assert!(text.starts_with("up ready"), "{text:?}");
    }
}

#[test]
fn drained_down_and_busy_nodes_each_say_so() {
    let s = Setup::new(Behavior::Running);
    // A site without a key file: this check, which proves nothing, is answered as any is (with
    // one, it would never say `drain`: tests/drain_rule.rs).
    let d = agent_daemon(&s, &["--slow-start", "0s", "--lb-address", "192.0.2.1/32"]);
    let addr = d.agent_addr();
    assert!(
        s.pmcheck("drain", &["--reason", "kernel upgrade"])
            .status
            .success()
    );
    let line = wait_line(addr, "drain", |l| l.contains("DRAINED"));
    assert!(
        line.starts_with(&format!(
            "up drain #DRAINED - kernel upgrade (by {} ",
            whoami()
        )),
        "{line:?}"
    );
    s.stub.set(Behavior::Reply(503, "error", "text/plain"));
    let line = wait_line(addr, "drained and failing", |l| l.contains("is down"));
    assert!(
        line.starts_with("up drain #DRAINED - kernel upgrade"),
        "a health word, so that HAProxy keeps showing the reason: {line:?}"
    );
    assert!(s.pmcheck("undrain", &[]).status.success());
    let line = wait_line(addr, "down", |l| l.contains("#DOWN"));
    assert_eq!(
        line,
        "down ready 10% #DOWN - Puppet Server reports `error`, not `running`\n"
    );
    s.stub.set(Behavior::Pool(pool(4, 0, 4, 2, ":not-in-use")));
    let line = wait_line(addr, "busy", |l| l.contains("busy"));
    assert_eq!(
        line,
        "up ready 10% #OK - busy: 0 of 4 JRubies free, 2 requests waiting, average wait 850 ms\n"
    );
    s.stub.set(Behavior::Pool(pool(4, 2, 2, 0, ":not-in-use")));
    wait_line(addr, "half the pool free", |l| {
        l.starts_with("up ready 50% #OK")
    });
}

#[test]
fn weight_ramps_up_after_an_undrain() {
    let s = Setup::new(Behavior::Running);
    let d = agent_daemon(&s, &["--slow-start", "3s"]);
    assert_eq!(
        d.status().answer.weight,
        100,
        "started on a serving node: no ramp"
    );
    assert!(s.pmcheck("drain", &[]).status.success());
    d.wait_for(SOON, "DRAINED", |a| a.body.starts_with("DRAINED"));
    assert_eq!(d.status().answer.weight, 10);
    // The daemon sees the node come back after this instant, so its ramp can only be behind a
    // ramp started here: a bound that holds however slowly this test runs.
    let undrained = Instant::now();
    let most = |at: Instant| {
        let elapsed = at.saturating_duration_since(undrained).as_secs_f64();
        (10.0 + 90.0 * elapsed / 3.0).ceil().min(100.0) as u8
    };
    assert!(s.pmcheck("undrain", &[]).status.success());
    let back = d.wait_for_json(SOON, "OK", |a| {
        a.answer.verdict == pmcheck::health::verdict::Verdict::Ok
    });
    let mut weights = vec![(back.answer.weight, most(Instant::now()))];
    while weights.last().unwrap().0 < 100 {
        std::thread::sleep(Duration::from_millis(200));
        let weight = d.status().answer.weight;
        weights.push((weight, most(Instant::now())));
        assert!(weights.len() < 100, "never reached 100: {weights:?}");
    }
    assert!(
        weights.iter().all(|(weight, most)| weight <= most),
        "never ahead of a 3 s ramp from the undrain (weight, most): {weights:?}"
    );
    assert!(
        weights.windows(2).all(|w| w[0].0 <= w[1].0),
        "never drops: {weights:?}"
    );
}

#[test]
fn drains_can_answer_404_for_disable_on_404() {
    let s = Setup::new(Behavior::Running);
    let d = agent_daemon(&s, &["--drained-status", "404"]);
    assert!(
        s.pmcheck("drain", &["--reason", "planned"])
            .status
            .success()
    );
    let a = d.wait_for(SOON, "DRAINED", |a| a.body.starts_with("DRAINED"));
    assert_eq!(a.status, 404, "{a:?}");
    assert!(
        a.status_line.starts_with("HTTP/1.1 404 Drained: planned"),
        "{a:?}"
    );
    assert_eq!(d.status().answer.status, 404);
    // Failures stay 503.
    s.stub.set(Behavior::Reply(503, "error", "text/plain"));
    assert!(s.pmcheck("undrain", &[]).status.success());
    let a = d.wait_for(SOON, "DOWN", |a| a.body.starts_with("DOWN"));
    assert_eq!(a.status, 503);
}

#[test]
fn a_drained_status_other_than_503_or_404_is_refused_with_the_choice() {
    let out = pmcheck()
        .args(["serve", "--drained-status", "200"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_contains!(err, "--drained-status");
    assert!(err.contains("must be 503") && err.contains("404"), "{err}");
}

#[test]
fn the_allow_list_guards_the_agent_port_too() {
    let s = Setup::new(Behavior::Running);
    let d = Daemon::start(&s.args(&["--agent-listen", "127.0.0.1:0", "--allow", "192.0.2.0/24"]));
    let mut stream = TcpStream::connect(d.agent_addr()).unwrap();
    stream.set_read_timeout(Some(SOON)).unwrap();
    let mut line = Vec::new();
    // Closed (or reset) without a word.
    let _ = stream.read_to_end(&mut line);
    assert_eq!(String::from_utf8_lossy(&line), "");
    d.wait_for_log(
        SOON,
        "refused connections from outside --allow in the last 10s count=1 ",
    );
}

/// One line per change of the verdict: not per compile, and not per busy spell of a small pool
/// (twice per agent run with a pool of one), which is logged at debug only.
#[test]
fn the_log_follows_the_verdict_not_every_compile_or_busy_spell() {
    let s = Setup::new(Behavior::Pool(pool(4, 4, 0, 0, ":not-in-use")));
    let d = agent_daemon(&s, &[]);
    for free in [3, 2, 3, 4] {
        s.stub
            .set(Behavior::Pool(pool(4, free, 4 - free, 0, ":not-in-use")));
        let text = format!("OK - Puppet Server is running, {free} of 4 JRubies free");
        d.wait_for(SOON, &text, |a| a.body.starts_with(&text));
    }
    for _ in 0..2 {
        s.stub.set(Behavior::Pool(pool(4, 0, 4, 1, ":not-in-use")));
        d.wait_for(SOON, "busy", |a| a.body.starts_with("OK - busy: 0 of 4"));
        s.stub.set(Behavior::Pool(pool(4, 4, 0, 0, ":not-in-use")));
        d.wait_for(SOON, "warm", |a| {
            a.body.starts_with("OK - Puppet Server is running")
        });
    }
    d.wait_probes(3, SOON);
    assert_eq!(
        d.logged("verdict changed verdict=OK "),
        1,
        "{:?}",
        d.log.lock().unwrap()
    );
    // A new verdict is said, and OK again after it.
    s.stub.set(Behavior::Reply(503, "error", "text/plain"));
    d.wait_for_log(
        SOON,
        r#"verdict changed verdict=DOWN reason="Puppet Server reports `error`"#,
    );
    s.stub.set(Behavior::Pool(pool(4, 4, 0, 0, ":not-in-use")));
    let deadline = std::time::Instant::now() + SOON;
    while d.logged("verdict changed verdict=OK ") < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            d.log.lock().unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// An agent check proves it is the load balancer's with the key as HAProxy's `agent-send`
/// sends it; without the key the same address is another poller, whose word counts for nothing.
#[test]
fn an_agent_check_proves_itself_with_the_key_it_sends() {
    use pmcheck::settings::lb_proof::Proof;
    let s = Setup::new(Behavior::Running);
    let d = agent_daemon(&s, &[]);
    let with_key = format!("{}\n", common::lb::LB_KEY);
    let proofs = || -> Vec<(Proof, u32)> {
        let answer = d.status();
        let mut found: Vec<(Proof, u32)> = (answer.pollers.iter())
            .filter_map(|p| p.agent.map(|t| (p.proof, t.times)))
            .collect();
        found.sort_by_key(|(p, _)| format!("{p:?}"));
        found
    };
    for _ in 0..2 {
        let (line, _) = agent_line(d.agent_addr(), Some(with_key.as_bytes()));
        assert!(line.starts_with("up ready"), "{line}");
    }
    let (line, _) = agent_line(d.agent_addr(), Some(b"0123456789abcdef0123456789abcdef\n"));
    assert!(
        line.starts_with("up ready"),
        "the answer is the same: {line}"
    );
    agent_line(d.agent_addr(), None);
    // Each check is noted once its client closed: the last one may still be on its way. The
    // wrong key and no key are one unproven poller, named by its latest check.
    let deadline = Instant::now() + SOON;
    while proofs() != [(Proof::Key, 2), (Proof::NoKey, 2)] {
        assert!(Instant::now() < deadline, "{:?}", proofs());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Where load balancers prove themselves (a key file), an agent check that proves nothing or
/// names no line never says `drain`: HAProxy's DRAIN leaves the header's word `UP` and only the
/// backend's total drops, so the line would read as the backend's last server (CI's Debian 13
/// run, HAProxy 3.4, a backend without agent-send: the drain refused as the last server's). The
/// HTTP check takes the node out.
#[test]
fn an_agent_check_that_proves_nothing_never_drains_where_keys_are_set() {
    let s = Setup::new(Behavior::Running);
    let d = agent_daemon(&s, &["--slow-start", "0s"]);
    let addr = d.agent_addr();
    assert!(
        s.pmcheck("drain", &["--reason", "kernel upgrade"])
            .status
            .success()
    );
    let line = wait_line(addr, "drain", |l| l.contains("DRAINED"));
    assert!(line.starts_with("#DRAINED - "), "no admin word: {line:?}");
    assert!(
        line.contains("cannot be told to its server line"),
        "{line:?}"
    );
    assert!(d.wait_for(SOON, "404", is("DRAINED")).status != 200);
}
