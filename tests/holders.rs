//! Drains and cycles that cannot undo each other: every cycle holds the node drained beside
//! whoever else does, lets go of its own hold only, and the node returns to rotation when
//! nobody holds it; `undrain` refuses while a cycle runs, unless `--force`.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::operator::*;
use common::*;

/// `pmcheck cycle -- COMMAND` against `d`, started now, believing after two `lb_interval`
/// that no load balancer polls (older builds, tested with `PMCHECK_TEST_BIN`, have no such
/// flag and need none).
fn cycle_of(s: &Setup, d: &Daemon, lb_interval: &str, command: &[&str]) -> Running {
    let url = url(d);
    let mut args = vec!["--url", url.as_str()];
    if std::env::var_os("PMCHECK_TEST_BIN").is_none() {
        args.extend(["--lb-interval", lb_interval]);
    }
    args.push("--");
    args.extend(command);
    Running::start(s, "cycle", &args)
}

/// A cycle of `sleep SECONDS` against `d`, started now.
fn cycle(s: &Setup, d: &Daemon, seconds: &str) -> Running {
    cycle_of(s, d, "100ms", &["sleep", seconds])
}

/// A cycle against `d` whose command runs until the test creates the returned path (20 s at
/// most): what happens "while the command runs" then needs no guess at how fast this machine
/// is.
fn cycle_until_released(s: &Setup, d: &Daemon, name: &str) -> (Running, PathBuf) {
    let release = s.state.path().join(name);
    let script = format!(
        "i=0; while [ ! -e {} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done",
        release.display()
    );
    (cycle_of(s, d, "100ms", &["sh", "-c", &script]), release)
}

/// Waits until the drain record names a cycle among its holders.
fn until_held_by_a_cycle(s: &Setup) {
    let deadline = Instant::now() + SOON;
    let old = std::env::var_os("PMCHECK_TEST_BIN").is_some();
    loop {
        let held = record(s).is_some_and(|r| {
            old || r["holders"]
                .as_array()
                .is_some_and(|h| h.iter().any(|h| h["kind"] == "cycle"))
        });
        if held {
            return;
        }
        assert!(Instant::now() < deadline, "no cycle holds the node");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the daemon answers from now until `running` exits (at most `within`): the first
/// word of each answer.
fn answers_until_done(d: &Daemon, running: &mut Running, within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    while running.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "still running after {within:?}");
        let answer = quiet_poll(d);
        seen.push(answer.body.split(' ').next().unwrap_or_default().to_owned());
        std::thread::sleep(Duration::from_millis(50));
    }
    seen
}

#[test]
fn two_cycles_at_once_keep_the_node_drained_until_the_last_one_ends() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let (mut long, release) = cycle_until_released(&s, &d, "release");
    until_held_by_a_cycle(&s);
    let short = cycle(&s, &d, "0.3");
    let out = short.finish(SOON);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    // However long the step took on this machine.
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("pmcheck cycle: step drain took ")
                && l.contains("s: already drained by cycle pid ")),
        "{stdout}"
    );
    assert_contains!(
        stdout,
        "this cycle let go; the node stays drained, held by cycle pid "
    );
    assert_contains!(stdout, "pmcheck cycle: done in ");
    // The long cycle's command still runs: the node must stay out all along.
    let during: Vec<String> = (0..10)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(50));
            quiet_poll(&d).body
        })
        .collect();
    assert!(
        during.iter().all(|b| b.starts_with("DRAINED")),
        "answers while the long cycle ran: {during:?}"
    );
    std::fs::write(&release, "").unwrap();
    let seen = answers_until_done(&d, &mut long, SOON + SOON);
    let back = seen.iter().position(|w| w == "OK");
    assert!(
        seen[..back.unwrap_or(seen.len())]
            .iter()
            .all(|w| w == "DRAINED"),
        "answers until the long cycle let go: {seen:?}"
    );
    let out = long.finish(SOON);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert_contains!(stdout, "s: removed ");
    assert!(
        record(&s).is_none(),
        "undrained when the last holder let go"
    );
}

