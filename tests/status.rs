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
    let lb_line = line(&out, "lb:     127.0.0.2 (lb1)");
    assert_contains!(
        lb_line,
        ": bk/m1 sends it agents, still 2 session(s); told OK for ",
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
        line(&out, "lb:     127.0.0.2 (lb1)"),
        ": bk/m1 took it out (NOLB): no new agents, no session left; told DRAINED for ",
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

/// A load balancer whose checks stop sending its view (`http-check send-state` removed from the
/// backend, HAProxy reloaded): its last header is no longer shown as its state, nor judged by;
/// status says it stopped, and what its checks were told stands in for it.
#[test]
fn a_view_the_load_balancer_stopped_sending_is_not_shown_as_current() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let lb = LoadBalancer::start(Polling::new(d.addr, Some(d.agent_addr())));
    lb.send_state(Some(
        "UP; address=127.0.0.1; port=8140; name=bk/m1; node=lb1; weight=100/200; scur=2/5; qcur=0",
    ));
    status_until(&d, "the load balancer's view", |o| {
        o.contains("sends it agents")
    });
    lb.send_state(None);
    let out = status_until(&d, "the view to stop", |o| {
        o.contains("it stopped sending its own view")
    });
    let lb_line = line(&out, "lb:     127.0.0.2");
    assert!(!lb_line.contains("sends it agents"), "{out}");
    assert!(!lb_line.contains("session"), "{out}");
    assert_contains!(lb_line, "judged by what they were told", "{out}");
}

/// A load balancer whose agent checks stop (`agent-check` removed from its server line,
/// HAProxy reloaded) while its HTTP checks go on: the weight is read by nobody now, and what the
/// agent checks were told before is shown as past.
#[test]
fn an_agent_check_the_load_balancer_stopped_making_is_not_shown_as_current() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let lb = LoadBalancer::start(Polling::new(d.addr, Some(d.agent_addr())));
    // Three agent checks give their rhythm, by which their silence is judged.
    let out = status_until(&d, "three agent checks", |o| {
        o.split("agent: OK x")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n >= 3)
    });
    assert_eq!(
        line(&out, "weight:"),
        "weight: 100%: all of the configured weight",
        "{out}"
    );
    lb.stop_agent_checks();
    let out = status_until(&d, "the agent checks to stop", |o| {
        o.contains("then no more agent checks")
    });
    assert_contains!(
        line(&out, "weight:"),
        "weight: 100%: all of the configured weight, but no load balancer reads it now: their \
         agent checks stopped (127.0.0.2's ",
        "{out}"
    );
    assert_contains!(
        line(&out, "lb:     127.0.0.2"),
        " ago, then no more agent checks (`agent-check` gone from its server line?)",
        "{out}"
    );
    // An agent drain told before is no longer HAProxy's state: a drain is judged by the HTTP
    // checks alone.
    assert!(s.pmcheck("drain", &["--reason", "kernel"]).status.success());
    let out = status_until(&d, "DRAINED", |o| o.starts_with("DRAINED"));
    assert!(!out.contains("agent: DRAINED"), "{out}");
}

/// HAProxy's words as it means them: an agent drain keeps the word UP (and the header's
/// weights show it only when the other servers weigh less), and `UP 2/3` is on its way DOWN.
/// The `lb:` line says what HAProxy does and where it is heading, never "sends it agents".
#[test]
fn an_agent_drain_under_the_word_up_is_read_as_haproxy_means_it() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let lb = LoadBalancer::start(Polling::new(d.addr, Some(d.agent_addr())));
    assert!(s.pmcheck("drain", &["--reason", "kernel"]).status.success());
    // Drains answered 503 (no `disable-on-404`): the HTTP check fails while the agent drains.
    lb.send_state(Some(
        "UP 2/3; address=127.0.0.1; port=8140; name=bk/m1; node=lb1; weight=100/200; scur=0/3; qcur=0",
    ));
    // (The first line says DRAINED at once: wait for the agent's word.)
    let out = status_until(&d, "the agent's drain", |o| o.contains("agent: DRAINED"));
    let lb_line = line(&out, "lb:     127.0.0.2");
    assert_contains!(
        lb_line,
        "127.0.0.2 (lb1): bk/m1 holds it in DRAIN (its agent check said `drain`): no new agents, and it \
         fails its checks: DOWN after 2 more, no session left; told DRAINED for ",
        "{out}"
    );
    assert!(!lb_line.contains("sends it agents"), "{out}");
}

/// A cycle that stopped half-way keeps the node drained until `pmcheck undrain`: `status`
/// shows it beside the drain, read from the record on this host.
#[test]
fn a_stopped_cycle_that_holds_the_node_is_shown() {
    let s = Setup::new(Behavior::Running);
    let record = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/drain/held.json"),
    )
    .unwrap();
    std::fs::write(s.state.path().join("drain"), record).unwrap();
    let d = daemon(&s);
    d.wait_for(SOON, "DRAINED", |a| a.body.starts_with("DRAINED"));
    let out = s.pmcheck("status", &["--url", &format!("http://{}/", d.addr)]);
    let shown = stdout(&out);
    let held = line(&shown, "holders:");
    assert_contains!(
        held,
        "stopped cycle (pmcheck cycle: apt-get -y upgrade, by bob since 2026-11-19T09:00:00Z)",
        "{shown}"
    );
    assert_contains!(held, "drain (kernel upgrade, by alice via sudo", "{shown}");
}

/// What the new operator of issue 46 met: a record pmcheck cannot read showed `drain: not
/// drained` under UNKNOWN, and a note written by hand showed a JSON parser's complaint.
#[test]
fn the_drain_line_says_cannot_tell_for_an_unreadable_record_and_shows_a_note() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    d.wait_for(SOON, "OK", is("OK"));
    let path = s.state.path().join("drain");
    replace(&path, b"kernel upgrade, back by 18:00 -- alice\n");
    d.wait_for(SOON, "DRAINED", is("DRAINED"));
    let shown = status(&d);
    assert_eq!(
        line(&shown, "drain:"),
        "drain:  kernel upgrade, back by 18:00 -- alice (not a pmcheck record; it still counts as drained)",
        "{shown}"
    );
    replace(&path, &vec![b' '; 16 * 1024]);
    d.wait_for(SOON, "UNKNOWN", is("UNKNOWN"));
    let shown = status(&d);
    let drain = line(&shown, "drain:");
    assert!(
        drain.starts_with("drain:  cannot tell, so UNKNOWN (503): drain record ")
            && drain.contains("is 16384 bytes, more than the 8192"),
        "{shown}"
    );
}
