//! The operator commands' common ground: exit codes, status, the manual and completions.

mod common;

use std::time::Duration;

use common::*;
use pmcheck::health::answer::Answer;
use pmcheck::health::verdict::Verdict;

#[test]
fn a_listen_address_in_use_exits_69() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = pmcheck()
        .args(["serve", "--listen", &addr, "--certname", "x"])
        .args(["--state-dir", &dir.path().display().to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert_contains!(
        stderr(&out),
        &format!("cannot listen on {addr} (--listen)"),
        "{out:?}"
    );
    // The agent port's error names the agent port's option, not --listen.
    let out = pmcheck()
        .args(["serve", "--listen", "127.0.0.1:0", "--agent-listen", &addr])
        .args(["--certname", "x"])
        .args(["--state-dir", &dir.path().display().to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains(&format!("cannot listen on {addr} (--agent-listen)"))
            && err.contains(
                "pass another --agent-listen, PMCHECK_AGENT_LISTEN in /etc/default/pmcheck"
            ),
        "{err}"
    );
}

#[test]
fn status_prints_for_people_or_raw_json_and_exits_by_the_answer() {
    let s = Setup::with_key(Behavior::Running, "ec.pkcs8.pem", "ec.sec1.pem");
    let d = Daemon::start(&s.args(&["--interval", "100ms"]));
    d.wait_for(Duration::from_secs(10), "OK", |a| a.status == 200);
    // A person with curl: listed apart from load balancers, by the client it names.
    let curl = request(
        d.addr,
        "GET / HTTP/1.1\r\nHost: pmcheck\r\nUser-Agent: curl/8.1.2\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(curl.status, 200);
    let url = format!("http://{}/", d.addr);
    let out = pmcheck().args(["status", "--url", &url]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout(&out).starts_with(
            "OK (HTTP 200) - Puppet Server is running, 1 of 1 JRubies free\ndrain:  not drained\n\
             probe:  ok - Puppet Server is running, 1 of 1 JRubies free"
        ),
        "{out:?}"
    );
    assert_contains!(
        stdout(&out),
        "\npool:   warm: 1 of 1 JRubies free, 0 compiling, 0 waiting; average wait 0 ms, \
             borrow 0 ms; 0 refused at the queue limit, 0 borrow timeouts; lock not-in-use\n\
             weight: none sent: this daemon has no agent port (--agent-listen), so HAProxy uses \
             its own weight\n\
             others: 127.0.0.1",
        "{out:?}"
    );
    // The test's own polls: a person or a script, not a load balancer (named `localhost`
    // where reverse DNS says so).
    assert_contains!(stdout(&out), " (curl, HTTP: OK x", "{out:?}");
    assert!(
        !stdout(&out).contains("\nlb:"),
        "no load balancer polls: {out:?}"
    );
    assert_contains!(stdout(&out), ") (people and scripts)\n", "{out:?}");
    assert_contains!(
        stdout(&out),
        &format!(
            "\nagents: no connection to {}\ncerts:  hostcert CN={CERTNAME} (leaf) until ",
            s.stub.addr
        ),
        "{out:?}"
    );
    assert!(
        stdout(&out).ends_with(
            "\nnext:   serving: `pmcheck drain --reason ... --wait` takes it out for work\n"
        ),
        "{out:?}"
    );
    s.pmcheck("drain", &["--reason", "why"]);
    d.wait_for(Duration::from_secs(10), "DRAINED", |a| a.status == 503);
    let out = pmcheck()
        .args(["status", "--json", "--url", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let answer = Answer::from_json(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert_eq!(answer.verdict, Verdict::Drained);
    assert_eq!(answer.drain.unwrap().reason.as_deref(), Some("why"));
    drop(d);
    // Unreachable is not "not OK": 69, as the waits; --json still prints JSON.
    let out = pmcheck().args(["status", "--url", &url]).output().unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert_contains!(stderr(&out), "cannot reach pmcheck at", "{out:?}");
    let out = pmcheck()
        .args(["status", "--json", "--url", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    let error: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("cannot reach pmcheck at")),
        "{error}"
    );
    assert_eq!(error["url"], url.as_str());
    assert_eq!(error["exit"], 69);
}

/// Completions offer the values of a closed set, and each help says what its own flags do.
#[test]
fn completions_offer_closed_values_and_helps_say_what_their_flags_do() {
    let out = pmcheck()
        .args(["generate", "completions", "bash"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).contains(r#"compgen -W "503 404""#),
        "--drained-status completes to its two values"
    );
    let help = |args: &[&str]| stdout(&pmcheck().args(args).output().unwrap());
    let top = help(&["--help"]);
    assert_contains!(top, "forces 503 (or 404, as packaged");
    let undrain = help(&["undrain", "--help"]);
    assert!(!undrain.contains("a drain stays in place"), "{undrain}");
    assert_contains!(undrain, "what the command changed stays changed");
    let serve = help(&["serve", "--help"]);
    assert_contains!(
        serve,
        "- 404: HAProxy with `http-check disable-on-404`: NOLB"
    );
}

/// The manual shows the waits and the cycle, and the file the service reads its settings from.
#[test]
fn the_manual_has_the_waits_the_cycle_and_the_defaults_file() {
    let out = pmcheck().args(["generate", "man"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    // roff writes a hyphen as `\-`
    let page = stdout(&out).replace("\\-", "-");
    let examples = page
        .split(".SH EXAMPLES")
        .nth(1)
        .expect("an EXAMPLES section");
    assert_contains!(examples, "--wait");
    assert_contains!(examples, "pmcheck cycle");
    let files = page
        .split(".SH FILES")
        .nth(1)
        .and_then(|f| f.split(".SH").next())
        .expect("a FILES section");
    assert_contains!(files, "/etc/default/pmcheck");
    let have_man = std::process::Command::new("man")
        .arg("--version")
        .output()
        .is_ok();
    assert!(
        have_man || std::env::var("CI").as_deref() != Ok("true"),
        "CI=true and man is missing: scripts/test installs man-db"
    );
    if have_man {
        let shown = std::process::Command::new("sh")
            .args(["-c", "\"$0\" generate man | man -l - | cat"])
            .arg(bin())
            .env("MANPAGER", "cat")
            .output()
            .unwrap();
        assert_contains!(
            String::from_utf8_lossy(&shown.stdout),
            "EXAMPLES",
            "the documented one-liner shows the page: {shown:?}"
        );
    } else {
        eprintln!(
            "!!!!!!!! man is not installed: the one-liner `pmcheck generate man | man -l -` was not run"
        );
    }
}

/// `pmcheck drain ... | head -0`: a reader that went away ends the words, not the command. The
/// drain is written, each command exits with its own status, and none panics (exit 101), on
/// standard output or standard error.
#[test]
fn a_closed_pipe_ends_the_words_not_the_command() {
    let s = Setup::new(Behavior::Running);
    let state = s.state.path().display().to_string();
    let closed = || {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        writer
    };
    let drain = pmcheck()
        .args(["drain", "--reason", "closed pipe", "--state-dir", &state])
        .stdout(closed())
        .output()
        .unwrap();
    assert_eq!(drain.status.code(), Some(0), "{}", stderr(&drain));
    assert!(!stderr(&drain).contains("panicked"), "{}", stderr(&drain));
    let record = std::fs::read_to_string(s.state.path().join("drain")).unwrap();
    assert!(record.contains("closed pipe"), "{record}");
    for args in [
        &["status", "--history", "5", "--state-dir", &state][..],
        &["generate", "completions", "bash"],
        &["generate", "man"],
        &["config", "--state-dir", &state],
    ] {
        let out = pmcheck().args(args).stdout(closed()).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains("panicked"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // Both closed: `undrain` still lets go, and says nothing anywhere.
    let undrain = pmcheck()
        .args(["undrain", "--state-dir", &state])
        .stdout(closed())
        .stderr(closed())
        .output()
        .unwrap();
    assert_eq!(undrain.status.code(), Some(0));
    assert!(!s.state.path().join("drain").exists());
}
