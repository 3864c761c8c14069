//! The operator commands and exit codes: check, config, drain/undrain errors, inetd, status.

mod common;

use std::io::Write;
use std::process::{Output, Stdio};
use std::time::Duration;

use common::*;
use pmcheck::health::answer::Answer;
use pmcheck::health::verdict::Verdict;

fn run(command: &str, args: &[String]) -> Output {
    pmcheck().arg(command).args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn check_setup() -> (Setup, Vec<String>) {
    let s = Setup::with_key(Behavior::Running, "ec.pkcs8.pem", "ec.sec1.pem");
    let a = s.args(&[]);
    (s, a)
}

#[test]
fn check_says_ok_with_perfdata_on_one_line() {
    let (_s, a) = check_setup();
    let ok = run("check", &a);
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    let line = stdout(&ok);
    assert!(
        line.starts_with("PMCHECK OK - Puppet Server is running, 1 of 1 JRubies free | time="),
        "{line}"
    );
    // The pool as perfdata, gauges bounded by the pool's size.
    assert_contains!(
        line,
        "s;;;0 jrubies_free=1;;;0;1 jrubies_borrowed=0;;;0;1 jrubies_waiting=0;;;0 "
    );
    // Then the days left of the certificates (the test CA's last 2,000 years: no warning).
    assert_contains!(line, " weight=100%;;;0;100 hostcert_days=");
    assert_contains!(line, ";30:;7: localcacert_days=");
    assert_eq!(line.lines().count(), 1);
    // A plugin says its line and nothing else when all is well (no INFO about the identity).
    let quiet = pmcheck()
        .env_remove("RUST_LOG")
        .arg("check")
        .args(&a)
        .output()
        .unwrap();
    assert_eq!(quiet.status.code(), Some(0), "{quiet:?}");
    assert_eq!(
        stderr(&quiet),
        "",
        "a healthy check writes nothing to stderr"
    );
}

#[test]
fn check_says_warning_when_drained() {
    let (s, a) = check_setup();
    assert!(s.pmcheck("drain", &["--reason", "maint"]).status.success());
    let warn = run("check", &a);
    assert_eq!(warn.status.code(), Some(1), "{warn:?}");
    assert!(
        stdout(&warn).starts_with(&format!("PMCHECK WARNING - maint (by {} ", whoami())),
        "{warn:?}"
    );
}

#[test]
fn check_says_critical_when_puppet_server_is_unhealthy_even_when_drained() {
    let (s, a) = check_setup();
    assert!(s.pmcheck("drain", &["--reason", "maint"]).status.success());
    s.stub.set(Behavior::Reply(503, "error", "text/plain"));
    let crit = run("check", &a);
    assert_eq!(
        crit.status.code(),
        Some(2),
        "unhealthy beats drained: {crit:?}"
    );
    assert!(stdout(&crit).starts_with("PMCHECK CRITICAL - "), "{crit:?}");
    assert_contains!(stdout(&crit), "reports `error`", "{crit:?}");
}

#[test]
fn check_says_unknown_for_usage_and_settings_errors() {
    let (s, _) = check_setup();
    let bad = pmcheck()
        .args(["check", "--timeout", "soon"])
        .output()
        .unwrap();
    assert_eq!(
        bad.status.code(),
        Some(3),
        "a usage error is UNKNOWN for check: {bad:?}"
    );
    let missing = s.state.path().join("nope.conf");
    let bad = pmcheck()
        .args(["check", "--puppet-conf", &missing.display().to_string()])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(3), "{bad:?}");
    assert!(
        stdout(&bad).starts_with("PMCHECK UNKNOWN - --puppet-conf"),
        "{bad:?}"
    );
}

#[test]
fn check_says_unknown_without_its_key() {
    let (s, a) = check_setup();
    assert!(s.pmcheck("drain", &["--reason", "maint"]).status.success());
    std::fs::remove_file(&s.files.hostprivkey).unwrap();
    let unknown = run("check", &a);
    assert_eq!(
        unknown.status.code(),
        Some(3),
        "no key, no verdict on Puppet: {unknown:?}"
    );
    assert!(
        stdout(&unknown).starts_with("PMCHECK UNKNOWN - maint"),
        "{unknown:?}"
    );
    assert_contains!(
        stdout(&unknown),
        "Puppet Server's health is unknown: cannot read hostprivkey",
        "{unknown:?}"
    );
}

