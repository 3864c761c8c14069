//! The waits ask the load balancer itself (`http-check send-state`), never believe a fresh
//! daemon that has heard nobody, are not ended early by a flood of addresses, and `drain`
//! refuses to take out the last server a load balancer sends agents to. A stand-in load
//! balancer polls from 127.0.0.2; the header it sends is set by each test.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::lb::{LoadBalancer, Polling};
use common::operator::*;
use common::*;
use pmcheck::health::hold::Held;
use pmcheck::protocol::StateAnswer;

/// HAProxy's header for this node: up and taking new agents, beside a server as heavy.
const UP: &str =
    "UP; address=127.0.0.1; port=8140; name=bk/m1; node=lb1; weight=100/200; scur=0/1; qcur=0";
/// Drained with `disable-on-404`, the last session closed.
const NOLB: &str =
    "NOLB; address=127.0.0.1; port=8140; name=bk/m1; node=lb1; weight=100/100; scur=0/1; qcur=0";
/// The only server taking traffic in its backend.
const LAST: &str =
    "UP; address=127.0.0.1; port=8140; name=bk/m2; node=lb1; weight=100/100; scur=0/0; qcur=0";

fn polling(d: &Daemon, every_ms: u64) -> Polling {
    Polling {
        every: Duration::from_millis(every_ms),
        ..Polling::new(d.addr, None)
    }
}

/// Waits until the daemon lists 127.0.0.2 as a regular poller.
fn until_regular(d: &Daemon) {
    d.wait_for_json(SOON, "the load balancer to be regular", |a| {
        a.pollers
            .iter()
            .any(|p| p.address.to_string() == LB && p.regular)
    });
}

/// Defect 1: a daemon that has just started has heard nobody: `drain --wait` must not take that for
/// "no load balancer polls".
#[test]
fn a_fresh_daemon_is_not_taken_for_one_that_nobody_polls() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    // The load balancer's first check comes 1 s after the start, as HAProxy's may.
    let lb = LoadBalancer::start(Polling {
        first_after: Duration::from_secs(1),
        ..polling(&d, 500)
    });
    let started = Instant::now();
    let out = s.pmcheck(
        "drain",
        &[
            "--wait",
            "--lb-interval",
            "1s",
            "--polls",
            "2",
            "--url",
            &url(&d),
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        !stdout.contains("no load balancer is polling"),
        "believed a daemon that had heard nobody yet: {stdout}"
    );
    assert_contains!(stdout, "127.0.0.2 acted (HTTP: DRAINED x");
    assert!(
        lb.answered(503, started) >= 2,
        "safe before the load balancer had been told twice: {stdout}"
    );
}

/// Defect 2: a flood of agent checks from hundreds of addresses neither pushes the load balancer out
/// of the daemon's table nor acts for it.
#[test]
fn a_flood_of_addresses_cannot_end_a_wait_early() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    // A load balancer checking every second: between two checks the flood has the table.
    let lb = LoadBalancer::start(polling(&d, 1000));
    until_regular_or_polled(&d, &lb);
    let agent = d.agent_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let flooding = Arc::clone(&stop);
    let flood = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut n = 0u32;
        while Instant::now() < deadline && !flooding.load(Ordering::SeqCst) {
            let from = format!("127.0.1.{}", 1 + n % 250);
            if let Ok(mut c) = connect_from(&from, agent, SOON) {
                // What HAProxy sends with an `agent-send` that names nothing.
                let _ = std::io::Write::write_all(&mut c, b"\n");
                let _ = std::io::Read::read_to_end(&mut c, &mut Vec::new());
            }
            n += 1;
        }
        n
    });
    let started = Instant::now();
    let out = s.pmcheck("drain", &["--wait", "--polls", "3", "--url", &url(&d)]);
    stop.store(true, Ordering::SeqCst);
    let checks = flood.join().expect("the flood");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(checks > 250, "the flood made only {checks} agent checks");
    assert!(
        lb.answered(503, started) >= 3,
        "safe before the load balancer had been told 3 times ({checks} flood checks): {stdout}"
    );
    assert_contains!(stdout, "127.0.0.2 acted (HTTP: DRAINED x");
}

