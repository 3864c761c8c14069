//! `pmcheck on-stop`, `on-start` and `stop-guard`: what `pmcheck-drain-on-stop@.service` runs
//! around every stop of Puppet Server's unit (`PartOf=`, `After=`), so that a restart nobody
//! routed through `pmcheck cycle` (`systemctl restart`, a package upgrade) drains first. The
//! stop adds a hold of its own ([`Kind::Stop`]); `on-start` takes out that one only, once the
//! daemon let go of it. Neither ever blocks the stop nor the helper's start: whatever fails,
//! they say so and go on.

use std::ffi::OsString;
use std::ops::ControlFlow;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use tokio::signal::unix::{SignalKind, signal};

use crate::cli::{GuardArgs, OnStopArgs};
use crate::console::{errln, outln};
use crate::drain::file::{DrainError, DrainFile};
use crate::drain::holders::{Holder, Kind, Release};
use crate::drain::log::Action;
use crate::operator::config;
use crate::operator::daemon::Daemon;
use crate::operator::guard::described;
use crate::operator::wait::{self, Goal, WaitError};
use crate::operator::{run_single_threaded, warn};
use crate::protocol::lines::said;
use crate::protocol::progress::Ask;
use crate::settings::env_file::EnvFile;
use crate::systemd::Notifier;
use crate::text::seconds;

/// The unit named when `--unit` is not given.
const DEFAULT_UNIT: &str = "puppetserver.service";
/// How often the guard tries again to let go of the stop's hold when it cannot yet.
const TIDY_AGAIN: Duration = Duration::from_secs(10);

/// `pmcheck on-stop`: holds the node drained for this stop and waits within `--max-wait`;
/// every failure is said on stderr (the journal) and lets the stop go on.
pub async fn on_stop(args: &OnStopArgs) {
    let name = args.unit.as_deref().unwrap_or(DEFAULT_UNIT);
    // "Safe after" counts from here, as the stop's own time does.
    let began = Instant::now();
    if !args.drain_on_stop {
        return outln!("PMCHECK_DRAIN_ON_STOP=no: {name} stops without a drain");
    }
    // Asked first, within a bound: draining when the unit is not stopping (only this helper
    // is, as every master's package upgrade restarts it at once) would take every master out
    // together; a hung `systemctl` delays the drain by [`ASK_SYSTEMD`] at most.
    if let Some(unit) = &args.unit {
        match stopping(unit).await {
            Ok(false) => {
                return outln!("{unit} is not stopping (only this helper is): nothing drained");
            }
            Ok(true) => {}
            Err(why) => errln!(
                "pmcheck on-stop: WARNING: cannot tell whether {unit} is stopping ({why}): draining, the safe side for agents"
            ),
        }
    }
    let file = DrainFile::new(&args.state.state_dir);
    let daemon = Daemon::new(&args.waiting.daemon.url);
    // Where the rule would hold a drain (this node is a backend's last server), Puppet Server
    // stops all the same: the stop's drain is never held, and there is nothing to wait for.
    let asked = async { daemon.as_ref().ok()?.ask().await.ok() };
    let last = asked.await.map(|v| v.holding()).unwrap_or_default();
    // In place of an earlier stop's hold.
    let mine = Holder::stop(name, SystemTime::now());
    match async { (file.locked().await?).hold(&mine) }.await {
        Ok((_, lost)) => warn(&lost),
        Err(e) => return errln!("pmcheck on-stop: WARNING: {e}; {name} stops without a drain"),
    }
    let (since, path) = (&mine.tenure.since, file.path().display());
    outln!("drained for this stop of {name} (since {since}); wrote {path}");
    if !last.is_empty() {
        let said = said(&last);
        return errln!("pmcheck on-stop: WARNING: {said}: not waiting; {name} stops now");
    }
    let daemon = match daemon {
        Ok(daemon) => daemon,
        Err(e) => return errln!("pmcheck on-stop: WARNING: {e}; {name} stops now"),
    };
    // The wait's first question finds out whether the daemon can be asked at all.
    let never = std::future::pending();
    match wait::wait(Goal::Drained, &daemon, &args.waiting, &file, never).await {
        Ok(done) => outln!(
            "safe to stop after {}: {}; {name} stops now",
            seconds(began.elapsed()),
            done.summary
        ),
        Err(WaitError::NoDaemon(e)) => errln!(
            "pmcheck on-stop: WARNING: {e}; the load balancers were not waited for: {name} stops now, and agents still sent here fail"
        ),
        Err(e) => errln!("pmcheck on-stop: WARNING: {e}; {name} stops now"),
    }
}