#[test]
fn check_says_unknown_when_the_drain_state_is_unreadable() {
    let (s, a) = check_setup();
    std::fs::create_dir(s.state.path().join("drain")).unwrap();
    let unknown = run("check", &a);
    assert_eq!(
        unknown.status.code(),
        Some(3),
        "unreadable drain state: {unknown:?}"
    );
}

/// Every option of `config` given in its environment variable (the one clap's definition
/// names) is reported as coming from that variable: no second list of names can drift.
#[test]
fn config_names_the_environment_variable_of_every_option() {
    use clap::CommandFactory;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("puppet.conf"), "").unwrap();
    let file = |name: &str| dir.path().join(name).display().to_string();
    let cli = pmcheck::cli::Cli::command();
    let config = cli.find_subcommand("config").unwrap();
    let mut command = pmcheck();
    command.arg("config");
    let mut expected = Vec::new();
    for arg in config.get_arguments() {
        let (Some(long), Some(env)) = (arg.get_long(), arg.get_env()) else {
            continue;
        };
        let value = match long {
            "puppet-conf" => file("puppet.conf"),
            "certname" => "node1.example.com".into(),
            "hostcert" | "hostprivkey" | "localcacert" | "hostcrl" => file("x.pem"),
            "puppet-addr" => "127.0.0.1:8141".into(),
            "status-path" => "/status/v1/simple/master".into(),
            "timeout" => "2s".into(),
            "pause-grace" => "45s".into(),
            "wedged-after" => "90s".into(),
            "puppetserver-confd" => file("confd"),
            "state-dir" => file("state"),
            "listen" => "127.0.0.1:9300,[::1]:9300".into(),
            "agent-listen" => "127.0.0.1:9301".into(),
            "allow" => "10.0.0.0/8,192.0.2.7".into(),
            "lb-key-file" => file("lb-key"),
            "lb-address" => "192.0.2.10/32".into(),
            "interval" => "3s".into(),
            "max-connections" => "100".into(),
            "max-connections-per-source" => "10".into(),
            "slow-start" => "0s".into(),
            "drained-status" => "404".into(),
            "code-environment" => "production,feature_x".into(),
            // Which file to read, not a setting: no row of its own.
            "env-file" => {
                command.env(env, "none");
                continue;
            }
            other => panic!("no sample value for --{other}: add one to this test"),
        };
        command.env(env, value);
        expected.push((long, env.to_string_lossy().into_owned()));
    }
    assert!(expected.len() >= 19, "{expected:?}");
    let mut shown = Vec::new();
    let out = command.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    for (long, env) in expected {
        let row = text
            .lines()
            .find(|line| line.split_whitespace().next() == Some(long))
            .unwrap_or_else(|| panic!("no row for --{long}: {text}"));
        assert!(row.ends_with(&format!("(environment {env})")), "{row}");
        shown.push(row.to_owned());
    }
    // Lists and switches read from the environment as the daemon reads them.
    let shown = shown.join("\n");
    for value in [
        "127.0.0.1:9300,[::1]:9300",
        "10.0.0.0/8,192.0.2.7/32",
        "slow-start                 off",
        "drained-status             404",
    ] {
        assert!(shown.contains(value), "{value}: {shown}");
    }
}

