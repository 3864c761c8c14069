//! `pmcheck status` against a running daemon polled by a stand-in load balancer that sends
//! its own view (`http-check send-state`): what each load balancer did, the weight with its
//! cause, and the one next step, in words, as the drain goes in and out.

mod common;

use std::time::{Duration, Instant};

use common::lb::{LoadBalancer, Polling};
use common::operator::*;
use common::*;

fn status(d: &Daemon) -> String {
    let out = pmcheck()
        .args(["status", "--url", &format!("http://{}/", d.addr)])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `status` until `pred` holds.
fn status_until(d: &Daemon, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + SOON;
    loop {
        let out = status(d);
        if pred(&out) {
            return out;
        }
        assert!(Instant::now() < deadline, "waited for {what}:\n{out}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn line<'a>(out: &'a str, label: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no `{label}` line:\n{out}"))
}

#[test]
fn status_says_what_each_load_balancer_did_and_what_to_do_next() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let lb = LoadBalancer::start(Polling::new(d.addr, Some(d.agent_addr())));
    lb.send_state(Some(
        "UP; address=127.0.0.1; port=8140; name=bk/m1; node=lb1; weight=100/200; scur=2/5; qcur=0",
    ));
    let out = status_until(&d, "the load balancer's view", |o| {
        o.contains("sends it agents")
    });
    let lb_line = line(&out, "lb:     127.0.0.2");
    assert_contains!(
        lb_line,
        ": bk/m1 on lb1 sends it agents, still 2 session(s); told OK for ",
        "{out}"
    );
    assert!(
        lb_line.contains("HTTP: OK x") && lb_line.contains("agent: OK x"),
        "{out}"
    );
    assert_eq!(
        line(&out, "weight:"),
        "weight: 100%: all of the configured weight",
        "{out}"
    );
    assert_eq!(
        line(&out, "next:"),
        "next:   serving: `pmcheck drain --reason ... --wait` takes it out for work"
    );

    // Drained, HAProxy still sending: not safe yet, and says why.
    assert!(s.pmcheck("drain", &["--reason", "kernel"]).status.success());
    let out = status_until(&d, "DRAINED", |o| o.starts_with("DRAINED"));
    assert_eq!(
        line(&out, "weight:"),
        "weight: none sent while drained: the agent line says `drain` and carries no weight"
    );
    let next = line(&out, "next:");
    assert!(
        next.starts_with("next:   drained, not yet safe to stop Puppet Server ("),
        "{out}"
    );
    assert!(next.ends_with("`pmcheck undrain` puts it back"), "{out}");

    // HAProxy took it out: safe, by the same predicate as `drain --wait`.
    lb.send_state(Some(
        "NOLB; address=127.0.0.1; port=8140; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0",
    ));
    let out = status_until(&d, "HAProxy to act", |o| o.contains("took it out (NOLB)"));
    assert_contains!(
        line(&out, "lb:     127.0.0.2"),
        ": bk/m1 on lb1 took it out (NOLB): no new agents, no session left; told DRAINED for ",
        "{out}"
    );
    let out = status_until(&d, "safe", |o| o.contains("safe to stop Puppet Server;"));
    assert_eq!(
        line(&out, "next:"),
        "next:   drained and every load balancer has acted: safe to stop Puppet Server; \
         `pmcheck undrain` puts it back",
        "{out}"
    );
    let wait = s.pmcheck(
        "drain",
        &[
            "--reason",
            "kernel",
            "--wait",
            "--url",
            &format!("http://{}/", d.addr),
        ],
    );
    assert_eq!(wait.status.code(), Some(0), "drain --wait agrees: {wait:?}");

    // Back: the ramp, with when it is full.
    lb.send_state(Some(
        "UP; address=127.0.0.1; port=8140; name=bk/m1; node=lb1; weight=10/110; scur=0/0; qcur=0",
    ));
    assert!(s.pmcheck("undrain", &[]).status.success());
    let out = status_until(&d, "OK", |o| o.starts_with("OK"));
    let weight = line(&out, "weight:");
    assert_contains!(
        weight,
        "%, ramping up after coming back (--slow-start): 100% in ",
        "{out}"
    );
}
