//! What code this master serves: the deploy record of each `--code-environment`
//! (`.r10k-deploy.json`, as r10k writes it), found on puppet.conf's environmentpath, in the
//! operator's JSON, in `status` and in /metrics. Missing, malformed, huge and symlinked records
//! are shown as such; none of it ever changes the verdict.

mod common;

use std::path::Path;

use common::operator::{SOON, text, url};
use common::*;
use pmcheck::health::verdict::Verdict;
use pmcheck::protocol::CodeAnswer;

/// The record r10k 3.15 wrote (tests/fixtures/r10k-deploy.json), for this environment.
fn r10k_record(name: &str, commit: &str, success: bool) -> String {
    std::fs::read_to_string(fixture("r10k-deploy.json"))
        .unwrap()
        .replace("\"production\"", &format!("\"{name}\""))
        .replace("753f061ba2e22128aa61a0ec75b6cfe8aa60eb07", commit)
        .replace(
            "\"deploy_success\": true",
            &format!("\"deploy_success\": {success}"),
        )
}

fn deploy(dir: &Path, record: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(".r10k-deploy.json"), record).unwrap();
}

/// A daemon reading `envs` on `path` (its puppet.conf's environmentpath, written in
/// `conf_dir`), once it answers OK with the records: never a 503 for code.
fn serve(s: &Setup, conf_dir: &Path, path: &str, envs: &str) -> (Daemon, Vec<CodeAnswer>) {
    let conf = conf_dir.join("puppet.conf");
    std::fs::write(&conf, format!("[server]\nenvironmentpath = {path}\n")).unwrap();
    let mut args = s.args(&["--code-environment", envs]);
    let at = args.iter().position(|a| a == "--puppet-conf").unwrap();
    args[at + 1] = conf.display().to_string();
    let d = Daemon::start(&args);
    let answer = d.wait_for_json(SOON, "OK with the deploy records", |a| {
        a.answer.status == 200 && a.code.is_some()
    });
    assert_eq!(
        answer.answer.verdict,
        Verdict::Ok,
        "never a 503 for code: {answer:?}"
    );
    (d, answer.code.unwrap())
}

/// `pmcheck status`'s words for the daemon.
fn status(s: &Setup, d: &Daemon) -> String {
    text(&s.pmcheck("status", &["--url", &url(d)]).stdout)
}

#[test]
fn each_environments_record_is_shown_and_what_is_not_a_record_is_said() {
    let s = Setup::new(Behavior::Running);
    let root = tempfile::tempdir().unwrap();
    let (first, second) = (root.path().join("first"), root.path().join("second"));
    // production is in both directories: the first wins, as Puppet looks.
    deploy(
        &first.join("production"),
        &r10k_record("production", "aaaa1111", true),
    );
    deploy(
        &second.join("production"),
        &r10k_record("production", "bbbb2222", true),
    );
    deploy(
        &second.join("failed"),
        &r10k_record("failed", "cccc3333", false),
    );
    std::fs::create_dir_all(second.join("hand_made")).unwrap();
    deploy(&second.join("broken"), "{\"signature\": ");
    deploy(&second.join("huge"), &" ".repeat(2 * 1024 * 1024));
    // An environment that is a symlink to its directory, as Code Manager's versioned ones are.
    deploy(
        &root.path().join("versions/v7"),
        &r10k_record("linked", "dddd4444", true),
    );
    std::os::unix::fs::symlink(root.path().join("versions/v7"), second.join("linked")).unwrap();
    let path = format!("{}:{}", first.display(), second.display());
    let envs = "production,failed,hand_made,broken,huge,linked,ghost";
    let (d, code) = serve(&s, root.path(), &path, envs);
    let by = |env: &str| code.iter().find(|c| c.environment == env).unwrap().clone();
    assert_eq!(code.len(), 7, "{code:?}");

    let production = by("production");
    assert_eq!(production.state, "deployed");
    assert_eq!(production.commit.as_deref(), Some("aaaa1111"));
    assert_eq!(
        production.path.as_deref(),
        Some(first.join("production/.r10k-deploy.json").to_str().unwrap())
    );
    assert_eq!(
        production.finished_at.as_deref(),
        Some("2026-11-24T11:40:32Z")
    );
    assert_eq!(by("failed").state, "failed");
    assert_eq!(by("hand_made").state, "no_record");
    assert_eq!(by("linked").commit.as_deref(), Some("dddd4444"));
    assert_eq!(by("ghost").state, "no_environment");
    let broken = by("broken");
    assert_eq!(broken.state, "unreadable");
    assert_contains!(broken.why.unwrap(), "not r10k's JSON deploy record");
    assert_contains!(by("huge").why.unwrap(), "larger than 1024 KiB");
    assert!(
        code.iter().all(|c| c.file_sync_status.is_none()),
        "open source has no file sync: {code:?}"
    );
    assert_eq!(
        s.stub
            .seen
            .file_sync_requests
            .load(std::sync::atomic::Ordering::SeqCst),
        1,
        "asked once at start (404), then once a minute"
    );

    // status says it in words.
    let text = status(&s, &d);
    let line = text
        .lines()
        .find(|l| l.starts_with("code:   "))
        .unwrap_or_default();
    for part in [
        "production aaaa1111 deployed 2026-11-24T11:40:32Z (",
        "failed cccc3333 deployed 2026-11-24T11:40:32Z (",
        ", FAILED (deploy_success false",
        "hand_made: no deploy record (",
        "broken: deploy record ",
        "ghost: no such environment on the environmentpath",
    ] {
        assert!(line.contains(part), "{part:?} in {text}");
    }

    // /metrics: series for the readable records only; the commit as a label.
    let body = d.scrape();
    for wanted in [
        "pmcheck_code_info{commit=\"aaaa1111\",environment=\"production\"} 1",
        "pmcheck_code_info{commit=\"dddd4444\",environment=\"linked\"} 1",
        "pmcheck_code_deploy_success{environment=\"production\"} 1",
        "pmcheck_code_deploy_success{environment=\"failed\"} 0",
        "pmcheck_code_deployed_timestamp_seconds{environment=\"production\"} 1795520432",
    ] {
        assert!(body.contains(wanted), "{wanted} in\n{body}");
    }
    for absent in ["hand_made", "broken", "huge", "ghost", "bbbb2222"] {
        assert!(!body.contains(absent), "{absent} in\n{body}");
    }
}

