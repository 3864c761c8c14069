//! Test kit, by component: [`pki`] (a CA and this host's files), [`stub`] (Puppet Server),
//! [`daemon`] (the pmcheck binary), [`http`] (raw polls), [`lb`] (a load balancer's polls),
//! [`operator`] (drains and waits), [`flood`] (hostile clients); here the [`Setup`] that ties
//! the first three together.

#![allow(dead_code)]

pub mod daemon;
pub mod flood;
pub mod http;
pub mod lb;
pub mod operator;
pub mod pki;
pub mod stub;

pub use daemon::*;
pub use http::*;
pub use pki::*;
pub use stub::*;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Asserts that `haystack` (any text) holds `needle`, showing both when it does not; an optional
/// message after them says why it should.
#[allow(unused_macros)]
macro_rules! assert_contains {
    ($haystack:expr, $needle:expr $(,)?) => {{
        let haystack: &str = &$haystack;
        let needle: &str = &$needle;
        assert!(haystack.contains(needle), "{needle:?} is not in:\n{haystack}");
    }};
    ($haystack:expr, $needle:expr, $($why:tt)+) => {{
        let haystack: &str = &$haystack;
        let needle: &str = &$needle;
        assert!(
            haystack.contains(needle),
            "{needle:?} is not in:\n{haystack}\n({})",
            format_args!($($why)+)
        );
    }};
}
#[allow(unused_imports)]
pub(crate) use assert_contains;

pub const CERTNAME: &str = "puppet01.example.test";

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A CA, this host's files signed by it, a stub Puppet Server and a state directory.
pub struct Setup {
    pub ca: Ca,
    pub files: HostFiles,
    pub stub: Stub,
    pub state: tempfile::TempDir,
}

/// A daemon that probes ten times a second and gives up on Puppet Server after a second.
pub const FAST: &[&str] = &["--interval", "100ms", "--timeout", "1s"];

/// An answer whose body starts with `word` (a verdict).
pub fn is(word: &'static str) -> impl Fn(&Reply) -> bool {
    move |a| a.body.starts_with(word)
}

impl Setup {
    /// `pmcheck serve` with this setup, [`FAST`], and `extra`.
    pub fn daemon(&self, extra: &[&str]) -> Daemon {
        Daemon::start(&self.fast_args(extra))
    }

    /// This setup's arguments with [`FAST`] and `extra`.
    pub fn fast_args(&self, extra: &[&str]) -> Vec<String> {
        let mut all = FAST.to_vec();
        all.extend_from_slice(extra);
        self.args(&all)
    }

    /// With an RSA key in PKCS#1 form, as Puppet writes it.
    pub fn new(behavior: Behavior) -> Self {
        Self::with_key(behavior, "rsa.pkcs8.pem", "rsa.pkcs1.pem")
    }

    pub fn with_key(behavior: Behavior, pkcs8_fixture: &str, key_fixture: &str) -> Self {
        let ca = Ca::new("test");
        let files = HostFiles::new(&ca, pkcs8_fixture, key_fixture);
        let stub = Stub::start(&ca, &[CERTNAME], behavior);
        let state = tempfile::tempdir().unwrap();
        Self {
            ca,
            files,
            stub,
            state,
        }
    }

    /// The settings options that point pmcheck at the stub and the state directory.
    pub fn args(&self, extra: &[&str]) -> Vec<String> {
        args(&self.files, self.stub.addr, self.state.path(), extra)
    }

    /// Runs `pmcheck COMMAND --state-dir STATE EXTRA...`.
    pub fn pmcheck(&self, command: &str, extra: &[&str]) -> std::process::Output {
        pmcheck()
            .arg(command)
            .args(["--state-dir", &self.state.path().display().to_string()])
            .args(extra)
            .output()
            .unwrap()
    }
}

/// One `pmcheck inetd` with `input` on stdin; stdin stays open unless `close_stdin`.
pub fn inetd(s: &Setup, input: &[u8], close_stdin: bool) -> Reply {
    use std::io::Write as _;
    use std::process::Stdio;
    let mut child = pmcheck()
        .arg("inetd")
        .args(s.args(&[]))
        .args(["--read-timeout", "1s"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    if !close_stdin {
        // Keep stdin open, as a client that sends nothing more would.
        std::mem::forget(stdin);
    }
    let out = child.wait_with_output().unwrap();
    parse_answer(&String::from_utf8_lossy(&out.stdout))
}

pub fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Common arguments: fast probes against `stub`, drain record in `state`.
pub fn args(files: &HostFiles, stub: SocketAddr, state: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = files.args();
    args.extend([
        "--puppet-addr".into(),
        stub.to_string(),
        "--state-dir".into(),
        state.display().to_string(),
        "--puppet-conf".into(),
        no_puppet().join("puppet.conf").display().to_string(),
    ]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Runs `pmcheck COMMAND ARGS...` to its end.
pub fn run(command: &str, args: &[String]) -> std::process::Output {
    pmcheck().arg(command).args(args).output().unwrap()
}

/// A command's standard output, as text.
pub fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command's standard error, as text.
pub fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The tests run as root (CI does): they may act as other users.
pub fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether a test that needs root may run: as root it may; otherwise it says loudly why it
/// skips, and fails in CI, which runs the tests as root (`CI=true`).
pub fn root_or_skip(needs: &str) -> bool {
    if running_as_root() {
        return true;
    }
    assert_ne!(
        std::env::var("CI").as_deref(),
        Ok("true"),
        "CI=true: this test must run as root ({needs})"
    );
    eprintln!("!!!!!!!! SKIPPED, NOT TESTED: {needs}");
    false
}
