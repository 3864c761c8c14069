//! One drain rule, decided by the daemon per server line and asked by every command: the
//! defects a hostile audit found at c8a278e, each through the real commands, against the stub
//! of Puppet Server and a proven load balancer played by the test (`tests/common/lb.rs`).
//!
//! 1. Draining a held node again never empties its backend.
//! 2. An emergency drain is never held silently: refused, with `--force` as the way through.
//! 3. One backend's answer never steers another's agent line.
//! 4. `on-stop` returns at once for the last server, and a header no longer sent holds nothing.
//! 5. The stop guard starts when it cannot write (`tests/stop.rs` too).
//! 6. A restart never shows DOWN.
//! 7. A cycle waiting its turn says so every 10 s.

mod common;

use std::time::{Duration, Instant};

use common::lb::{LoadBalancer, Polling};
use common::operator::*;
use common::*;
use pmcheck::health::hold::Held;
use pmcheck::responder::status::Status;

/// This node (`m1`) and another server as heavy take new agents in backend `bk`.
const UP: &str =
    "UP; address=127.0.0.1; port=8140; name=bk/m1; node=lb1; weight=100/200; scur=0/0; qcur=0";
/// This node is the only server taking new agents in backend `bk`.
const LAST: &str =
    "UP; address=127.0.0.1; port=8140; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0";
/// This node out (NOLB), and no other server left in backend `bk`.
const EMPTY: &str =
    "NOLB; address=127.0.0.1; port=8140; name=bk/m1; node=lb1; weight=100/0; scur=0/0; qcur=0";

/// A load balancer checking `d` every 50 ms (HTTP and agent), its agent checks naming `line`.
fn load_balancer(d: &Daemon, header: &str, line: &'static str) -> LoadBalancer {
    let lb = LoadBalancer::start(Polling {
        every: Duration::from_millis(50),
        line: Some(line),
        ..Polling::new(d.addr, Some(d.agent_addr()))
    });
    lb.send_state(Some(header));
    lb
}

/// Waits until the daemon's latest check of `line` (`BACKEND/SERVER`) came with `header`'s
/// word: what it says now is what the load balancer said last.
fn heard(d: &Daemon, line: &str, header: &str) -> Status<'static> {
    let (backend, server) = line.split_once('/').unwrap();
    let want = pmcheck::health::lb_state::parse(header.as_bytes()).unwrap();
    d.wait_for_json(SOON, &format!("{line} saying {header}"), |a| {
        (a.pollers.iter()).flat_map(|p| &p.states).any(|s| {
            s.last_ms_ago < 100
                && s.seen.as_ref().is_some_and(|lb| {
                    lb.backend == backend
                        && lb.server == server
                        && lb.total_weight == want.total_weight
                })
        })
    })
}

/// How the drain is held at `line`, if the daemon's latest check there held it.
fn held_at(status: &Status<'_>, line: &str) -> Option<Held> {
    (status.pollers.iter())
        .flat_map(|p| &p.states)
        .find(|s| {
            s.seen
                .as_ref()
                .is_some_and(|lb| format!("{}/{}", lb.backend, lb.server) == line)
        })
        .and_then(|s| s.held)
}