/// The old daemon has no `regular` flag: there the load balancer's polls are counted instead.
/// Waits until `lb`'s HTTP checks were answered `status` since `since`.
fn until_told(lb: &LoadBalancer, status: u16, since: Instant) {
    let deadline = Instant::now() + SOON;
    while lb.answered(status, since) == 0 {
        assert!(
            Instant::now() < deadline,
            "the load balancer was not told {status}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn until_regular_or_polled(d: &Daemon, lb: &LoadBalancer) {
    let deadline = Instant::now() + SOON;
    while lb.http_checks() < 3 {
        assert!(Instant::now() < deadline, "the load balancer does not poll");
        std::thread::sleep(Duration::from_millis(20));
    }
    if std::env::var_os("PMCHECK_TEST_BIN").is_none() {
        until_regular(d);
    }
}

/// Defect 3: with `send-state`, `drain --wait` believes the load balancer's word over the answers it
/// counted, and `undrain --wait` returns as soon as the load balancer says UP.
#[test]
fn the_waits_believe_what_the_load_balancer_says() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let lb = LoadBalancer::start(polling(&d, 100));
    lb.send_state(Some(UP));
    until_regular_or_polled(&d, &lb);
    let started = Instant::now();
    let mut wait = Running::start(&s, "drain", &["--wait", "--polls", "2", "--url", &url(&d)]);
    let lines = wait.stderr_until("it still sends new agents here");
    assert_contains!(
        lines.last().unwrap(),
        "load balancer 127.0.0.2 (lb1) says UP for bk/m1 (weight 100/200, 0 session(s), 0 queued",
        "{lines:?}"
    );
    while lb.answered(503, started) < 6 {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        wait.0.try_wait().unwrap().is_none(),
        "drain --wait returned on answers counted while the load balancer still said UP"
    );
    lb.send_state(Some(NOLB));
    let out = wait.finish(SOON);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert_contains!(
        stdout,
        "load balancer 127.0.0.2 (lb1) says NOLB for bk/m1 (weight 100/100, 0 session(s)"
    );
    assert_contains!(stdout, ": out, no session left");

    // Back: 50 answers in a row would take 50 checks; the load balancer's UP takes one.
    let mut undrain = Running::start(
        &s,
        "undrain",
        &["--wait", "--polls", "50", "--url", &url(&d)],
    );
    undrain.stderr_until("not taking new agents here yet");
    let said_up = Instant::now();
    lb.send_state(Some(UP));
    let out = undrain.finish(SOON);
    let checks = lb.answered(200, said_up);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert_contains!(stdout, "says UP for bk/m1");
    assert!(
        checks < 50,
        "undrain --wait returned after {checks} answers of 200 since the load balancer said UP: {stdout}"
    );
}

/// The daemon records what each load balancer says, and a malformed header as such.
#[test]
fn the_daemon_records_each_load_balancers_state_and_refuses_a_malformed_one() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let lb = LoadBalancer::start(polling(&d, 50));
    lb.send_state(Some(
        "UP 2/3; address=127.0.0.1; port=8140; name=puppet/compile01; node=lb1; weight=80/180; scur=3/7; qcur=1; throttle=40%",
    ));
    let answer = d.wait_for_json(SOON, "the state", |a| {
        a.pollers.iter().any(|p| !p.states.is_empty())
    });
    assert!(answer.listening_ms < 60_000);
    let pollers = answer.pollers;
    let p = pollers
        .iter()
        .find(|p| p.address.to_string() == LB)
        .unwrap();
    let state = &p.states[0];
    let seen = state.seen.as_ref().expect("read");
    assert_eq!(seen.word(), "UP 2/3");
    assert_eq!(
        (
            seen.backend.as_str(),
            seen.server.as_str(),
            seen.node.as_str()
        ),
        ("puppet", "compile01", "lb1")
    );
    assert_eq!(
        (
            seen.weight,
            seen.total_weight,
            seen.scur,
            seen.backend_scur,
            seen.qcur,
            seen.throttle
        ),
        (80, 180, 3, 7, 1, Some(40))
    );
    lb.send_state(Some(
        "UP; name=puppet/compile01; weight=80/180; scur=3/7; qcur=1; weight=1/1",
    ));
    let answer = d.wait_for_json(SOON, "the malformed state", |a| {
        a.pollers
            .iter()
            .any(|p| p.states.iter().any(|s| s.malformed.is_some()))
    });
    let pollers = answer.pollers;
    let p = pollers
        .iter()
        .find(|p| p.address.to_string() == LB)
        .unwrap();
    let state = p.states.iter().find(|s| s.malformed.is_some()).unwrap();
    assert_eq!(state.seen, None);
    assert_eq!(state.malformed.as_deref(), Some("weight given twice"));
}

