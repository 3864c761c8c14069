//! The command a cycle runs: in a process group of its own, signalled as a whole when the cycle
//! is interrupted, killed after `--kill-after`, and told as a person would type it.

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};

use crate::console::errln;
use crate::settings::duration::format_duration;

/// Runs the command in a process group of its own. On SIGINT, SIGTERM or SIGHUP the same
/// signal goes to the whole group, then SIGTERM (a shell's background jobs ignore SIGINT);
/// after `kill_after`, or at a second signal, SIGKILL does.
/// Returns once the group is gone. A daemon the command started in a session of its own (a
/// Puppet Server restart does) is not in the group and keeps running, as it should.
/// `Err(None)` is an interruption, `Err(Some(how))` a command that could not start.
pub async fn run_command(
    command: &[OsString],
    signals: &mut Signals,
    kill_after: Duration,
) -> Result<ExitStatus, Option<String>> {
    let Some((program, args)) = command.split_first() else {
        return Err(Some("is empty".to_owned()));
    };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .process_group(0)
        .spawn()
        .map_err(|e| Some(format!("cannot start: {e}")))?;
    let waited =
        |status: std::io::Result<_>| status.map_err(|e| Some(format!("cannot be waited for: {e}")));
    let Some(group) = (child.id().and_then(|id| i32::try_from(id).ok())).map(Pid::from_raw) else {
        // Already reaped: it ended before it could be signalled.
        return waited(child.wait().await);
    };
    let first = tokio::select! {
        status = child.wait() => {
            let status = waited(status)?;
            // What the command left running in its group is the command's too (`job &`): the
            // node must not return while it runs.
            if killpg(group, None).is_ok() {
                errln!(
                    "pmcheck cycle: the command {}; waiting for the processes it left in its group",
                    exited(status)
                );
            }
            tokio::select! {
                () = group_gone(group, &mut child) => return Ok(status),
                signal = signals.next() => signal,
            }
        }
        signal = signals.next() => signal,
    };
    let _ = killpg(group, first);
    // A shell's background jobs ignore SIGINT: SIGTERM asks them too.
    if first != Signal::SIGTERM {
        let _ = killpg(group, Signal::SIGTERM);
    }
    // Said at once: the operator who pressed Ctrl-C learns that a second one kills.
    let after = format_duration(kill_after);
    errln!(
        "pmcheck cycle: {first}: stopping the command's processes; SIGKILL after {after} or at a second signal"
    );
    tokio::select! {
        () = group_gone(group, &mut child) => return Err(None),
        () = tokio::time::sleep(kill_after) => {
            errln!(
                "pmcheck cycle: the command's processes are still running {after} after {first}: SIGKILL"
            );
        }
        second = signals.next() => {
            errln!("pmcheck cycle: {second} again: SIGKILL to the command's processes");
        }
    }
    let _ = killpg(group, Signal::SIGKILL);
    let _ = tokio::time::timeout(Duration::from_secs(5), group_gone(group, &mut child)).await;
    Err(None)
}

/// Resolves once no process of `group` is left, reaping its leader, `child`.
async fn group_gone(group: Pid, child: &mut tokio::process::Child) {
    loop {
        let _ = child.try_wait();
        if killpg(group, None) == Err(nix::errno::Errno::ESRCH) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// SIGINT, SIGTERM and SIGHUP, caught for the whole cycle so that none kills it half-way.
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Catches the three signals from now on.
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// Resolves at the next signal, with which.
    pub async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }

    /// `work`, unless a signal comes first (`None`): a Ctrl-C never waits for a lock, the
    /// daemon or the load balancers.
    pub async fn unless<T>(&mut self, work: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            done = work => Some(done),
            _ = self.next() => None,
        }
    }
}

/// The command as a person would type it.
pub fn shown(command: &[OsString]) -> String {
    let words: Vec<String> = (command.iter())
        .map(|w| {
            let w = w.to_string_lossy();
            if w.is_empty() || w.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
                format!("'{}'", w.replace('\'', r"'\''"))
            } else {
                w.into_owned()
            }
        })
        .collect();
    format!("`{}`", words.join(" "))
}

/// `exited with 3`, `was killed by SIGKILL`.
pub fn exited(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(name) => format!("was killed by {name}"),
            Err(_) => format!("was killed by {signal}"),
        },
        (None, None) => "ended without a status".to_owned(),
    }
}
