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
//!
//! And what the review of the fix found: a daemon that runs but does not answer the guard
//! never gets a drain written that no load balancer could hold.

mod common;

use std::time::{Duration, Instant};

use common::lb::{LoadBalancer, Polling};
use common::operator::*;
use common::*;
use pmcheck::health::hold::Held;
use pmcheck::protocol::Status;
use pmcheck::responder::http::Rendered;

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

/// The rule once, as a table, in the daemon's own decision (in process, every combination):
/// each kind of holder, checked or not, forced or not, and a hand-written record and a plain
/// file; a header that says this node is its backend's last server, that the backend is empty
/// (this node out for a moment, or for long, as the daemon saw it or, for a line it has not
/// seen, as the record says), or that another server takes agents; a proven
/// load balancer and an unproven one; two backends with this node last in one only; a server
/// line whose header is older than the silence limit. What the HTTP check and the agent check
/// naming each line are answered.
#[test]
fn the_rule_for_every_holder_header_age_proof_and_backend() {
    use pmcheck::drain::holders::{Holder, Kind, Process};
    use pmcheck::drain::record::{Drain, DrainRecord, DrainState};
    use pmcheck::health::decision::Rules;
    use pmcheck::health::verdict::Verdict;
    use pmcheck::health::weight::Rejoin;
    use pmcheck::puppet::report::{ProbeOutcome, ProbeReport};
    use pmcheck::responder::agent::Sent;
    use pmcheck::responder::node::{Feeds, Node};
    use pmcheck::responder::pollers::{Poll, Via};
    use pmcheck::settings::lb_proof::{LbProof, Proof};
    use std::net::IpAddr;
    use std::sync::Arc;
    use tokio::sync::watch;

    const KEY: &str = common::lb::LB_KEY;
    let lb: IpAddr = "10.0.0.5".parse().unwrap();
    let proof = LbProof::load(Some(&common::lb::lb_key_file()), Vec::new()).unwrap();
    let holder_since = |kind: Kind, checked: bool, forced: bool, ago: u64| {
        let since = std::time::SystemTime::now() - Duration::from_secs(ago);
        let mut h = Holder::drain("r".into(), None, since);
        h.kind = kind;
        h.checked = checked;
        h.forced = forced.then(|| "--force".into());
        if kind == Kind::Cycle {
            h.process = Process::this();
        }
        h
    };
    let holder = |kind: Kind, checked: bool, forced: bool| holder_since(kind, checked, forced, 0);
    let record = |holders: Vec<Holder>| {
        let record = DrainRecord::held_by(holders).unwrap();
        Drain::parse(&serde_json::to_vec(&record).unwrap())
    };
    // (the drain, whether every holder may be held, whether it is young by the record)
    let mut drains: Vec<(String, Drain, bool, bool)> = Vec::new();
    for kind in [Kind::Drain, Kind::Cycle, Kind::StoppedCycle, Kind::Stop] {
        for (checked, forced) in [(true, false), (false, false), (true, true)] {
            let may = checked && !forced && matches!(kind, Kind::Drain | Kind::Cycle);
            let name = format!("{kind:?} checked={checked} forced={forced}");
            drains.push((name, record(vec![holder(kind, checked, forced)]), may, true));
        }
    }
    let both = record(vec![
        holder(Kind::Drain, true, false),
        holder(Kind::Cycle, true, false),
    ]);
    drains.push(("drain and cycle, both checked".into(), both, true, true));
    let old = record(vec![holder_since(Kind::Drain, true, false, 7200)]);
    drains.push(("a checked drain of 2 h ago".into(), old, true, false));
    let mixed = record(vec![
        holder(Kind::Drain, true, false),
        holder(Kind::Drain, false, false),
    ]);
    drains.push((
        "a checked drain beside an unchecked one".into(),
        mixed,
        false,
        true,
    ));
    let hand = br#"{"reason":"r","by":"bob","since":"2026-11-27T08:00:00Z"}"#;
    drains.push(("hand-written".into(), Drain::parse(hand), false, false));
    drains.push((
        "plain text".into(),
        Drain::parse(b"upgrading, back at noon\n"),
        false,
        true,
    ));

    let header = |backend: &str, word: &str, total: u32| {
        format!("{word}; name={backend}/m1; node=lb1; weight=100/{total}; scur=0/0; qcur=0")
    };
    for (name, drain, may, young) in drains {
        let report = ProbeReport::new(ProbeOutcome::Healthy(None), Duration::from_millis(3), None);
        let (_p, latest) = watch::channel(Some(Arc::new(report)));
        let (_d, drains_rx) = watch::channel(Arc::new(DrainState::Drained(drain)));
        let (_r, rejoin) = watch::channel(Rejoin::Steady);
        let node = Node::new(
            Feeds {
                drain: drains_rx,
                latest,
                rejoin,
            },
            Rules::ONCE,
            proof.clone(),
            &pmcheck::drain::file::DrainFile::new(std::path::Path::new("/nonexistent")),
            None,
            false,
        );
        // A daemon that just started knows no check of this load balancer: its agent check
        // neither puts a drain that may be held in force nor lifts it.
        let sent = Sent::of(format!("bk/m1 {KEY}\n").as_bytes());
        let fresh = node.agent_line(lb, &sent).0;
        let want = if may {
            "#DRAINED - no HTTP check of bk/m1 by load balancer"
        } else {
            "up drain #DRAINED"
        };
        assert!(fresh.starts_with(want), "{name}: a fresh daemon: {fresh}");
        let whose = node.proof().judge(lb, Some(KEY.as_bytes()));
        let now = Instant::now();
        // bk-old: this node has been out there for 70 s (a DRAINED run), its header then
        // saying the backend is empty; bk-stale: a line last heard 10 s ago, saying last.
        for s in (2..=70).rev() {
            let empty = header("bk-old", "NOLB", 0);
            node.pollers.record(
                Poll {
                    address: lb,
                    via: Via::Http,
                    verdict: Verdict::Drained,
                    state: Some(empty.as_bytes()),
                    held: None,
                    line: None,
                    client: None,
                    proof: Proof::Key,
                    key_line: whose.key_line,
                },
                now - Duration::from_secs(s),
            );
        }
        let stale = header("bk-stale", "UP", 100);
        for s in [12, 11, 10] {
            node.pollers.record(
                Poll {
                    address: lb,
                    via: Via::Http,
                    verdict: Verdict::Ok,
                    state: Some(stale.as_bytes()),
                    held: None,
                    line: None,
                    client: None,
                    proof: Proof::Key,
                    key_line: whose.key_line,
                },
                now - Duration::from_secs(s),
            );
        }
        let check = |backend: &str, word: &str, total: u32, key: Option<&str>| {
            let mut request = hyper::Request::options("/")
                .header("x-haproxy-server-state", header(backend, word, total));
            if let Some(key) = key {
                request = request.header("x-pmcheck-key", key);
            }
            let request = request.body(()).unwrap();
            node.answer(&request, lb, &mut Rendered::default())
                .status()
                .as_u16()
        };
        let agent = |line: &str| {
            let sent = Sent::of(format!("{line} {KEY}\n").as_bytes());
            node.agent_line(lb, &sent).0
        };
        let held = |status: u16| status == 200;
        // (what, HTTP answered 200, should it be held)
        let table = [
            (
                "last server, proven",
                held(check("bk", "UP", 100, Some(KEY))),
                may,
            ),
            (
                "empty, a line not seen before, proven",
                held(check("bk-new", "NOLB", 0, Some(KEY))),
                may && young,
            ),
            (
                "empty for 70 s, proven",
                held(check("bk-old", "NOLB", 0, Some(KEY))),
                false,
            ),
            (
                "another server, proven",
                held(check("bk2", "UP", 200, Some(KEY))),
                false,
            ),
            (
                "last server, no key",
                held(check("bk3", "UP", 100, None)),
                false,
            ),
            (
                "last server, wrong key",
                held(check("bk4", "UP", 100, Some(&"f".repeat(48)))),
                false,
            ),
        ];
        for (what, got, want) in table {
            assert_eq!(got, want, "{name}: {what}");
        }
        // The agent checks, each naming its line. While bk's own agent check is not heard, an
        // agent check naming another line might be bk's with a copied `agent-send`: it follows
        // the most careful line, bk, held (the audit at 4743d29 emptied bk that way).
        let say = |line: &str| agent(line).starts_with("up ready");
        assert_eq!(
            say("bk2/m1"),
            may,
            "{name}: agent of bk2 before bk's is heard"
        );
        // Heard on every held line (bk, and bk-new): each follows its own line, bk held where
        // its HTTP check was, bk2 out.
        for held_line in ["bk-new/m1", "bk/m1"] {
            let sent = Sent::of(format!("{held_line} {KEY}\n").as_bytes());
            let (line, told) = node.agent_line(lb, &sent);
            node.agent_told(told);
            assert_eq!(
                line.starts_with("up ready"),
                may,
                "{name}: agent of {held_line}: {line}"
            );
        }
        assert!(
            !say("bk2/m1"),
            "{name}: agent of bk2, out: {}",
            agent("bk2/m1")
        );
        assert!(!say("bk-old/m1"), "{name}: agent of bk-old");
        // A line whose HTTP check is not seen (never, or not for 10 s) while others are: it
        // names no line this load balancer checks, and follows the most careful, bk.
        for unseen in ["nope/m1", "bk-stale/m1"] {
            assert_eq!(
                say(unseen),
                may,
                "{name}: agent of {unseen}: {}",
                agent(unseen)
            );
        }
        // One that names no line follows the most careful: bk, held.
        let unnamed = node
            .agent_line(lb, &Sent::of(format!("{KEY}\n").as_bytes()))
            .0;
        assert_eq!(
            unnamed.starts_with("up ready"),
            may,
            "{name}: agent naming no line: {unnamed}"
        );
        // Without the key (no `agent-send`, as a backend written before it was shipped): it
        // proves nothing, and still never takes out a node held at its address.
        let unproven = node.agent_line(lb, &Sent::of(b"bk/m1\n")).0;
        assert_eq!(
            unproven.starts_with("up ready"),
            may,
            "{name}: an agent check without the key: {unproven}"
        );
        let elsewhere: IpAddr = "10.0.0.9".parse().unwrap();
        // From another address, with nothing held there: it still proves nothing, and never
        // takes the node out (no admin word: the HTTP check does).
        let unproven = node.agent_line(elsewhere, &Sent::of(b"bk/m1\n")).0;
        assert!(
            unproven.starts_with('#') && unproven.contains("cannot be told to its server line"),
            "{name}: an agent check without the key from another address: {unproven}"
        );
    }
}