#[test]
fn config_says_where_every_value_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("puppet.conf");
    std::fs::write(
        &conf,
        "[main]\nssldir = /srv/ssl\ncertname = from-main\n[server]\nserverport = 8141\n",
    )
    .unwrap();
    let out = pmcheck()
        .args([
            "config",
            "--puppet-conf",
            &conf.display().to_string(),
            "--hostcert",
            "/x/cert.pem",
        ])
        .env("PMCHECK_TIMEOUT", "2s")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .to_owned()
    };
    assert!(
        row("certname").contains("from-main") && row("certname").contains("[main]"),
        "{text}"
    );
    assert!(
        row("hostcert").contains("/x/cert.pem") && row("hostcert").contains("(command line)"),
        "{text}"
    );
    assert_contains!(
        row("hostprivkey"),
        "/srv/ssl/private_keys/from-main.pem",
        "{text}"
    );
    assert!(
        row("localcacert").contains("/srv/ssl/certs/ca.pem")
            && row("localcacert").contains("default"),
        "{text}"
    );
    // No webserver.conf in Puppet Server's conf.d: the port agents dial.
    assert!(
        row("puppet-addr").contains("127.0.0.1:8141") && row("puppet-addr").contains("[server]"),
        "{text}"
    );
    assert!(
        row("timeout").contains("2s") && row("timeout").contains("environment PMCHECK_TIMEOUT"),
        "{text}"
    );
    assert!(
        row("state-dir").contains("/var/lib/pmcheck") && row("state-dir").contains("default"),
        "{text}"
    );
}

