//! The drain event log (`STATE_DIR/drain-events.log`): every drain, undrain, `--for` expiry
//! and cycle step appends one whole line, concurrent commands never mix their lines, a full
//! disk is said and the drain still happens, only root and the state directory's group read
//! it, and the daemon counts what it reads in `pmcheck_drain_events_total{action}`.

mod common;

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use common::operator::*;
use common::*;

fn log(s: &Setup) -> std::path::PathBuf {
    s.state.path().join("drain-events.log")
}

#[test]
fn every_action_appends_one_event_and_the_daemon_counts_them() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let url = url(&d);
    let ok = |out: std::process::Output| {
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    };
    ok(s.pmcheck("drain", &["--url", &url, "--reason", "kernel 6.1"]));
    assert_eq!(logged_actions(&s), ["drain"]);
    ok(s.pmcheck("undrain", &["--url", &url]));
    assert_eq!(logged_actions(&s), ["drain", "undrain"]);
    ok(s.pmcheck("undrain", &["--url", &url]));
    assert_eq!(
        logged_actions(&s),
        ["drain", "undrain"],
        "nothing undrained, nothing logged"
    );
    ok(s.pmcheck(
        "drain",
        &["--url", &url, "--for", "1s", "--reason", "brief"],
    ));
    // The daemon sees the --for end and logs it, once.
    let deadline = Instant::now() + SOON;
    while logged_actions(&s).len() < 4 {
        assert!(
            Instant::now() < deadline,
            "no expiry logged: {:?}",
            logged_actions(&s)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    ok(s.pmcheck("undrain", &["--url", &url]));
    let cycle = Running::start(
        &s,
        "cycle",
        &["--url", &url, "--lb-interval", "100ms", "--", "true"],
    );
    let out = cycle.finish(SOON);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        logged_actions(&s),
        [
            "drain",
            "undrain",
            "drain",
            "expire",
            "undrain",
            "cycle_drain",
            "cycle_undrain"
        ]
    );
    let all = logged_events(&s);
    assert_eq!(all[0]["reason"], "kernel 6.1");
    assert_eq!(all[0]["holder"], "drain");
    assert_eq!(all[3]["reason"], "brief");
    assert!(all[3]["until"].is_string(), "{}", all[3]);
    assert!(all[5]["holder"].as_str().unwrap().starts_with("cycle pid "));

    let deadline = Instant::now() + SOON;
    loop {
        let metrics = d.scrape();
        let want = [
            "pmcheck_drain_events_total{action=\"drain\"} 2",
            "pmcheck_drain_events_total{action=\"undrain\"} 2",
            "pmcheck_drain_events_total{action=\"expire\"} 1",
            "pmcheck_drain_events_total{action=\"cycle_undrain\"} 1",
            "pmcheck_drain_events_total{action=\"refused\"} 0",
        ];
        if want.iter().all(|w| metrics.contains(w)) {
            break;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        std::thread::sleep(Duration::from_millis(50));
    }
    d.wait_for_log(SOON, "drain event action=");
    // The text line carries the journal's fields (tests/systemd.rs) as `key=value`.
    assert!(d.logged("drain event action=cycle_drain who=") >= 1);

    let out = s.pmcheck("status", &["--history", "3"]);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(shown.lines().count(), 3, "{shown}");
    assert_contains!(shown.lines().next().unwrap(), " undrain by ", "{shown}");
    // Without N, the last 20: every event of this test.
    let all = text(&s.pmcheck("status", &["--history"]).stdout);
    assert_eq!(all, text(&s.pmcheck("status", &["--history", "20"]).stdout));
    assert!(all.lines().count() > 3, "{all}");
    let out = s.pmcheck("status", &["--history", "2", "--json"]);
    let json: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json.len(), 2);
    assert_eq!(json[1]["action"], "cycle_undrain");
}

