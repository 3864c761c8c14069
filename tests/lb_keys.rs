//! The load balancers' key file (`--lb-key-file`): each key bound to the addresses that may
//! send it, and a file that cannot be used never a reason to stop answering. The c8a278e audit
//! replayed a captured key from another address, and took a node out with a `chmod 0644` and a
//! restart (the daemon exited 78, port 9200 closed, HAProxy showed it DOWN).

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use common::lb::{LB_KEY, LoadBalancer, Polling};
use common::operator::*;
use common::*;
use pmcheck::settings::lb_proof::Proof;

/// A key file holding `text` with `mode`, in a directory only its owner may write and
/// everybody may enter.
fn key_file(dir: &Path, text: &str, mode: u32) -> PathBuf {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.join("lb-key");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// The stand-in load balancer at 127.0.0.2, sending the kit's key every 50 ms.
fn load_balancer(d: &Daemon) -> LoadBalancer {
    LoadBalancer::start(Polling {
        every: std::time::Duration::from_millis(50),
        ..Polling::new(d.addr, None)
    })
}

/// Waits until the daemon lists 127.0.0.2 as a regular poller, with `proof`.
fn until_judged(d: &Daemon, proof: Proof) {
    d.wait_for_json(SOON, &format!("127.0.0.2 to be judged {proof:?}"), |a| {
        (a.pollers.iter()).any(|p| p.address.to_string() == LB && p.proof == proof && p.regular)
    });
}

#[test]
fn a_key_file_that_cannot_be_used_keeps_the_node_answering_and_refuses_unforced_drains() {
    let s = Setup::new(Behavior::Running);
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), &format!("{LB_KEY} 127.0.0.2\n"), 0o644);
    let key = key.display().to_string();
    let d = s.daemon(&["--lb-key-file", &key]);
    d.wait_for(SOON, "OK", |a| a.status == 200);
    d.wait_for_log(SOON, "is readable by every user (mode 644)");
    d.wait_for_log(SOON, "no poll proves itself");
    // Each line true at its moment: the file proves nothing, so no line says it does.
    assert_eq!(d.logged("load balancers prove their polls with a key"), 0);
    let lb = load_balancer(&d);
    until_judged(&d, Proof::Unusable);
    let problem = (d.status().lb_key_file).and_then(|k| k.problem);
    assert!(
        problem.as_deref().is_some_and(|p| p.contains(&key)),
        "{problem:?}"
    );

    let out = s.pmcheck("status", &["--url", &url(&d)]);
    let stdout = text(&out.stdout);
    assert_contains!(stdout, "keys:   UNUSABLE: the load balancer key file");
    assert_contains!(stdout, "drain and cycle refuse without --force");

    // No load balancer proves its word: unforced drains and cycles are refused, nothing
    // written, nothing run.
    let out = s.pmcheck("drain", &["--url", &url(&d), "--reason", "upgrade"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{stderr}");
    assert_contains!(
        stderr,
        "the daemon cannot use its key file: the load balancer key file"
    );
    assert!(
        record(&s).is_none(),
        "a refused drain wrote {:?}",
        record(&s)
    );
    let ran = dir.path().join("ran");
    let touch = format!("touch {}", ran.display());
    let out = s.pmcheck(
        "cycle",
        &[
            "--url",
            &url(&d),
            "--reason",
            "upgrade",
            "--",
            "sh",
            "-c",
            &touch,
        ],
    );
    assert_eq!(out.status.code(), Some(77), "{}", text(&out.stderr));
    assert!(!ran.exists() && record(&s).is_none());

    // A stop still drains, and waits by time.
    let out = s.pmcheck("on-stop", &["--url", &url(&d), "--lb-interval", "100ms"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(holders(&s), ["stop"]);
    // --force drains, saying what it went past.
    let out = s.pmcheck("drain", &["--url", &url(&d), "--reason", "now", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_contains!(
        text(&out.stderr),
        "--force: drained although the daemon cannot use its key file"
    );
    drop(lb);
}

/// A captured key replayed from another address proves nothing, and `status` says which
/// address each key is for; a check that lacks the key is logged once per address.
#[test]
fn a_key_bound_to_an_address_proves_nothing_from_another() {
    let s = Setup::new(Behavior::Running);
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), &format!("{LB_KEY} 127.0.0.3\n"), 0o640);
    let d = s.daemon(&["--lb-key-file", &key.display().to_string()]);
    let lb = load_balancer(&d);
    until_judged(&d, Proof::Elsewhere);
    let out = s.pmcheck("status", &["--url", &url(&d)]);
    let stdout = text(&out.stdout);
    assert_contains!(stdout, "keys:   line 1: 127.0.0.3/32");
    assert_contains!(
        stdout,
        "UNVERIFIED, sent a key bound to other addresses (--lb-key-file)"
    );
    let said = r#"peer=127.0.0.2 via=http problem="unverified: sent a key bound to other addresses (--lb-key-file)""#;
    d.wait_for_log(SOON, said);
    // Many checks later, still said once.
    let polls = |d: &Daemon| {
        (d.status().pollers.iter())
            .find(|p| p.address.to_string() == LB)
            .map_or(0, |p| p.polls)
    };
    let seen = polls(&d);
    d.wait_for_json(SOON, "ten more checks", |a| {
        (a.pollers.iter()).any(|p| p.address.to_string() == LB && p.polls >= seen + 10)
    });
    assert_eq!(d.logged(said), 1, "{:?}", d.log.lock().unwrap());
    drop(lb);
}

/// The key file's own checks: writable by others, in a directory others may write, a key
/// that is not random, all fail `config --check` with the file and the fix named.
#[test]
fn config_check_names_a_loose_or_weak_key_file_and_each_keys_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let check = |path: &Path| {
        pmcheck()
            .args(["config", "--check", "--env-file", "none", "--lb-key-file"])
            .arg(path)
            .output()
            .unwrap()
    };
    let good = key_file(
        dir.path(),
        &format!("{LB_KEY} 10.0.0.5 10.0.1.0/29 10.8.0.0/16\n"),
        0o640,
    );
    let out = check(&good);
    let stdout = text(&out.stdout);
    assert_contains!(
        stdout,
        "load balancer key, line 1: for 10.0.0.5/32, 10.0.1.0/29, 10.8.0.0/16"
    );
    assert_contains!(
        stdout,
        "warning: the key on line 1 of the load balancer key file is bound to 10.8.0.0/16, wider than a /24 (IPv4) or /64 (IPv6)"
    );
    assert!(
        !stdout.contains("10.0.1.0/29, wider"),
        "a /29 is a site's subnet: {stdout}"
    );
    for (text_, mode, said) in [
        (
            format!("{LB_KEY}\n"),
            0o620,
            "is writable by others than its owner (mode 620)",
        ),
        (
            format!("{LB_KEY}\n"),
            0o602,
            "is writable by others than its owner (mode 602)",
        ),
        (
            format!("{}\n", "a".repeat(32)),
            0o640,
            "line 1: it uses 1 different characters: it is not random",
        ),
    ] {
        let path = key_file(dir.path(), &text_, mode);
        let out = check(&path);
        assert_eq!(out.status.code(), Some(78), "{mode:o}");
        assert_contains!(text(&out.stdout), said);
    }
    let path = key_file(dir.path(), &format!("{LB_KEY}\n"), 0o640);
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = check(&path);
    assert_eq!(out.status.code(), Some(78));
    assert_contains!(
        text(&out.stdout),
        "which others than its owner may write (mode 777)"
    );
}

/// Issue 54, part 3: a reload (SIGHUP) reads the key file again, so keys rotate without a
/// restart; a file that cannot be used at a reload keeps the keys read before, loudly.
#[test]
fn a_reload_rotates_the_keys_and_an_unusable_file_keeps_the_old_ones() {
    let s = Setup::new(Behavior::Running);
    let dir = tempfile::tempdir().unwrap();
    let other = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a6978";
    let key = key_file(dir.path(), &format!("{other} 127.0.0.2\n"), 0o640);
    let d = s.daemon(&["--lb-key-file", &key.display().to_string()]);
    let hup = |d: &Daemon| {
        let pid = nix::unistd::Pid::from_raw(d.pid() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    };
    let _lb = load_balancer(&d);
    until_judged(&d, Proof::WrongKey);
    // The load balancer's key beside the old one, read at a reload: it proves.
    let both = format!("{other} 127.0.0.2\n{LB_KEY} 127.0.0.2\n");
    key_file(dir.path(), &both, 0o640);
    hup(&d);
    d.wait_for_log(SOON, "re-read the load balancer key file");
    until_judged(&d, Proof::Key);
    // A rotation step that leaves the file unusable (every user may read it): the keys read
    // before still prove, and the log and `status` say why.
    key_file(dir.path(), &format!("{LB_KEY} 127.0.0.2\n"), 0o644);
    hup(&d);
    d.wait_for_log(SOON, "the keys read before still prove");
    let keys = d.status().lb_key_file.expect("a key file");
    assert!(keys.problem.is_none(), "{keys:?}");
    let rejected = keys.rejected.unwrap_or_default();
    assert!(rejected.contains("(mode 644)"), "{rejected}");
    assert_eq!(keys.keys.len(), 2, "the keys read before: {:?}", keys.keys);
    let out = s.pmcheck("status", &["--url", &url(&d)]);
    assert_contains!(
        text(&out.stdout),
        "REJECTED at the latest reload, the keys above kept"
    );
    // Every poll since proves itself: only the proven poller's count grows.
    let polls = |a: &pmcheck::protocol::Status<'_>, proven: bool| -> u32 {
        (a.pollers.iter())
            .filter(|p| p.address.to_string() == LB && (p.proof == Proof::Key) == proven)
            .map(|p| p.polls)
            .sum()
    };
    let before = d.status();
    let after = d.wait_for_json(SOON, "three more proven polls", |a| {
        polls(a, true) >= polls(&before, true) + 3
    });
    assert_eq!(
        polls(&after, false),
        polls(&before, false),
        "{:?}",
        after.pollers
    );
    // Fixed, and the old key gone: the rotation is done.
    key_file(dir.path(), &format!("{LB_KEY} 127.0.0.2\n"), 0o640);
    hup(&d);
    d.wait_for_json(SOON, "one key, nothing rejected", |a| {
        (a.lb_key_file.as_ref()).is_some_and(|k| k.keys.len() == 1 && k.rejected.is_none())
    });
    until_judged(&d, Proof::Key);
}