#[test]
fn bad_settings_exit_78_and_usage_errors_64_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("puppet.conf");
    std::fs::write(&conf, "[main]\nthis line is broken\n").unwrap();
    let out = pmcheck()
        .args(["serve", "--puppet-conf", &conf.display().to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert_contains!(stderr(&out), &format!("{}:2", conf.display()), "{out:?}");

    let out = pmcheck()
        .args(["serve", "--interval", "fast"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert_contains!(stderr(&out), "--interval", "{out:?}");
    let out = pmcheck()
        .args(["serve", "--listen", "9200"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}

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

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// xinetd mode: one request on stdin, one answer on stdout, same verdict and body.
fn inetd_setup() -> Setup {
    Setup::with_key(Behavior::Running, "ec.pkcs8.pem", "ec.sec1.pem")
}

#[test]
fn inetd_answers_one_poll_from_one_probe() {
    let s = inetd_setup();
    let answer = inetd(&s, b"OPTIONS / HTTP/1.0\r\n\r\n", true);
    assert_eq!(answer.status_line, "HTTP/1.0 200 OK", "{answer:?}");
    assert_eq!(
        answer.body,
        "OK - Puppet Server is running, 1 of 1 JRubies free\n"
    );
    assert_eq!(
        answer.header("content-length"),
        Some(answer.body.len().to_string().as_str())
    );
    assert_eq!(s.stub.requests(), 1, "one probe for one poll");
}

#[test]
fn inetd_answers_only_the_first_of_two_pipelined_requests() {
    let s = inetd_setup();
    let answer = inetd(
        &s,
        b"GET / HTTP/1.1\r\nhost: x\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\n\r\n",
        false,
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        answer.raw.matches("HTTP/1.1 200").count(),
        1,
        "exactly one answer: {answer:?}"
    );
}

#[test]
fn inetd_answers_drained() {
    let s = inetd_setup();
    std::fs::write(s.state.path().join("drain"), "").unwrap();
    let answer = inetd(&s, b"GET / HTTP/1.0\r\n\r\n", true);
    assert_eq!(answer.status, 503);
    assert!(answer.body.starts_with("DRAINED - "), "{answer:?}");
}

#[test]
fn inetd_refuses_an_oversized_request() {
    let s = inetd_setup();
    let huge = format!(
        "GET / HTTP/1.1\r\nx-padding: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let answer = inetd(&s, huge.as_bytes(), true);
    assert_ne!(
        answer.status, 200,
        "an oversized request is refused: {answer:?}"
    );
}

/// Settings that cannot be resolved still get an answer: under xinetd stderr is the socket.
#[test]
fn inetd_answers_unknown_when_the_settings_are_bad() {
    let undrained = tempfile::tempdir().unwrap();
    let mut child = pmcheck()
        .args(["inetd", "--puppet-conf", "/nonexistent/puppet.conf"])
        .args(["--state-dir", &undrained.path().display().to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"OPTIONS / HTTP/1.0\r\n\r\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let answer = parse_answer(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(
        answer.body.starts_with(
            "UNKNOWN - cannot probe Puppet Server: --puppet-conf /nonexistent/puppet.conf"
        ),
        "{answer:?}"
    );
}

#[test]
fn inetd_ends_an_unfinished_request_at_the_read_deadline() {
    let s = inetd_setup();
    let started = std::time::Instant::now();
    let answer = inetd(&s, b"GET / HTTP/1.1\r\n", false);
    assert_eq!(
        answer.status, 0,
        "an unfinished request gets no answer: {answer:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the read deadline ends it: {:?}",
        started.elapsed()
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

#[test]
fn every_option_reads_its_environment_variable() {
    let conf = tempfile::NamedTempFile::new().unwrap();
    let conf = conf.path().display().to_string();
    let out = pmcheck()
        .args(["config"])
        .env("PMCHECK_PUPPET_CONF", &conf)
        .env("PMCHECK_CERTNAME", "env.example")
        .env("PMCHECK_PUPPET_ADDR", "127.0.0.2:9999")
        .env("PMCHECK_STATUS_PATH", "/status/v1/simple")
        .env("PMCHECK_STATE_DIR", "/tmp/pmcheck-env")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    for (value, var) in [
        ("env.example", "PMCHECK_CERTNAME"),
        ("127.0.0.2:9999", "PMCHECK_PUPPET_ADDR"),
        ("/status/v1/simple", "PMCHECK_STATUS_PATH"),
        ("/tmp/pmcheck-env", "PMCHECK_STATE_DIR"),
        (conf.as_str(), "PMCHECK_PUPPET_CONF"),
    ] {
        assert!(
            text.lines().any(|l| l.contains(value) && l.contains(var)),
            "{value} from {var}: {text}"
        );
    }
}

/// A bad value from the environment names its variable and the file the service reads it from.
#[test]
fn a_bad_value_from_the_environment_names_its_variable() {
    let out = pmcheck()
        .env("PMCHECK_INTERVAL", "5x")
        .arg("config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("PMCHECK_INTERVAL=5x") && err.contains("/etc/default/pmcheck"),
        "{err}"
    );
    // Typed on the command line: clap's own message is the whole story.
    let out = pmcheck()
        .args(["config", "--interval", "5x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(!stderr(&out).contains("hint:"), "{}", stderr(&out));
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

/// `config` reads the service's environment file as systemd does, under the process
/// environment, and says which it was.
#[test]
fn config_reads_the_environment_file_as_systemd_does_and_the_environment_wins() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pmcheck");
    std::fs::write(
        &file,
        "# settings\nPMCHECK_INTERVAL=5s\nPMCHECK_DRAINED_STATUS=\"404\"\nexport PMCHECK_SLOW_START=1s\nPMCHECK_LISTEN=\n",
    )
    .unwrap();
    let f = file.display().to_string();
    let config = |envs: &[(&str, &str)]| {
        let mut c = pmcheck();
        c.args(["config", "--certname", "x"])
            .args(["--env-file", &f]);
        for (k, v) in envs {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let row = |out: &Output, name: &str| {
        stdout(out)
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    let out = config(&[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        row(&out, "interval"),
        format!("interval 5s ({f} PMCHECK_INTERVAL)")
    );
    assert_eq!(
        row(&out, "drained-status"),
        format!("drained-status 404 ({f} PMCHECK_DRAINED_STATUS)")
    );
    assert_contains!(row(&out, "slow-start"), "(default: built in)", "{out:?}");
    assert_contains!(
        row(&out, "listen"),
        "(default: built in)",
        "an empty value is unset: {out:?}"
    );
    assert_contains!(
        stdout(&out),
        &format!("warning: {f} line 4: systemd ignores `export PMCHECK_SLOW_START=1s`"),
        "{out:?}"
    );
    let out = config(&[("PMCHECK_INTERVAL", "7s")]);
    assert_eq!(
        row(&out, "interval"),
        "interval 7s (environment PMCHECK_INTERVAL)"
    );
    std::fs::write(&file, "PMCHECK_INTERVAL=5x\n").unwrap();
    let out = config(&[]);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert_contains!(
        stderr(&out),
        &format!("{f}: PMCHECK_INTERVAL=5x: invalid value '5x'"),
        "{out:?}"
    );
}

/// `config --check` names the file or the directory that keeps the daemon from reading what it
/// needs: as the user running it, and as the unit's user when root runs it.
#[test]
fn config_check_names_what_blocks_each_file() {
    use std::os::unix::fs::PermissionsExt as _;
    if !running_as_root() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI=true: this test must run as root"
        );
        eprintln!("!!!!!!!! NOT TESTED: config --check as another user needs root");
        return;
    }
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    };
    let dir = tempfile::tempdir().unwrap();
    mode(dir.path(), 0o755);
    let ssl = dir.path().join("ssl");
    let confd = dir.path().join("conf.d");
    std::fs::create_dir(&ssl).unwrap();
    std::fs::create_dir(&confd).unwrap();
    let files = [
        ("puppet.conf", dir.path().join("puppet.conf")),
        ("hostcert", ssl.join("cert.pem")),
        ("hostprivkey", ssl.join("key.pem")),
        ("localcacert", ssl.join("ca.pem")),
        ("webserver.conf", confd.join("webserver.conf")),
    ];
    for (_, path) in &files {
        std::fs::write(path, "").unwrap();
        mode(path, 0o644);
    }
    let unit = dir.path().join("pmcheck.service");
    std::fs::write(&unit, "[Service]\nUser=nobody\n").unwrap();
    let path = |p: &std::path::PathBuf| p.display().to_string();
    let args: Vec<String> = [
        "config",
        "--check",
        "--env-file",
        "none",
        "--certname",
        "x",
        "--unit",
        &path(&unit),
        "--puppet-conf",
        &path(&files[0].1),
        "--hostcert",
        &path(&files[1].1),
        "--hostprivkey",
        &path(&files[2].1),
        "--localcacert",
        &path(&files[3].1),
        "--puppetserver-confd",
        &path(&confd),
    ]
    .map(str::to_owned)
    .to_vec();
    let out = pmcheck().args(&args).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_contains!(
        stdout(&out),
        "check: every file can be read by you (root) and by the service (user nobody",
        "{out:?}"
    );
    for (name, file) in &files {
        mode(file, 0o600);
        let out = pmcheck().args(&args).output().unwrap();
        mode(file, 0o644);
        assert_eq!(out.status.code(), Some(78), "{name}: {out:?}");
        assert_contains!(
            stdout(&out),
            &format!(
                "problem: {name} {}: {} (0600 root:root) does not let the service (user nobody",
                file.display(),
                file.display()
            ),
            "{name}: {out:?}"
        );
    }
    // The directory that blocks is named, not the file in it.
    mode(&ssl, 0o750);
    let out = pmcheck().args(&args).output().unwrap();
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert_contains!(
        stdout(&out),
        &format!(
            "problem: localcacert {}: {} (0750 root:root) does not let the service (user nobody",
            files[3].1.display(),
            ssl.display()
        ),
        "{out:?}"
    );
    // Run as nobody: the check is the user's own, and says so.
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bin())
        .args(&args)
        .env_clear()
        .envs(no_puppet_env())
        .output()
        .unwrap();
    mode(&ssl, 0o755);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert_contains!(
        stdout(&out),
        &format!(
            "problem: hostcert {}: {} (0750 root:root) does not let you (nobody) enter it",
            files[1].1.display(),
            ssl.display()
        ),
        "{out:?}"
    );
}

/// `config --check` reads the load balancers' key file as the daemon will, and names what is
/// wrong with it.
#[test]
fn config_check_refuses_a_key_file_every_user_can_read() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("lb-key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = pmcheck()
        .args(["config", "--check", "--env-file", "none", "--certname", "x"])
        .arg("--lb-key-file")
        .arg(&key)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert_contains!(
        stdout(&out),
        &format!(
            "error: the load balancer key file {} (--lb-key-file) is readable by every user (mode 644): `chmod 0640 {}`",
            key.display(),
            key.display()
        ),
        "{out:?}"
    );
}