#[test]
fn at_most_16_environments_and_each_a_puppet_name() {
    let s = Setup::new(Behavior::Running);
    let sixteen: Vec<String> = (0..16).map(|i| format!("env_{i}")).collect();
    let out = s.pmcheck("config", &["--code-environment", &sixteen.join(",")]);
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(table.contains(&sixteen.join(",")), "{table}");

    let seventeen = format!("{},env_16", sixteen.join(","));
    let out = s.pmcheck("config", &["--code-environment", &seventeen]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{out:?}");
    assert_contains!(
        said,
        "--code-environment (command line): 17 environments; at most 16"
    );

    let out = s.pmcheck("config", &["--code-environment", "Feature-X"]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{out:?}");
    assert_contains!(said, "`Feature-X` is not a Puppet environment name");
}

/// Puppet Enterprise: the file sync client's status beside each record (the stub answers a
/// hand-made fixture, as PE could not be run here).
#[test]
fn on_puppet_enterprise_file_syncs_commit_is_shown_beside_the_record() {
    let s = Setup::new(Behavior::Enterprise);
    let root = tempfile::tempdir().unwrap();
    let envs = root.path().join("environments");
    deploy(
        &envs.join("production"),
        &r10k_record("production", "aaaa1111", true),
    );
    std::fs::create_dir_all(envs.join("staging")).unwrap();
    let (d, code) = serve(
        &s,
        root.path(),
        &envs.display().to_string(),
        "production,staging,dev",
    );
    let production = &code[0];
    assert_eq!(production.commit.as_deref(), Some("aaaa1111"));
    assert_eq!(production.file_sync_status.as_deref(), Some("ok"));
    assert_eq!(
        production.file_sync_commit.as_deref(),
        Some("0a1b2c3d4e5f60718293a4b5c6d7e8f901234567")
    );
    assert_eq!(code[1].file_sync_status.as_deref(), Some("failed"));
    assert_eq!(
        code[2].file_sync_status.as_deref(),
        Some("none"),
        "{code:?}"
    );

    let text = status(&s, &d);
    for part in [
        "production aaaa1111 deployed 2026-11-24T11:40:32Z (",
        ", file sync ok 0a1b2c3d4e5f",
        "staging: no deploy record (",
        "), file sync failed 89abcdef0123",
    ] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
    // The file sync commit is file sync's own: never the metrics' commit.
    let body = d.scrape();
    assert_contains!(body, "commit=\"aaaa1111\"");
    assert!(!body.contains("0a1b2c3d"), "{body}");
}