#[test]
fn concurrent_drains_leave_whole_lines() {
    let s = Setup::new(Behavior::Running);
    let nowhere = format!("http://{}/", closed_port());
    let running: Vec<Running> = (0..8)
        .map(|i| {
            Running::start(
                &s,
                "drain",
                &["--url", &nowhere, "--reason", &format!("reason {i}")],
            )
        })
        .collect();
    for r in running {
        let out = r.finish(SOON);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let all = logged_events(&s);
    assert_eq!(all.len(), 8, "one whole line each");
    let mut reasons: Vec<_> = all.iter().map(|e| e["reason"].to_string()).collect();
    reasons.sort();
    reasons.dedup();
    assert_eq!(reasons.len(), 8);
}

#[test]
fn a_full_disk_loses_the_event_says_so_and_still_drains() {
    let s = Setup::new(Behavior::Running);
    let nowhere = format!("http://{}/", closed_port());
    // A file size limit stands in for a full disk: the log (already 4000 bytes) cannot grow,
    // the new drain record (a few hundred bytes) can be written. SIGXFSZ is ignored, as the
    // write then fails with EFBIG instead of ending the process.
    std::fs::write(log(&s), "\n".repeat(4000)).unwrap();
    let out = std::process::Command::new("sh")
        .args(["-c", "trap '' XFSZ; exec prlimit --fsize=4050 \"$@\"", "sh"])
        .arg(bin())
        .args(["drain", "--state-dir"])
        .arg(s.state.path())
        .args(["--url", &nowhere, "--reason", "kernel"])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "the drain happens: {stderr}");
    assert!(record(&s).is_some(), "the record is written");
    assert!(
        stderr.contains("did not record this drain event (it is lost")
            && stderr.contains("ulimit -f"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(log(&s)).unwrap(),
        "\n".repeat(4000).into_bytes(),
        "no half line left behind"
    );
}

/// A real full disk: the state directory on a tmpfs of four pages, in a mount namespace of its
/// own. The log fills one page to 96 bytes short, a filler two, and the drain record takes the
/// last: the event's line fits in part only, so the append fails and takes back what went.
#[test]
fn a_small_filesystem_that_fills_loses_the_event_and_leaves_no_half_line() {
    if !root_or_skip("needs root to mount a small filesystem in a namespace of its own") {
        return;
    }
    let s = Setup::new(Behavior::Running);
    let nowhere = format!("http://{}/", closed_port());
    let script = r#"dir=$1; shift
mount --make-rprivate / && mount -t tmpfs -o size=16k,mode=0755 pmcheck-test "$dir" || exit 90
head -c 4000 /dev/zero | tr '\0' '\n' >"$dir/drain-events.log"
head -c 8192 /dev/zero >"$dir/filler" || exit 91
"$@" >&2
echo "rc=$?"
wc -c <"$dir/drain-events.log"
test -s "$dir/drain" && echo record"#;
    let out = std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", script, "sh"])
        .arg(s.state.path())
        .arg(bin())
        .args(["drain", "--state-dir"])
        .arg(s.state.path())
        .args(["--url", &nowhere, "--reason", "kernel"])
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        stdout.split_whitespace().collect::<Vec<_>>(),
        ["rc=0", "4000", "record"],
        "the drain happens, its record is written, the log is as it was: {stderr}"
    );
    assert!(
        stderr.contains("did not record this drain event (it is lost")
            && stderr.contains("No space left on device"),
        "{stderr}"
    );
}

#[test]
fn only_root_and_the_state_directorys_group_read_the_log() {
    if !root_or_skip("needs root to give the state directory another group") {
        return;
    }
    let s = Setup::new(Behavior::Running);
    let nowhere = format!("http://{}/", closed_port());
    std::os::unix::fs::chown(s.state.path(), None, Some(65534)).unwrap();
    let out = s.pmcheck("drain", &["--url", &nowhere, "--reason", "kernel"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let meta = std::fs::metadata(log(&s)).unwrap();
    assert_eq!((meta.mode() & 0o777, meta.gid()), (0o660, 65534));
    let history_as = |gid: &str| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", &format!("--regid={gid}"), "--clear-groups"])
            .arg(bin())
            .args(["status", "--history", "5", "--state-dir"])
            .arg(s.state.path())
            .env_clear()
            .envs(no_puppet_env())
            .output()
            .unwrap()
    };
    let out = history_as("65534");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_contains!(text(&out.stdout), "drain by ", "{}", text(&out.stdout));
    let out = history_as("65533");
    let stderr = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert_contains!(stderr, "only root and the group pmcheck read it");
}