#[test]
fn undrain_refuses_while_a_cycle_holds_the_node_and_drain_then_cycle_stays_drained() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    assert!(
        s.pmcheck("drain", &["--reason", "kernel upgrade"])
            .status
            .success()
    );
    let (running, release) = cycle_until_released(&s, &d, "release");
    until_held_by_a_cycle(&s);
    let out = s.pmcheck("undrain", &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{stderr}");
    assert_contains!(
        stderr,
        &format!(
            "refused: the node is held drained by cycle pid {} (pmcheck cycle: sh -c 'i=0; while [ ! -e ",
            running.0.id()
        ),
        "{stderr}"
    );
    assert_contains!(stderr, "`pmcheck undrain --force` undrains now");
    std::fs::write(&release, "").unwrap();
    let out = running.finish(SOON + SOON);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert_contains!(stdout, "held by drain (kernel upgrade");
    assert!(
        quiet_poll(&d).body.starts_with("DRAINED"),
        "the operator's drain stays"
    );
    let out = s.pmcheck("undrain", &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(record(&s).is_none());
}

#[test]
fn undrain_force_during_a_cycle_and_the_cycle_says_what_it_found() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    // Forced while the command runs: the cycle finds no record when it lets go. The command
    // runs until the test says the forced undrain is done (at most 10 s), not for a time a
    // loaded machine may outlast.
    let marker = s.state.path().join("running");
    let done = s.state.path().join("forced");
    let script = format!(
        "touch {}; i=0; while [ ! -e {} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done",
        marker.display(),
        done.display()
    );
    let running = cycle_of(&s, &d, "100ms", &["sh", "-c", &script]);
    let deadline = Instant::now() + SOON;
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the command never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = s.pmcheck("undrain", &["--force"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert_contains!(stdout, "let go of cycle pid ");
    std::fs::write(&done, "").unwrap();
    // It neither waits for a Puppet Server it no longer holds out, nor claims a drain.
    let out = running.finish(SOON);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_contains!(
        stderr,
        "wait-healthy: the drain record no longer holds this cycle (`pmcheck undrain --force`?); found no drain record at "
    );
    assert!(
        !stdout.contains("stays drained") && !stderr.contains("stays drained"),
        "{stdout}{stderr}"
    );
    assert!(record(&s).is_none());

    // Forced while it waits for the drain: the command is never run. Whether the guard was
    // still watching its write (before the daemon answered DRAINED) or the wait had begun,
    // the cycle stops at once: the load balancers' 10 s interval is not waited out.
    let marker = s.state.path().join("never");
    let touch = format!("touch {}", marker.display());
    let running = cycle_of(&s, &d, "10s", &["sh", "-c", &touch]);
    until_held_by_a_cycle(&s);
    assert!(s.pmcheck("undrain", &["--force"]).status.success());
    let out = running.finish(SOON);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let released = "the drain record no longer holds this cycle (`pmcheck undrain --force`?); found no drain record at ";
    assert!(
        ["drain", "wait-drained"]
            .iter()
            .any(|step| stderr.contains(&format!("{step}: {released}"))),
        "{stderr}"
    );
    assert!(!marker.exists(), "the command ran on an undrained node");
}

#[test]
fn a_cycle_that_died_is_stale_keeps_the_node_drained_but_does_not_block_undrain() {
    let s = Setup::new(Behavior::Running);
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let stale = serde_json::json!({
        "reason": "pmcheck cycle: systemctl restart puppetserver",
        "by": "root",
        "since": "2026-11-23T08:00:00Z",
        "holders": [{
            "kind": "cycle",
            "by": "root",
            "since": "2026-11-23T08:00:00Z",
            "what": "pmcheck cycle: systemctl restart puppetserver",
            "process": {"pid": dead, "start": 1, "boot": boot.trim()}
        }]
    });
    std::fs::write(s.state.path().join("drain"), stale.to_string()).unwrap();
    let out = s.pmcheck("undrain", &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert_contains!(
        stdout,
        &format!(
            "let go of cycle pid {dead} (pmcheck cycle: systemctl restart puppetserver, by root since 2026-11-23T08:00:00Z, no longer running)"
        )
    );
    assert!(record(&s).is_none());
}