/// `pmcheck on-start`: takes the stop's hold, and nothing else, out of the record once a probe
/// made since finds Puppet Server healthy ([`crate::health::hold::live`]), at once when no
/// daemon can be asked (none answers the load balancers), after `--max-wait` at the latest.
pub async fn on_start(args: &OnStopArgs) -> Result<(), DrainError> {
    let file = DrainFile::new(&args.state.state_dir);
    let name = args.unit.as_deref().unwrap_or(DEFAULT_UNIT);
    let record = file.current().and_then(|d| d.record);
    if record.is_some_and(|r| r.holders().iter().any(|h| h.kind == Kind::Stop))
        && let Ok(daemon) = Daemon::new(&args.waiting.daemon.url)
    {
        // As the daemon lets go of a stop's hold: its pool may still be warming.
        let begun = Instant::now();
        let asking = daemon.asking(Ask::default, |answer| {
            let done = answer.map_or(true, |view| {
                let probe = &view.answer.probe;
                let age = probe.age_ms.map(Duration::from_millis);
                age.is_some_and(|age| age < begun.elapsed()) && probe.healthy()
            });
            if done || begun.elapsed() >= args.waiting.max_wait {
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        });
        asking.await;
    }
    let (left, lost) =
        (file.locked().await?).release(|h| h.kind == Kind::Stop, Action::StopUndrain)?;
    warn(&lost);
    match left {
        Release::NotDrained => outln!("{name} started; not drained"),
        Release::Undrained => outln!(
            "{name} started: let go of the stop's hold, once pmcheck's probe found Puppet Server ready"
        ),
        Release::NotHeld(rest) | Release::StillHeld(rest) => outln!(
            "{name} started; the node stays drained, held by {}",
            described(&rest)
        ),
    }
    Ok(())
}

/// `pmcheck stop-guard`: READY at once, `on-start` in the background (again every 10 s while
/// it cannot write, so a read-only state directory does not fail the helper), then `on-stop` on
/// SIGTERM. A signal, not an `ExecStop=`: systemd 257 at times cannot spawn a stop task for a
/// oneshot helper ("Failed to spawn 'stop' task", once in about 30 stops) and then stops Puppet
/// Server undrained. `on-stop` replaces this process (exec) with the environment file read
/// again: `PMCHECK_DRAIN_ON_STOP=no` written after the start counts at the next stop.
pub fn stop_guard(args: GuardArgs) -> std::io::Result<()> {
    let at_start = env_file(args.env_file.as_deref());
    let guarded = run_single_threaded(async {
        // Caught before anything else: a stop that comes at once drains too; the next stop
        // would not drain if it cannot be.
        let mut term = signal(SignalKind::terminate())?;
        // Started now (`Type=notify`): a stop queued after the start finds SIGTERM caught.
        if let Some(systemd) = Notifier::from_env() {
            systemd.notify("READY=1\nSTATUS=draining before the unit's stop");
        }
        tokio::select! {
            _ = term.recv() => {}
            () = tidy(&args.on_stop) => { term.recv().await; }
        }
        Ok::<_, std::io::Error>(())
    });
    guarded??;
    let now = env_file(args.env_file.as_deref());
    let argv: Vec<OsString> = std::env::args_os().collect();
    let e = on_stop_command(&argv, &at_start, &now).exec();
    errln!(
        "pmcheck stop-guard: WARNING: cannot run `pmcheck on-stop` with the environment file as it is now ({e}); draining with the settings read at the start"
    );
    let _ = run_single_threaded(on_stop(&args.on_stop));
    Ok(())
}

/// `on-start` until it could write, saying in the journal once why it cannot yet.
async fn tidy(args: &OnStopArgs) {
    let mut said_why = None;
    while let Err(e) = on_start(args).await {
        let why = e.to_string();
        if said_why.as_ref() != Some(&why) {
            errln!(
                "pmcheck stop-guard: WARNING: cannot let go of the last stop's hold yet: {why}; trying again every {}s (the daemon lets go of it by itself once a probe finds Puppet Server started again and healthy); the next stop still drains if the state directory is writable by then",
                TIDY_AGAIN.as_secs()
            );
            said_why = Some(why);
        }
        tokio::time::sleep(TIDY_AGAIN).await;
    }
}

/// The environment file as `config` finds it (`--env-file`, `none`, else the packaged one); empty
/// when there is none or it cannot be read, as systemd's `EnvironmentFile=-` has it.
fn env_file(given: Option<&Path>) -> EnvFile {
    config::env_file(given).ok().flatten().unwrap_or_default()
}

/// The program to exec: the path the guard was started by (`/usr/bin/pmcheck`, which after a
/// package upgrade is the new one), else this process's own file, deleted or not (an upgrade
/// replaced it, a purge removed it: `current_exe()` then names a path that is gone).
fn program(argv: &[OsString]) -> PathBuf {
    (argv.first().map(PathBuf::from))
        .filter(|path| path.is_absolute() && path.is_file())
        .unwrap_or_else(|| PathBuf::from("/proc/self/exe"))
}

/// `pmcheck on-stop` with the guard's arguments (`argv` from the program on, `--env-file` left
/// out), in this process's environment with the environment file `now` in place of
/// `at_start`: a variable the file no longer sets is gone.
fn on_stop_command(argv: &[OsString], at_start: &EnvFile, now: &EnvFile) -> Command {
    let mut command = Command::new(program(argv));
    let mut args = argv.iter().skip(1);
    let mut guard = false;
    while let Some(arg) = args.next() {
        if !guard && arg == "stop-guard" {
            guard = true;
            command.arg("on-stop");
        } else if arg == "--env-file" {
            args.next();
        } else if !arg.as_encoded_bytes().starts_with(b"--env-file=") {
            command.arg(arg);
        }
    }
    for (gone, _) in (at_start.vars.iter()).filter(|(name, _)| now.get(name).is_none()) {
        command.env_remove(gone);
    }
    command.envs(now.vars.iter().map(|(name, value)| (name, value)));
    command
}

/// How long systemd is given to say whether the unit is stopping: the stop waits meanwhile.
const ASK_SYSTEMD: Duration = Duration::from_secs(2);

/// Whether systemd has a stop or restart job queued for `unit`; `Err` says why `systemctl`
/// cannot tell within [`ASK_SYSTEMD`] (not under systemd, killed, hung), and the caller drains,
/// the safe side for agents.
async fn stopping(unit: &str) -> Result<bool, String> {
    let asked = tokio::process::Command::new("systemctl")
        .args(["list-jobs", "--no-legend", "--plain", "--full"])
        .kill_on_drop(true)
        .output();
    let secs = ASK_SYSTEMD.as_secs();
    let out = (tokio::time::timeout(ASK_SYSTEMD, asked).await)
        .map_err(|_| format!("`systemctl list-jobs` did not answer within {secs}s"))?
        .map_err(|e| format!("cannot run `systemctl list-jobs`: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let said: Vec<&str> = stderr.trim().lines().collect();
        let said = (!said.is_empty()).then(|| format!("; it said: {}", said.join(" / ")));
        let (status, said) = (out.status, said.unwrap_or_default());
        return Err(format!("`systemctl list-jobs` ended with {status}{said}"));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&unit)
            && (fields.get(2)).is_some_and(|kind| ["stop", "restart", "try-restart"].contains(kind))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn on_stop_is_the_program_the_guard_was_started_by_while_that_is_there() {
        let exe = std::env::current_exe().expect("the test binary's path");
        assert_eq!(program(&[exe.clone().into_os_string()]), exe);
        assert_eq!(
            program(&[OsString::from("pmcheck")]),
            Path::new("/proc/self/exe"),
            "a relative argv[0] is not looked up"
        );
    }

    #[test]
    fn on_stop_gets_the_guards_arguments_and_the_environment_file_as_it_is_now() {
        let argv: Vec<OsString> = [
            "/usr/bin/pmcheck-not-there",
            "stop-guard",
            "--unit",
            "puppetserver.service",
            "--env-file",
            "/etc/x",
            "--max-wait=30s",
            "--env-file=/etc/y",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let at_start = EnvFile::parse(
            Path::new("/etc/x"),
            "PMCHECK_DRAIN_ON_STOP=no\nPMCHECK_URL=a\n",
        );
        let now = EnvFile::parse(Path::new("/etc/x"), "PMCHECK_URL=b\nPMCHECK_MAX_WAIT=90s\n");
        let command = on_stop_command(&argv, &at_start, &now);
        assert_eq!(
            command.get_program(),
            "/proc/self/exe",
            "a program path that is gone (an upgrade, a purge) is this process's own file"
        );
        let args: Vec<&OsStr> = command.get_args().collect();
        assert_eq!(
            args,
            [
                "on-stop",
                "--unit",
                "puppetserver.service",
                "--max-wait=30s"
            ]
        );
        let mut env: Vec<(String, Option<String>)> = command
            .get_envs()
            .map(|(k, v)| {
                let text = |s: &OsStr| s.to_string_lossy().into_owned();
                (text(k), v.map(text))
            })
            .collect();
        env.sort();
        assert_eq!(
            env,
            [
                ("PMCHECK_DRAIN_ON_STOP".to_owned(), None),
                ("PMCHECK_MAX_WAIT".to_owned(), Some("90s".to_owned())),
                ("PMCHECK_URL".to_owned(), Some("b".to_owned())),
            ],
            "a variable the file no longer sets is gone; the others are as the file says now"
        );
    }
}