/// A server that answers every request, but not like pmcheck, until the returned flag is set;
/// the thread says how many requests it answered.
fn not_pmcheck() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<usize>,
) {
    answering("text/plain", "hi\n".to_owned())
}

/// A server that answers every request with `body` as `content_type`, until the returned flag
/// is set; the thread says how many requests it answered.
fn answering(
    content_type: &'static str,
    body: String,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<usize>,
) {
    use std::io::{Read as _, Write as _};
    use std::sync::atomic::{AtomicBool, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let stopping = std::sync::Arc::clone(&stop);
    let served = std::thread::spawn(move || {
        let mut served = 0;
        while !stopping.load(Ordering::Relaxed) {
            let Ok((mut stream, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            stream.set_nonblocking(false).unwrap();
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
            served += 1;
        }
        served
    });
    (addr, stop, served)
}

/// A daemon that runs but does not answer the guard may still answer the load balancers: a
/// drain written unchecked would be one they never hold. It is asked eight times and refused
/// (69), nothing written; `--force` drains without the check. Nothing listening at all is no
/// daemon: that drain is written unchecked (`tests/waits.rs`).
#[test]
fn a_daemon_that_does_not_answer_the_guard_gets_no_unchecked_drain() {
    let s = Setup::new(Behavior::Running);
    let (addr, stop, served) = not_pmcheck();
    let url = format!("http://{addr}/");
    let out = s.pmcheck("drain", &["--reason", "upgrade", "--url", &url]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert_contains!(
        stderr,
        &format!("refused: {url} does not answer like pmcheck")
    );
    assert_contains!(stderr, "asked 8 times");
    assert_contains!(stderr, "or pass --force to drain without the check");
    assert!(record(&s).is_none(), "nothing written");
    let out = s.pmcheck("drain", &["--reason", "upgrade", "--force", "--url", &url]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_contains!(stderr, "the record is written unchecked");
    let written = record(&s).expect("drained");
    let holder = &written["holders"][0];
    assert_eq!(holder["kind"], "drain", "{written}");
    assert!(holder.get("checked").is_none(), "unchecked: {written}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        served.join().unwrap(),
        9,
        "eight asks, then one with --force"
    );
}

/// A daemon of another version (an older one, before `systemctl restart pmcheck` after an
/// upgrade) sends no progress: its answer is never read as "nothing pending". The drain and
/// the waits name both versions and exit 76 (EX_PROTOCOL); nothing is written.
#[test]
fn a_daemon_of_another_version_is_named_and_never_read_as_nothing_pending() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let mut old: serde_json::Value = serde_json::from_str(
        &request(
            d.addr,
            "GET /status HTTP/1.1\r\nHost: pmcheck\r\nConnection: close\r\n\r\n",
        )
        .body,
    )
    .unwrap();
    let fields = old.as_object_mut().unwrap();
    assert!(
        fields.remove("progress").is_some(),
        "this daemon sends its progress"
    );
    assert_eq!(fields.remove("version").unwrap(), env!("CARGO_PKG_VERSION"));
    let (addr, stop, served) = answering("application/json", old.to_string());
    let url = format!("http://{addr}/");
    let said = format!(
        "pmcheck at {url} is an older version, this command is {}",
        env!("CARGO_PKG_VERSION")
    );
    let out = s.pmcheck("drain", &["--reason", "upgrade", "--wait", "--url", &url]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(76), "{stderr}");
    assert_contains!(stderr, &said);
    assert!(record(&s).is_none(), "nothing written: {stderr}");
    // Drained already (unchecked, no daemon asked), the undrain's wait reads no progress.
    let out = s.pmcheck(
        "drain",
        &["--reason", "upgrade", "--url", "http://127.0.0.1:1/"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = s.pmcheck("undrain", &["--wait", "--url", &url]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(76), "{stderr}");
    assert_contains!(stderr, &said);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(served.join().unwrap() >= 2);
}
