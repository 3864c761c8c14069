//! Drains and undrains that cannot write the record: what they say, and what they keep.

mod common;

use std::process::Output;

use common::*;

#[test]
fn drain_through_a_file_names_the_state_directory_and_how_to_fix_it() {
    let dir = tempfile::tempdir().unwrap();
    // A file where the directory should be is an obstacle even root cannot write through.
    let blocked = dir.path().join("file");
    std::fs::write(&blocked, "").unwrap();
    let out = pmcheck()
        .args([
            "drain",
            "--state-dir",
            &blocked.join("sub").display().to_string(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(73), "{out:?}");
    assert_contains!(stderr(&out), "cannot write the drain record in", "{out:?}");
    assert_contains!(stderr(&out), "--state-dir", "says how to fix it: {out:?}");
}

#[test]
fn drain_without_permission_names_the_directory_and_keeps_the_old_record() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let d = state.display().to_string();
    let out = pmcheck()
        .args(["drain", "--state-dir", &d, "--reason", "first"])
        .output()
        .unwrap();
    assert!(out.status.success(), "creates the directory: {out:?}");
    let before = std::fs::read(state.join("drain")).unwrap();
    // The state directory belongs to someone else: as root, run pmcheck as nobody; otherwise
    // make the directory read-only for ourselves.
    use std::os::unix::fs::PermissionsExt;
    let mut drain = if running_as_root() {
        let mut c = std::process::Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            env!("CARGO_BIN_EXE_pmcheck"),
        ]);
        c.env_clear().envs(no_puppet_env()).env("USER", "nobody");
        c
    } else {
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o555)).unwrap();
        pmcheck()
    };
    let out = drain
        .args(["drain", "--state-dir", &d, "--reason", "second"])
        .output()
        .unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(out.status.code(), Some(73), "{out:?}");
    // As nobody the lock (0660) cannot be opened; as its owner the record cannot be written.
    let said = if running_as_root() {
        format!("cannot change the drain record in {d}: cannot open its lock {d}/lock: ")
    } else {
        format!("cannot write the drain record in {d}")
    };
    assert!(stderr(&out).contains(&said), "{out:?}");
    assert_contains!(stderr(&out), "Permission denied", "{out:?}");
    // The way out is who may write there; another --state-dir would split drains from the
    // daemon, which reads only its own.
    assert_contains!(
        stderr(&out),
        &format!(
            "run the command as root (sudo), or as user {} (they own {d}); another --state-dir \
             would not help",
            whoami()
        ),
        "{out:?}"
    );
    assert_eq!(
        std::fs::read(state.join("drain")).unwrap(),
        before,
        "the previous record is intact"
    );
    let out = drain_as_nobody_or_self(&d, "undrain");
    if let Some(out) = out {
        assert_eq!(out.status.code(), Some(73), "{out:?}");
        assert!(
            stderr(&out).contains(&format!(
                "cannot change the drain record in {d}: cannot open its lock"
            )) && stderr(&out).contains("run the command as root (sudo)"),
            "{out:?}"
        );
        assert_eq!(std::fs::read(state.join("drain")).unwrap(), before);
    }
}

/// `undrain` as a user who may not write `dir` (root: as nobody), or None when not root.
fn drain_as_nobody_or_self(dir: &str, command: &str) -> Option<Output> {
    running_as_root().then(|| {
        std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                env!("CARGO_BIN_EXE_pmcheck"),
            ])
            .env_clear()
            .envs(no_puppet_env())
            .args([command, "--state-dir", dir])
            .output()
            .unwrap()
    })
}