/// Never drain the last server: refused with 77 and nothing written, unless --force, which
/// the record notes.
#[test]
fn drain_and_cycle_refuse_the_last_server_unless_forced() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let lb = LoadBalancer::start(polling(&d, 50));
    lb.send_state(Some(LAST));
    until_regular_or_polled(&d, &lb);
    let out = s.pmcheck("drain", &["--reason", "upgrade", "--url", &url(&d)]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{stderr}");
    assert_contains!(
        stderr,
        "refused: load balancer 127.0.0.2 (lb1) says m2 is the only server taking new agents in backend bk (weight 100 of 100)"
    );
    assert_contains!(stderr, "--force");
    assert!(record(&s).is_none(), "nothing written");

    let marker = s.state.path().join("ran");
    let touch = format!("touch {}", marker.display());
    // A cycle waits its turn, up to --max-wait, then refuses.
    let out = s.pmcheck(
        "cycle",
        &[
            "--max-wait",
            "1s",
            "--url",
            &url(&d),
            "--",
            "sh",
            "-c",
            &touch,
        ],
    );
    assert_eq!(out.status.code(), Some(77), "{}", text(&out.stderr));
    assert!(!marker.exists(), "the cycle ran its command");
    assert!(record(&s).is_none());
    // Each refusal is one event in the drain event log, naming the load balancer.
    let refused = logged_events(&s);
    assert_eq!(logged_actions(&s), ["refused", "refused"], "{refused:?}");
    for event in &refused {
        let reason = event["reason"].as_str().unwrap_or_default();
        assert_contains!(reason, "says m2 is the only server", "{refused:?}");
    }
    assert!(
        refused[0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("upgrade; ")
    );

    let out = s.pmcheck(
        "drain",
        &["--reason", "upgrade", "--force", "--url", &url(&d)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let forced = record(&s).unwrap()["holders"][0]["forced"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_contains!(forced, "says m2 is the only server");
    // Drained, forced, while the load balancer still says this is its last server: a new
    // drain without --force would be held there, so it is refused and the forced one stays.
    d.wait_for(SOON, "the drain", |r| r.body.starts_with("DRAINED"));
    let before = record(&s);
    let out = s.pmcheck("drain", &["--reason", "still upgrading", "--url", &url(&d)]);
    assert_eq!(out.status.code(), Some(77), "{}", text(&out.stderr));
    assert_eq!(record(&s), before, "the forced drain stays as it was");
    let out = s.pmcheck(
        "drain",
        &["--reason", "still upgrading", "--force", "--url", &url(&d)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(record(&s).unwrap()["holders"][0]["what"], "still upgrading");
}

/// This node, the only server taking traffic in its backend.
const LAST_M1: &str =
    "UP; address=127.0.0.1; port=8140; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0";
/// Drained, with no server left in the backend for agents.
const EMPTY: &str =
    "NOLB; address=127.0.0.1; port=8140; name=bk/m1; node=lb1; weight=100/0; scur=0/0; qcur=0";

/// Trust round two, defect 4: a drain takes effect only at a check whose header shows another
/// server taking agents. Held where the load balancer says this is the last server, or (a
/// young drain) that the backend has none left: the node keeps answering OK to that load
/// balancer and its agent check, and the operator's view says why; a forced drain is never
/// held.
#[test]
fn the_load_balancer_holds_a_drain_that_would_empty_its_backend() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let lb = LoadBalancer::start(Polling {
        agent: Some(d.agent_addr()),
        ..polling(&d, 50)
    });
    lb.send_state(Some(UP));
    until_regular_or_polled(&d, &lb);
    let out = s.pmcheck("drain", &["--reason", "first", "--url", &url(&d)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for (header, kind, why) in [
        (
            EMPTY,
            Held::EmptyBackend,
            "says no server takes new agents in backend bk (weight 100 of 0)",
        ),
        (
            LAST_M1,
            Held::LastServer,
            "says m1 is the only server taking new agents in backend bk (weight 100 of 100)",
        ),
    ] {
        lb.send_state(Some(header));
        let answer = d.wait_for_json(SOON, "the drain held", |a| held(a) == Some(kind));
        assert_eq!(
            answer.answer.verdict,
            pmcheck::health::verdict::Verdict::Drained
        );
        let since = Instant::now();
        while lb.answered(200, since) < 3 {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(lb.answered(404, since) + lb.answered(503, since), 0);
        assert!(
            lb.agent_lines(since)
                .iter()
                .all(|l| l.starts_with("up ready")),
            "{:?}",
            lb.agent_lines(since)
        );
        let status = text(&s.pmcheck("status", &["--url", &url(&d)]).stdout);
        assert_contains!(
            status,
            &format!(
                "held:   drain held: load balancer 127.0.0.2 (lb1) {why}; it ends once another server takes new agents in backend bk"
            )
        );
    }
    // Forced, it takes effect whatever the load balancer says.
    let out = s.pmcheck("drain", &["--force", "--url", &url(&d)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let since = Instant::now();
    while lb.answered(503, since) < 2 {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(held(&d.status()), None);
}

/// How the drain is held at the load balancer's server lines, if it is.
fn held(status: &pmcheck::protocol::Status<'_>) -> Option<Held> {
    (status.pollers.iter())
        .flat_map(|p| &p.states)
        .find_map(|s| s.held)
}

/// Two drains at once: the load balancer holds the second where the first went out (this node
/// is now its backend's last server, or the backend has none left). `drain` sees it in the
/// load balancer's own checks after it wrote the record, undoes its drain and refuses (77).
#[test]
fn a_drain_the_load_balancer_holds_is_undone_and_refused() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let lb = LoadBalancer::start(polling(&d, 700));
    lb.send_state(Some(UP));
    until_regular_or_polled(&d, &lb);
    let drain = Running::start(&s, "drain", &["--reason", "kernel", "--url", &url(&d)]);
    let record_path = s.state.path().join("drain");
    let deadline = Instant::now() + SOON;
    while !record_path.exists() {
        assert!(Instant::now() < deadline, "no drain record");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The other master went out at the same moment: the next check says none is left.
    lb.send_state(Some(EMPTY));
    let out = drain.finish(SOON);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{stderr}");
    assert_contains!(
        stderr,
        "refused: drain held: load balancer 127.0.0.2 (lb1) says no server takes new agents in backend bk"
    );
    assert_contains!(stderr, "This drain was undone");
    assert!(record(&s).is_none(), "the drain stayed");
    assert_eq!(logged_actions(&s), ["drain", "refused"]);
    d.wait_for(SOON, "OK", |r| r.body.starts_with("OK"));
}

/// Colliding cycles take turns: a cycle that finds this node the last server (another cycle
/// has the other master out) waits its turn within --max-wait instead of refusing, and runs
/// its command once the other master is back; one that is held after its drain waits too.
#[test]
fn a_cycle_waits_its_turn_while_its_node_is_the_last_server() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let lb = LoadBalancer::start(polling(&d, 50));
    lb.send_state(Some(LAST_M1));
    until_regular_or_polled(&d, &lb);
    let marker = s.state.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let mut run = Running::start(&s, "cycle", &["--url", &url(&d), "--", "sh", "-c", &touch]);
    run.stderr_until("of --max-wait 10m): load balancer 127.0.0.2 (lb1) says m1 is the only server taking new agents in backend bk (weight 100 of 100); it ends once another server takes new agents in backend bk");
    assert!(
        record(&s).is_none(),
        "a cycle waiting its turn wrote nothing"
    );
    // The other master is back: the cycle drains; the load balancer takes the node out.
    lb.send_state(Some(UP));
    d.wait_for(SOON, "the cycle's drain", |r| r.body.starts_with("DRAINED"));
    lb.send_state(Some(NOLB));
    let deadline = Instant::now() + SOON;
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the command did not run");
        std::thread::sleep(Duration::from_millis(20));
    }
    lb.send_state(Some(UP));
    let out = run.finish(SOON);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Never its turn: refused at --max-wait, nothing written.
    lb.send_state(Some(LAST_M1));
    d.wait_for_json(SOON, "the load balancer's new word", |a| {
        (a.pollers.iter()).any(|p| {
            (p.states.iter())
                .any(|s| s.last_ms_ago < 100 && s.seen.as_ref().is_some_and(|lb| lb.last_serving()))
        })
    });
    std::fs::remove_file(&marker).unwrap();
    let out = s.pmcheck(
        "cycle",
        &[
            "--max-wait",
            "1s",
            "--url",
            &url(&d),
            "--",
            "sh",
            "-c",
            &touch,
        ],
    );
    assert_eq!(out.status.code(), Some(77), "{}", text(&out.stderr));
    assert!(!marker.exists() && record(&s).is_none());
}

/// Without a daemon `drain` cannot check, and says so, but drains.
#[test]
fn drain_without_a_daemon_says_it_could_not_check_and_drains() {
    let s = Setup::new(Behavior::Running);
    let nobody = closed_port();
    let out = s.pmcheck("drain", &["--url", &format!("http://{nobody}/")]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stderr = text(&out.stderr);
    assert_contains!(
        stderr,
        "cannot check whether a load balancer says this node is the last server taking agents"
    );
    assert!(record(&s).is_some());
}

/// A key that is not the load balancers'.
const WRONG_KEY: &str = "00000000000000000000000000000000000000000000000000";

/// Trust round two, defect 2: anything else on the load balancer's host (a monitoring check,
/// a user's curl, a shared NAT address) polls from its address. Its headers, forged or
/// malformed, neither end a wait while the load balancer's own checks say it still sends
/// agents here, nor lift the guard once they say this is the last server.
#[test]
fn a_forged_state_from_the_load_balancers_own_address_ends_no_wait_and_lifts_no_guard() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let lb = LoadBalancer::start(polling(&d, 100));
    lb.send_state(Some(
        "UP; name=bk/m1; node=lb1; weight=100/200; scur=2/5; qcur=0",
    ));
    let forger = LoadBalancer::start(Polling {
        key: None,
        ..polling(&d, 30)
    });
    forger.send_state(Some(NOLB));
    let wrong = LoadBalancer::start(Polling {
        key: Some(WRONG_KEY),
        ..polling(&d, 30)
    });
    wrong.send_state(Some(NOLB));
    until_regular_or_polled(&d, &lb);
    let out = s.pmcheck(
        "drain",
        &[
            "--wait",
            "--polls",
            "2",
            "--max-wait",
            "3s",
            "--url",
            &url(&d),
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(75), "{stdout}{stderr}");
    assert_contains!(stderr, "says UP for bk/m1 (weight 100/200, 2 session(s)");
    let answer = d.status();
    let pollers = answer.pollers;
    let proofs: Vec<String> = (pollers.iter())
        .filter(|p| p.address.to_string() == LB)
        .map(|p| format!("{:?}", p.proof))
        .collect();
    assert_eq!(proofs.len(), 2, "{pollers:?}");
    assert!(proofs.contains(&"Key".to_owned()), "{proofs:?}");

    // The load balancer says this is the last server; the others send a malformed header
    // for that server line: the guard holds.
    assert_eq!(s.pmcheck("undrain", &[]).status.code(), Some(0));
    d.wait_for(SOON, "OK", |r| r.body.starts_with("OK"));
    lb.send_state(Some(LAST));
    let malformed = "UP; name=bk/m2; node=lb1; weight=1/2; scur=0/0; qcur=0; weight=1/1";
    forger.send_state(Some(malformed));
    wrong.send_state(Some(malformed));
    d.wait_for_json(SOON, "the last-server header and the malformed ones", |a| {
        let pollers = &a.pollers;
        let says = |proven: bool, what: &dyn Fn(&StateAnswer) -> bool| {
            (pollers.iter().filter(|p| p.proof.proven() == proven))
                .any(|p| (p.states.iter()).any(|s| s.last_ms_ago < 200 && what(s)))
        };
        says(true, &|s| {
            s.seen.as_ref().is_some_and(|lb| lb.server == "m2")
        }) && says(false, &|s| s.malformed.is_some())
    });
    let out = s.pmcheck("drain", &["--url", &url(&d)]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{stderr}");
    assert_contains!(
        stderr,
        "says m2 is the only server taking new agents in backend bk"
    );
    assert!(record(&s).is_none(), "nothing written");
}

/// Trust round two, defect 3: a poller that proves nothing (a loop of curl from 127.0.0.66)
/// makes no drain refuse, ends no wait early and holds none past the load balancer's own
/// timing, lets no cycle go, and `status` calls it unverified.
#[test]
fn a_poller_that_proves_nothing_moves_neither_the_guard_nor_the_waits_nor_a_cycle() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let liar = LoadBalancer::start(Polling {
        from: "127.0.0.66",
        key: None,
        ..polling(&d, 50)
    });
    liar.send_state(Some(LAST));
    d.wait_for_json(SOON, "the liar to be regular", |a| {
        (a.pollers.iter()).any(|p| p.address.to_string() == "127.0.0.66" && p.regular)
    });
    let out = s.pmcheck("status", &["--url", &url(&d)]);
    let stdout = text(&out.stdout);
    assert_contains!(
        stdout,
        "127.0.0.66: UNVERIFIED, sent no X-Pmcheck-Key: neither the waits nor the last-server guard believe it"
    );

    // "The last server" from nobody refuses nothing, and the drain says why it could not check.
    let out = s.pmcheck("drain", &["--url", &url(&d)]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_contains!(
        stderr,
        "cannot check whether a load balancer says this node is the last server taking agents: 127.0.0.66 (unverified: sent no X-Pmcheck-Key)"
    );
    assert_eq!(logged_actions(&s), ["drain"]);

    // "Still sending agents here" holds a wait only as long as HAProxy's own checks take
    // (--polls x --lb-interval), and ends none before. The liar is told OK in between: else
    // its run of DRAINED answers goes on from the first drain, and rightly counts as such.
    let undrained = Instant::now();
    assert_eq!(s.pmcheck("undrain", &[]).status.code(), Some(0));
    until_told(&liar, 200, undrained);
    liar.send_state(Some(
        "UP; name=bk/m1; node=lb1; weight=100/200; scur=5/9; qcur=0",
    ));
    let started = Instant::now();
    let out = drain_waiting(&s, &d, "500ms", "20s");
    let waited = started.elapsed();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(10),
        "{waited:?}: {stdout}"
    );
    assert_contains!(
        stdout,
        "127.0.0.66 (unverified: sent no X-Pmcheck-Key) told DRAINED for"
    );

    // "No server left in the backend" from nobody lets no cycle go: the command runs.
    let undrained = Instant::now();
    assert_eq!(s.pmcheck("undrain", &[]).status.code(), Some(0));
    until_told(&liar, 200, undrained);
    liar.send_state(Some(EMPTY));
    let marker = s.state.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let out = s.pmcheck(
        "cycle",
        &[
            "--polls",
            "2",
            "--lb-interval",
            "500ms",
            "--url",
            &url(&d),
            "--",
            "sh",
            "-c",
            &touch,
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(marker.exists(), "the cycle did not run its command");
}

/// Issue 46 (what a new operator met): a person's `curl` loop slowed every drain, as an unkeyed
/// HAProxy would. Issue 54 (part 4), decided by proof, not by the User-Agent a client claims:
/// once every address the key file binds proves itself as a load balancer that checks, a
/// poller that sends no key from elsewhere is none of them and is not waited for; one at a
/// load balancer's own address (a backend whose checks lack the key) still is, and so is
/// anything while a load balancer of the file does not prove itself, or without a key file.
/// The wait says what leaves it out (a key; `--allow` cannot leave out this host).
#[test]
fn a_curl_loop_slows_no_wait_once_every_key_proves_a_load_balancer() {
    let proven = curl_loop_wait(true, "127.0.0.67", true, ("2s", "20s"));
    let said = format!("{}{}", text(&proven.stdout), text(&proven.stderr));
    assert_eq!(proven.status.code(), Some(0), "{said}");
    assert_contains!(
        said,
        "127.0.0.67 (unverified: sent no X-Pmcheck-Key): every address the key file binds proves itself as a load balancer that checks now, and this one is none of them: not waited for"
    );
    // Waited for as long as 3 checks 4 s apart take: the wait gives up long before, however
    // long a loaded machine stalls the command between two answers.
    let beside = curl_loop_wait(true, LB, true, GIVES_UP);
    let stderr = text(&beside.stderr);
    assert_eq!(beside.status.code(), Some(75), "{stderr}");
    assert_contains!(
        stderr,
        "it names itself curl: a poller that proves nothing is waited for as a load balancer would be: this one polls from an address the key file binds, or sends a key not in it"
    );
    let keyed = curl_loop_wait(true, "127.0.0.67", false, GIVES_UP);
    let stderr = text(&keyed.stderr);
    assert_eq!(keyed.status.code(), Some(75), "{stderr}");
    assert_contains!(
        stderr,
        "it names itself curl: a poller that proves nothing is waited for as a load balancer would be until every address the key file binds proves itself (not yet: 127.0.0.2 (line 1))"
    );
    let unkeyed = curl_loop_wait(false, "127.0.0.67", false, GIVES_UP);
    let stderr = text(&unkeyed.stderr);
    assert_eq!(unkeyed.status.code(), Some(75), "{stderr}");
    assert_contains!(stderr, "127.0.0.67 (unverified");
    assert_contains!(
        stderr,
        "it names itself curl: a poller that proves nothing is waited for as a load balancer would be until every load balancer proves itself with a key (--lb-key-file)"
    );
}

/// `--lb-interval` and `--max-wait` of a wait that gives up: 3 checks 4 s apart need 12 s.
const GIVES_UP: (&str, &str) = ("4s", "1s");

/// `drain --wait` (3 checks `lb_interval` apart, within `max_wait`) while a curl loop polls from
/// `from`, on a daemon whose key file binds the kit's key to 127.0.0.2 (`keyed`) or that
/// believes 127.0.0.2 by its address, with a load balancer polling from there with the key
/// when `lb`.
fn curl_loop_wait(
    keyed: bool,
    from: &'static str,
    lb: bool,
    (lb_interval, max_wait): (&str, &str),
) -> std::process::Output {
    use std::io::{Read as _, Write as _};
    let s = Setup::new(Behavior::Running);
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("lb-key");
    std::fs::write(&key, format!("{} {LB}\n", common::lb::LB_KEY)).unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
    let trust = match keyed {
        true => ["--lb-key-file", key.to_str().unwrap()],
        false => ["--lb-address", "127.0.0.2/32"],
    };
    let mut args = vec!["--agent-listen", "127.0.0.1:0", "--interval", "100ms"];
    args.extend(trust);
    let d = Daemon::start(&s.args(&args));
    let _lb = lb.then(|| {
        let lb = LoadBalancer::start(polling(&d, 300));
        until_regular(&d);
        lb
    });
    let stop = Arc::new(AtomicBool::new(false));
    let looping = {
        let (stop, to) = (Arc::clone(&stop), d.addr);
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if let Ok(mut c) = common::http::connect_from(from, to, SOON) {
                    let asked = "GET / HTTP/1.1\r\nHost: m1\r\nUser-Agent: curl/8.14.1\r\nConnection: close\r\n\r\n";
                    let _ = c.write_all(asked.as_bytes());
                    let _ = c.read_to_end(&mut Vec::new());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    d.wait_for_json(SOON, "the curl loop to be regular", |a| {
        (a.pollers.iter()).any(|p| p.address.to_string() == from && p.regular && !p.proof.proven())
    });
    let out = drain_waiting(&s, &d, lb_interval, max_wait);
    stop.store(true, Ordering::SeqCst);
    let _ = looping.join();
    out
}

/// `pmcheck drain --wait` for 3 checks `lb_interval` apart, within `max_wait`.
fn drain_waiting(s: &Setup, d: &Daemon, lb_interval: &str, max_wait: &str) -> std::process::Output {
    let url = url(d);
    let args = [
        "--wait",
        "--polls",
        "3",
        "--lb-interval",
        lb_interval,
        "--max-wait",
        max_wait,
    ];
    s.pmcheck("drain", &[&args[..], &["--url", &url]].concat())
}

/// The audit at 4743d29: two HAProxy processes at one address, with one key and one `node`,
/// were one view, and each one's agent check followed the other's answers: the one whose
/// backend has no other server emptied. Their headers of the line flip between two views of
/// the backend: a drain is held there whatever either says (the one that had taken the node
/// out is answered OK again), `drain` refuses (77) naming them, and `status` says what to
/// change.
#[test]
fn two_load_balancers_answering_as_one_hold_every_drain_and_are_named() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let beside = LoadBalancer::start(polling(&d, 300));
    beside.send_state(Some(UP));
    until_regular(&d);
    let out = s.pmcheck("drain", &["--reason", "kernel", "--url", &url(&d)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    until_told(&beside, 503, Instant::now());
    // The second HAProxy, whose backend has only this node, checks from the same address.
    let since = Instant::now();
    let alone = LoadBalancer::start(polling(&d, 300));
    alone.send_state(Some(LAST_M1));
    d.wait_for_json(SOON, "the line held as two views", |a| {
        (a.pollers.iter())
            .flat_map(|p| &p.states)
            .any(|s| s.holds == Some(Held::TwoViews))
    });
    until_told(&beside, 200, Instant::now());
    assert_eq!(
        alone.answered(503, since),
        0,
        "the lone backend's node went out"
    );
    let status = text(&s.pmcheck("status", &["--url", &url(&d)]).stdout);
    assert_contains!(
        status,
        "two load balancers answer as one for bk/m1 (their checks of it, with one key, disagree"
    );
    assert_contains!(
        status,
        "it ends once each load balancer proves itself with its own key"
    );
    // Undrained, the guard refuses a new drain, naming them.
    assert!(s.pmcheck("undrain", &["--url", &url(&d)]).status.success());
    let out = s.pmcheck("drain", &["--reason", "kernel", "--url", &url(&d)]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{stderr}");
    assert_contains!(stderr, "two load balancers answer as one for bk/m1");
    assert_contains!(stderr, "give each HAProxy its own key line");
    assert!(record(&s).is_none(), "nothing was written");
}