/// A drain written while another server took agents, then held where the load balancer came
/// to say this node is the last server (the other master left): what the audit started from.
fn held_drain(s: &Setup, d: &Daemon, lb: &LoadBalancer) {
    heard(d, "bk/m1", UP);
    let out = s.pmcheck("drain", &["--reason", "upgrade", "--url", &url(d)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_contains!(
        text(&out.stdout),
        "out: load balancer 127.0.0.2 (lb1) answered DRAINED for bk/m1"
    );
    the_others_leave(d, lb, "bk/m1", EMPTY, LAST);
}

/// The other servers of `line`'s backend leave, as HAProxy tells it: this node, out, sees the
/// backend empty (`empty`), the drain is held and the node taken back, and from then on it is
/// the last server (`last`).
fn the_others_leave(d: &Daemon, lb: &LoadBalancer, line: &str, empty: &str, last: &str) {
    lb.send_state(Some(empty));
    d.wait_for_json(SOON, "held: the backend empty", |a| {
        held_at(a, line) == Some(Held::EmptyBackend)
    });
    lb.send_state(Some(last));
    d.wait_for_json(SOON, "held: the last server", |a| {
        held_at(a, line) == Some(Held::LastServer)
    });
}

/// The load balancer's HTTP checks since `since` were all answered 200, and at least `n`.
fn only_ok(lb: &LoadBalancer, since: Instant, n: usize) {
    let deadline = Instant::now() + SOON;
    while lb.answered(200, since) < n {
        assert!(Instant::now() < deadline, "fewer than {n} checks");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        lb.answered(404, since) + lb.answered(503, since),
        0,
        "taken out"
    );
    let agent = lb.agent_lines(since);
    assert!(agent.iter().all(|l| l.starts_with("up ready")), "{agent:?}");
}

/// Defect 1: a plain `drain` on a node whose drain is held (it is its backend's last server)
/// is refused, writes nothing and leaves the held drain as it was; `drain --wait` too. At
/// c8a278e it wrote an unguarded drain over the held one, which emptied the backend.
#[test]
fn draining_a_held_node_again_never_empties_its_backend() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let lb = load_balancer(&d, UP, "bk/m1");
    held_drain(&s, &d, &lb);
    let before = record(&s);
    for wait in [false, true] {
        let mut args = vec!["--reason", "upgrade, still", "--url"];
        let url = url(&d);
        args.push(&url);
        if wait {
            args.push("--wait");
        }
        let out = s.pmcheck("drain", &args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(77), "{stderr}");
        assert_contains!(
            stderr,
            "refused: load balancer 127.0.0.2 (lb1) says m1 is the only server taking new agents in backend bk (weight 100 of 100)"
        );
        assert_contains!(stderr, "pass --force");
        assert_eq!(record(&s), before, "the held drain stays as it was");
    }
    only_ok(&lb, Instant::now(), 20);
    let status = text(&s.pmcheck("status", &["--url", &url(&d)]).stdout);
    assert_contains!(
        status,
        "held:   drain held: load balancer 127.0.0.2 (lb1) says m1 is the only server"
    );
    assert_contains!(status, "do not stop Puppet Server");
}

/// Defect 2: an emergency drain beside a held drain is refused loudly (77, naming the load
/// balancer, the backend and `--force`), never written to be held in silence; `--force`
/// takes the node out at once, and says what it went past.
#[test]
fn an_emergency_drain_is_refused_or_forced_never_held_in_silence() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let lb = load_balancer(&d, UP, "bk/m1");
    held_drain(&s, &d, &lb);
    let out = s.pmcheck(
        "drain",
        &["--reason", "EMERGENCY: disk failing", "--url", &url(&d)],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{stderr}");
    assert_contains!(
        stderr,
        "says m1 is the only server taking new agents in backend bk"
    );
    assert!(
        !text(&out.stdout).contains("answers DRAINED"),
        "said it drained: {out:?}"
    );
    let out = s.pmcheck(
        "drain",
        &[
            "--reason",
            "EMERGENCY: disk failing",
            "--force",
            "--url",
            &url(&d),
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert_contains!(
        stdout,
        "forced: --force past: load balancer 127.0.0.2 (lb1) says m1 is the only server"
    );
    let since = Instant::now();
    let deadline = since + SOON;
    while lb.answered(503, since) < 3 || lb.agent_lines(since).len() < 3 {
        assert!(
            Instant::now() < deadline,
            "the forced drain did not take the node out"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let agent = lb.agent_lines(since);
    assert!(
        agent[1..]
            .iter()
            .all(|l| l.starts_with("up drain #DRAINED - EMERGENCY")),
        "{agent:?}"
    );
    assert_eq!(held_at(&d.status(), "bk/m1"), None);
}

/// Defect 3: one load balancer checks this node in two backends; the drain is held in `bk1`,
/// where the node became the last server, and out in `bk2`. Each server line's HTTP answer and
/// agent line follow that line's decision (the agent check names its line in `agent-send`);
/// one that names none gets the most careful line, held. At c8a278e the agent check followed
/// whichever backend's HTTP check came last.
#[test]
fn one_backend_never_steers_another() {
    const BK1: &str =
        "UP; address=127.0.0.1; port=8140; name=bk1/m1; node=lb1; weight=100/200; scur=0/0; qcur=0";
    const BK1_LAST: &str =
        "UP; address=127.0.0.1; port=8140; name=bk1/m1; node=lb1; weight=100/100; scur=0/0; qcur=0";
    const BK1_EMPTY: &str =
        "NOLB; address=127.0.0.1; port=8140; name=bk1/m1; node=lb1; weight=100/0; scur=0/0; qcur=0";
    const BK2: &str =
        "UP; address=127.0.0.1; port=8140; name=bk2/m1; node=lb1; weight=100/200; scur=0/0; qcur=0";
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let bk1 = load_balancer(&d, BK1, "bk1/m1");
    let bk2 = load_balancer(&d, BK2, "bk2/m1");
    let unnamed = LoadBalancer::start(Polling {
        every: Duration::from_millis(200),
        ..Polling::new(d.addr, Some(d.agent_addr()))
    });
    heard(&d, "bk1/m1", BK1);
    heard(&d, "bk2/m1", BK2);
    let out = s.pmcheck("drain", &["--reason", "upgrade", "--url", &url(&d)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    the_others_leave(&d, &bk1, "bk1/m1", BK1_EMPTY, BK1_LAST);
    d.wait_for_json(SOON, "held in bk1 only", |a| {
        held_at(a, "bk1/m1") == Some(Held::LastServer) && held_at(a, "bk2/m1").is_none()
    });
    let since = Instant::now();
    only_ok(&bk1, since, 20);
    let deadline = Instant::now() + SOON;
    while bk2.agent_lines(since).len() < 20 || unnamed.agent_lines(since).len() < 3 {
        assert!(Instant::now() < deadline, "too few agent checks");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        bk2.answered(200, since),
        0,
        "bk2's HTTP check was answered OK"
    );
    let agent = bk2.agent_lines(since);
    assert!(
        agent.iter().all(|l| l.starts_with("up drain #DRAINED")),
        "{agent:?}"
    );
    let careful = unnamed.agent_lines(since);
    assert!(
        careful.iter().all(|l| l.starts_with("up ready")),
        "{careful:?}"
    );
    // What the daemon says of each line.
    let status = d.status();
    let line = |name: &str| {
        (status.pollers.iter())
            .flat_map(|p| &p.states)
            .find(|s| {
                s.seen
                    .as_ref()
                    .is_some_and(|lb| format!("{}/{}", lb.backend, lb.server) == name)
            })
            .cloned()
            .unwrap()
    };
    let (one, two) = (line("bk1/m1"), line("bk2/m1"));
    assert_eq!(
        (one.held, one.holds),
        (Some(Held::LastServer), Some(Held::LastServer))
    );
    assert_eq!(
        (two.held, two.holds, two.told),
        (None, None, pmcheck::health::verdict::Verdict::Drained)
    );
    assert!(
        one.agent
            .is_some_and(|a| a.told == pmcheck::health::verdict::Verdict::Ok)
    );
    assert!(
        two.agent
            .is_some_and(|a| a.told == pmcheck::health::verdict::Verdict::Drained)
    );
}

/// Defect 4, first half: `on-stop` on a node whose drain is held for the last server returns
/// at once, as the README says; at c8a278e it waited its whole `--max-wait`.
#[test]
fn on_stop_returns_at_once_where_the_drain_is_held_for_the_last_server() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let lb = load_balancer(&d, UP, "bk/m1");
    held_drain(&s, &d, &lb);
    let started = Instant::now();
    let out = s.pmcheck("on-stop", &["--url", &url(&d), "--max-wait", "60s"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "waited {:?}",
        started.elapsed()
    );
    assert_contains!(
        stderr,
        "is the only server taking new agents in backend bk (weight 100 of 100): not waiting; puppetserver.service stops now"
    );
}

/// Defect 4, second half: a server line whose checks stopped (a backend taken out of
/// HAProxy's configuration, a server in MAINT) holds nothing once it is silent for three of
/// its intervals (5 s at least): its last header, which said this node was the last server,
/// no longer refuses a drain. At c8a278e a header up to 60 s old did.
#[test]
fn a_server_line_no_longer_checked_holds_nothing() {
    const BK2_LAST: &str =
        "UP; address=127.0.0.1; port=8140; name=bk2/m1; node=lb1; weight=100/100; scur=0/0; qcur=0";
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let _bk = load_balancer(&d, UP, "bk/m1");
    let bk2 = load_balancer(&d, BK2_LAST, "bk2/m1");
    heard(&d, "bk2/m1", BK2_LAST);
    heard(&d, "bk/m1", UP);
    let out = s.pmcheck("drain", &["--url", &url(&d)]);
    assert_eq!(out.status.code(), Some(77), "{}", text(&out.stderr));
    drop(bk2);
    d.wait_for_json(Duration::from_secs(15), "bk2 no longer checked", |a| {
        (a.pollers.iter())
            .flat_map(|p| &p.states)
            .any(|s| !s.polling && s.seen.as_ref().is_some_and(|lb| lb.backend == "bk2"))
    });
    let out = s.pmcheck("drain", &["--url", &url(&d)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_contains!(
        text(&out.stdout),
        "out: load balancer 127.0.0.2 (lb1) answered DRAINED for bk/m1"
    );
}

/// Defect 6: a stop's hold is let go of by the daemon itself on the first probe that finds
/// the Puppet Server started since the stop healthy: the load balancer sees the drain (404)
/// while Puppet Server is down and starting, then OK, never a 503 (DOWN); `on-start` only
/// tidies the record afterwards.
#[test]
fn a_restart_never_shows_down() {
    let mut s = Setup::new(Behavior::Running);
    s.stub
        .seen
        .jvm_start
        .store(1_000, std::sync::atomic::Ordering::SeqCst);
    let d = s.daemon(&["--drained-status", "404", "--agent-listen", "127.0.0.1:0"]);
    d.wait_for(SOON, "OK", is("OK"));
    let lb = LoadBalancer::start(Polling {
        every: Duration::from_millis(20),
        ..Polling::new(d.addr, None)
    });
    let out = s.pmcheck("on-stop", &["--url", &url(&d), "--max-wait", "1s"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    d.wait_for(SOON, "DRAINED by the stop", is("DRAINED"));
    let since = Instant::now();
    let addr = s.stub.addr;
    let placeholder = Stub::start(&s.ca, &[CERTNAME], Behavior::Hang);
    drop(std::mem::replace(&mut s.stub, placeholder));
    d.wait_for(SOON, "refused, still drained", |a| {
        a.body.starts_with("DRAINED") && a.body.contains("refused")
    });
    // Back, starting: its pool empty, then ready; a JVM started after the stop.
    let empty = Behavior::Pool(pool(2, 0, 0, 0, ":not-in-use"));
    let back = Stub::start_on(addr, &s.ca, &s.ca, &[CERTNAME], empty);
    back.seen.jvm_start.store(
        u64::try_from(std::time::UNIX_EPOCH.elapsed().unwrap().as_millis()).unwrap(),
        std::sync::atomic::Ordering::SeqCst,
    );
    d.wait_for(SOON, "starting, still drained", |a| {
        a.body.starts_with("DRAINED") && a.body.contains("not ready")
    });
    back.set(Behavior::Running);
    d.wait_for(SOON, "OK on the first fresh probe", is("OK"));
    let ok_at = Instant::now();
    while lb.answered(200, ok_at) < 3 {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(lb.answered(503, since), 0, "DOWN during the restart");
    assert!(lb.answered(404, since) > 0, "the drain was not seen");
    assert_eq!(
        record(&s).unwrap()["holders"][0]["kind"],
        "stop",
        "the daemon let go of the hold, the record still has it"
    );
    let out = s.pmcheck("on-start", &["--url", &url(&d)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(record(&s).is_none(), "on-start tidies the record");
    drop(back);
}

/// Defect 7: a cycle whose node is the last server waits its turn saying so every 10 s,
/// naming the load balancer and the backend that hold the turn and what ends the wait, then
/// refuses (77) at `--max-wait`, having written nothing.
#[test]
fn a_cycle_waiting_its_turn_says_so_every_ten_seconds() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let _lb = load_balancer(&d, LAST, "bk/m1");
    heard(&d, "bk/m1", LAST);
    let started = Instant::now();
    let out = s.pmcheck(
        "cycle",
        &["--max-wait", "21s", "--url", &url(&d), "--", "true"],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{stderr}");
    assert!(started.elapsed() >= Duration::from_secs(21));
    let waiting: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("pmcheck cycle: waiting its turn ("))
        .collect();
    assert!(waiting.len() >= 3, "a line every 10 s: {stderr}");
    for line in &waiting {
        assert_contains!(
            line,
            "of --max-wait 21s): load balancer 127.0.0.2 (lb1) says m1 is the only server taking new agents in backend bk (weight 100 of 100); it ends once another server takes new agents in backend bk"
        );
    }
    assert_contains!(stderr, "refused: its turn did not come within --max-wait");
    assert!(
        record(&s).is_none(),
        "a cycle that never had its turn wrote nothing"
    );
}