#[test]
fn the_drain_record_is_readable_by_the_daemon_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("sh")
        .args([
            "-c",
            "umask 077; exec \"$0\" drain --state-dir \"$1\"",
            env!("CARGO_BIN_EXE_pmcheck"),
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mode = std::fs::metadata(dir.path().join("drain"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(
        mode, 0o644,
        "the daemon runs as another user and must read it"
    );
}

/// Every drain record pmcheck writes (`holders.json`), an earlier build wrote (with a top-level
/// copy of its first holder, which is not read where holders are), or an operator wrote by hand
/// (`tests/fixtures/drain/`), still drains the node and reads as it should; a record pmcheck
/// writes is written back with the same fields, and no top-level copy.
#[test]
fn every_drain_record_format_in_the_fixtures_still_drains_and_writes_back_its_fields() {
    use pmcheck::drain::record::{Drain, DrainProblem};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/drain");
    let at = |t: &str| humantime::parse_rfc3339(t).unwrap();
    for (file, says, until) in [
        (
            "drain.json",
            "kernel upgrade (by root since 2026-11-25T22:22:38Z)",
            None,
        ),
        (
            "drain-for.json",
            "kernel upgrade (by root since 2026-11-25T22:22:38Z until 2026-11-25T22:52:38.956Z)",
            Some("2026-11-25T22:52:38.956Z"),
        ),
        (
            "pre-holders.json",
            "kernel upgrade (by alice via sudo since 2026-11-20T17:32:05Z until 2026-11-20T18:32:05.000Z)",
            Some("2026-11-20T18:32:05.000Z"),
        ),
        (
            "held.json",
            "kernel upgrade (by alice via sudo since 2026-11-20T17:32:05Z)",
            None,
        ),
        (
            "holders.json",
            "disk failing (by alice via sudo since 2026-11-27T08:12:00Z); forced: --force past: load balancer 10.0.0.5 (lb1) says compile01 is the only server taking new agents in backend puppet (weight 100 of 100)",
            None,
        ),
        (
            "hand-written.json",
            "upgrade (by bob since yesterday until when the upgrade is done); `until` is not an RFC 3339 time (timestamp format is invalid), so the drain does not expire",
            None,
        ),
        (
            "touched",
            "drain file is empty; it still counts as drained",
            None,
        ),
        // A note by hand: its first line stands for the reason, not a JSON parser's complaint
        // (which HAProxy's stats page showed before).
        (
            "note",
            "kernel upgrade, back by 18:00 -- alice (a note, not a pmcheck record; it still counts as drained)",
            None,
        ),
    ] {
        let bytes = std::fs::read(dir.join(file)).unwrap();
        let drain = Drain::parse(&bytes);
        assert_eq!(drain.describe(), says, "{file}");
        // The verdict's short form marks a `--force` and leaves its note to the record, so
        // that Puppet Server's state after it fits in what HAProxy shows.
        let short = drain.summary(at("2026-11-26T00:00:00Z"));
        assert!(
            short.len() < 100 || drain.problem.is_some(),
            "{file}: {short}"
        );
        assert_eq!(
            short.ends_with("; forced"),
            file == "holders.json",
            "{file}: {short}"
        );
        assert_eq!(drain.until(), until.map(at), "{file}");
        let far = at("2100-01-01T00:00:00Z");
        assert_eq!(drain.expired_at(far), until.is_some(), "{file}");
        let Some(record) = &drain.record else {
            assert!(
                matches!(
                    drain.problem,
                    Some(DrainProblem::Empty | DrainProblem::Note(_))
                ),
                "{file}"
            );
            continue;
        };
        let written: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let again = serde_json::to_value(record).unwrap();
        if file == "holders.json" {
            assert_eq!(again, written, "{file}");
        }
        assert!(again.get("reason").is_none(), "no top-level copy: {again}");
        let holders = record.holders();
        assert!(!holders.is_empty(), "{file}");
        assert_eq!(holders[0].tenure.by, record.by(), "{file}");
    }
}

/// Every line an earlier pmcheck wrote in the drain event log reads the same.
#[test]
fn every_drain_event_in_the_fixtures_reads_and_writes_back_the_same() {
    use pmcheck::drain::log::Event;
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/drain/events.log");
    let log = std::fs::read_to_string(path).unwrap();
    assert_eq!(
        log.lines().count(),
        5,
        "drain, undrain, drain --for, expire, refused"
    );
    for line in log.lines() {
        let event: Event = serde_json::from_str(line).unwrap();
        let written: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(serde_json::to_value(&event).unwrap(), written, "{line}");
        assert!(event.at.time().is_some(), "{line}");
        assert_contains!(event.describe(), event.action.as_str(), "{line}");
    }
}
