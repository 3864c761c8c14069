//! `pmcheck config`: where every value came from (flag, environment, the service's
//! environment file, default), bad values named, and `--check`.

mod common;

use std::process::Output;
use std::time::Duration;

use common::*;

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
    if !root_or_skip("config --check as another user needs root") {
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
    // A directory every user may enter: inside one they may not, 0644 is private.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
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

/// A misspelt name in /etc/default/pmcheck changes nothing: `config` (and `config --check`, run
/// before a restart) say so with the name it meant, and the daemon that gets it from its unit
/// says so once at start.
#[test]
fn a_name_no_option_reads_is_said_with_the_one_it_meant() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pmcheck");
    std::fs::write(&file, "PMCHECK_DRAINED_STAUTS=404\nPMCHECK_INTERVAL=5s\n").unwrap();
    let f = file.display().to_string();
    // Files every reader can read, so that the name is the check's only problem.
    let readable = |name: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, "").unwrap();
        path.display().to_string()
    };
    std::fs::write(dir.path().join("pmcheck.service"), "[Service]\n").unwrap();
    let unit = dir.path().join("pmcheck.service").display().to_string();
    let files = [
        "--hostcert",
        &readable("cert.pem"),
        "--hostprivkey",
        &readable("key.pem"),
        "--localcacert",
        &readable("ca.pem"),
        "--puppet-conf",
        &readable("puppet.conf"),
        "--puppetserver-confd",
        &dir.path().display().to_string(),
        "--unit",
        &unit,
    ]
    .map(str::to_owned);
    let want = "PMCHECK_DRAINED_STAUTS is read by no option of pmcheck (did you mean PMCHECK_DRAINED_STATUS?): it changes nothing; PMCHECK_DRAINED_STATUS keeps its default, 503";
    // Before a restart (`--check`) it is an error: drains would answer 503, DOWN in the
    // shipped backend, where the operator asked for 404.
    for (check, level, code) in [(&[][..], "warning", 0), (&["--check"][..], "error", 78)] {
        let out = pmcheck()
            .args(["config", "--certname", "x", "--env-file", &f])
            .args(&files)
            .args(check)
            .output()
            .unwrap();
        assert_contains!(stdout(&out), &format!("{level}: {f}: {want}"), "{out:?}");
        assert_eq!(out.status.code(), Some(code), "{out:?}");
        assert!(
            !stdout(&out).contains("PMCHECK_INTERVAL is read by no option"),
            "{out:?}"
        );
    }
    let s = Setup::new(Behavior::Running);
    let mut command = pmcheck();
    command.env("PMCHECK_DRAINED_STAUTS", "404");
    let d = Daemon::start_with(command, &s.args(&[]));
    d.wait_for_log(Duration::from_secs(10), want);
}
