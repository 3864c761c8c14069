//! `pmcheck cycle -- COMMAND`: one maintenance window. Drain, wait until it is safe, run the
//! command, wait until Puppet Server can compile again, undrain, wait until the load balancers
//! take the node back; each step reported with its duration.
//!
//! Whatever goes wrong after the drain (the command fails, Puppet Server does not come back,
//! a wait times out, a signal) leaves the node drained with a record that says why: a node
//! half-way through an upgrade must not get agents. A drain somebody else made before the
//! cycle is never removed.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant, SystemTime};

use thiserror::Error;
use tokio::signal::unix::{SignalKind, signal};

use crate::health::drain::{DrainError, DrainFile, DrainRecord, REASON_LIMIT};
use crate::operator::status;
use crate::operator::wait::{self, Goal, LastServer, Wait, WaitError, seconds};
use crate::settings::duration::format_duration;

/// What the cycle does.
#[derive(Debug, Clone)]
pub struct Cycle {
    /// Why, for the drain record.
    pub reason: String,
    /// The daemon, and how long each wait may take.
    pub wait: Wait,
    /// Drain even when a load balancer says this node is the last server taking traffic.
    pub force: bool,
    /// The command to run while drained.
    pub command: Vec<OsString>,
}

/// Why a cycle stopped; the node is left drained in every case but [`CycleError::Undrained`].
#[derive(Debug, Error)]
pub enum CycleError {
    /// The daemon cannot be asked: nothing was done.
    #[error("nothing done: {0}")]
    NoDaemon(WaitError),
    /// The drain record cannot be written or replaced: nothing was run.
    #[error(transparent)]
    Drain(#[from] DrainError),
    /// A load balancer says this node is the last server taking traffic: nothing was done.
    #[error("nothing done: {0}")]
    LastServer(#[from] LastServer),
    /// A wait for the drain, Puppet Server's health or the undrain timed out.
    #[error("{step}: {source}{left}")]
    Wait {
        /// The step that waited.
        step: &'static str,
        /// What was still missing.
        source: WaitError,
        /// What state the node is left in.
        left: &'static str,
    },
    /// The command failed.
    #[error("the command {command} {how}; the node stays drained")]
    Command {
        /// The command as typed.
        command: String,
        /// How it failed.
        how: String,
    },
    /// SIGINT, SIGTERM or SIGHUP.
    #[error("interrupted during {step}{left}")]
    Interrupted {
        /// The step it stopped in.
        step: &'static str,
        /// What state the node is left in.
        left: &'static str,
    },
}

impl CycleError {
    /// Puppet Server did not come back in time (as opposed to a drain or undrain wait).
    pub fn not_healthy(&self) -> bool {
        matches!(
            self,
            CycleError::Wait {
                step: "wait-healthy",
                source: WaitError::TimedOut { .. },
                ..
            }
        )
    }
}

const LEFT_DRAINED: &str = "; the node stays drained";

/// Runs the cycle with the drain record in `state_dir`.
pub async fn run(cycle: &Cycle, state_dir: &Path) -> Result<(), CycleError> {
    let started = Instant::now();
    let command = shown(&cycle.command);
    let mut signals = Signals::new().map_err(|e| CycleError::Command {
        command: command.clone(),
        how: format!("was not run: cannot catch signals: {e}"),
    })?;
    // Nothing is touched unless the daemon answers: without it nobody can tell when it is safe.
    if let Err(e) = status::ask(&cycle.wait.url).await {
        return Err(CycleError::NoDaemon(WaitError::NoDaemon(e)));
    }

    // 1. drain, unless somebody else already did
    let t = Instant::now();
    let file = DrainFile::new(state_dir);
    let theirs = file.current().filter(|d| !d.expired_at(SystemTime::now()));
    let ours = match &theirs {
        Some(d) => {
            step(
                "drain",
                t,
                &format!(
                    "already drained ({}): left in place, this cycle will not undrain",
                    d.describe()
                ),
            );
            None
        }
        None => {
            let forced = wait::guard_last_server(&cycle.wait, cycle.force).await?;
            let mut record = DrainRecord::new(cycle.reason.clone(), None, SystemTime::now());
            record.forced = forced;
            file.write(&record)?;
            step(
                "drain",
                t,
                &format!(
                    "drained: {} (by {} since {}); wrote {}",
                    record.reason,
                    record.by,
                    record.since,
                    file.path().display()
                ),
            );
            Some(record)
        }
    };
    // From here on every failure leaves the node drained, and says so in our record.
    let fail = |e: CycleError| {
        if let Some(record) = &ours {
            stopped(&file, record, &e);
        }
        e
    };

    // 2. wait until the load balancers acted and the agents left
    let t = Instant::now();
    let done = wait_step("wait-drained", Goal::Drained, &cycle.wait, &mut signals)
        .await
        .map_err(fail)?;
    step("wait-drained", t, &done.summary);
    for warning in &done.warnings {
        eprintln!("pmcheck cycle: warning: {warning}");
    }

    // 3. the command
    let t = Instant::now();
    let status = run_command(&cycle.command, &mut signals)
        .await
        .map_err(|how| match how {
            None => CycleError::Interrupted {
                step: "command",
                left: LEFT_DRAINED,
            },
            Some(how) => CycleError::Command {
                command: command.clone(),
                how,
            },
        })
        .map_err(fail)?;
    let ended = Instant::now();
    if !status.success() {
        return Err(fail(CycleError::Command {
            command,
            how: exited(status),
        }));
    }
    step("command", t, &format!("{command} exited 0"));

    // 4. wait until Puppet Server can compile again
    let t = Instant::now();
    let done = wait_step(
        "wait-healthy",
        Goal::Healthy { since: ended },
        &cycle.wait,
        &mut signals,
    )
    .await
    .map_err(fail)?;
    step("wait-healthy", t, &done.summary);

    // 5. undrain, if the drain is still ours
    let t = Instant::now();
    let Some(record) = ours else {
        step(
            "undrain",
            t,
            "skipped: the drain was there before this cycle",
        );
        println!(
            "pmcheck cycle: done in {}; the node stays drained as it was found",
            seconds(started.elapsed())
        );
        return Ok(());
    };
    let now = file.current();
    if now.as_ref().and_then(|d| d.record.as_ref()) != Some(&record) {
        step(
            "undrain",
            t,
            "skipped: somebody replaced or removed this cycle's drain record meanwhile",
        );
        println!("pmcheck cycle: done in {}", seconds(started.elapsed()));
        return Ok(());
    }
    file.remove()?;
    step("undrain", t, &format!("removed {}", file.path().display()));

    // 6. wait until the load balancers take it back
    let t = Instant::now();
    let done = wait_step("wait-undrained", Goal::Undrained, &cycle.wait, &mut signals)
        .await
        .map_err(|e| match e {
            CycleError::Wait { step, source, .. } => CycleError::Wait {
                step,
                source,
                left: "; the node is undrained, but not every load balancer has taken it back",
            },
            CycleError::Interrupted { step, .. } => CycleError::Interrupted {
                step,
                left: "; the node is already undrained",
            },
            other => other,
        })?;
    step("wait-undrained", t, &done.summary);
    println!("pmcheck cycle: done in {}", seconds(started.elapsed()));
    Ok(())
}

/// One wait, stopped by a signal.
async fn wait_step(
    name: &'static str,
    goal: Goal,
    how: &Wait,
    signals: &mut Signals,
) -> Result<wait::Done, CycleError> {
    match wait::wait(goal, how, signals.next()).await {
        Ok(done) => Ok(done),
        Err(WaitError::Interrupted { .. }) => Err(CycleError::Interrupted {
            step: name,
            left: LEFT_DRAINED,
        }),
        Err(source) => Err(CycleError::Wait {
            step: name,
            source,
            left: LEFT_DRAINED,
        }),
    }
}

/// Runs the command with this terminal; on a signal, passes SIGTERM on and waits for it.
/// `Err(None)` is an interruption, `Err(Some(how))` a command that could not start.
async fn run_command(
    command: &[OsString],
    signals: &mut Signals,
) -> Result<ExitStatus, Option<String>> {
    let Some((program, args)) = command.split_first() else {
        return Err(Some("is empty".to_owned()));
    };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .spawn()
        .map_err(|e| Some(format!("cannot start: {e}")))?;
    tokio::select! {
        status = child.wait() => status.map_err(|e| Some(format!("cannot be waited for: {e}"))),
        () = signals.next() => {
            if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
            Err(None)
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP, caught for the whole cycle so that none kills it half-way.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// Resolves at the next signal.
    async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
            _ = self.hup.recv() => {}
        }
    }
}

/// Rewrites our drain record to say why the cycle stopped, keeping who and since; a record
/// somebody else wrote meanwhile is left as it is.
fn stopped(file: &DrainFile, record: &DrainRecord, e: &CycleError) {
    if file.current().and_then(|d| d.record).as_ref() != Some(record) {
        eprintln!(
            "pmcheck cycle: the drain record is not this cycle's any more; left as it is: {}",
            file.path().display()
        );
        return;
    }
    let why = match e {
        CycleError::Wait {
            step,
            source: WaitError::TimedOut { waited, .. },
            ..
        } => format!("{step} timed out after {}", format_duration(*waited)),
        CycleError::Wait { step, .. } => format!("{step} failed"),
        CycleError::Command { how, .. } => format!("the command {how}"),
        CycleError::Interrupted { step, .. } => format!("interrupted during {step}"),
        CycleError::NoDaemon(_) | CycleError::Drain(_) | CycleError::LastServer(_) => return,
    };
    // The cause is the point: shorten the operator's reason, never the cause.
    let why = format!("; cycle stopped: {why}");
    let why: String = why
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(REASON_LIMIT / 2)
        .collect();
    let keep = REASON_LIMIT - why.chars().count();
    let reason: String = record
        .reason
        .chars()
        .take(keep)
        .chain(why.chars())
        .collect();
    let updated = DrainRecord {
        reason,
        ..record.clone()
    };
    if let Err(e) = file.write(&updated) {
        eprintln!("pmcheck cycle: the node stays drained, but the record could not say why: {e}");
    }
}

/// `pmcheck cycle: step NAME took 1.2s: DETAIL`, the line scripts may read.
fn step(name: &str, since: Instant, detail: &str) {
    println!(
        "pmcheck cycle: step {name} took {}: {detail}",
        seconds(since.elapsed())
    );
}

/// The command as a person would type it.
pub fn shown(command: &[OsString]) -> String {
    let words: Vec<String> = command
        .iter()
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
fn exited(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with {code}"),
        (None, Some(signal)) => {
            let name = nix::sys::signal::Signal::try_from(signal)
                .map_or_else(|_| signal.to_string(), |s| s.as_str().to_owned());
            format!("was killed by {name}")
        }
        (None, None) => "ended without a status".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_shown_as_typed() {
        let command: Vec<OsString> = ["systemctl", "restart", "puppetserver"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(shown(&command), "`systemctl restart puppetserver`");
        let quoted: Vec<OsString> = ["sh", "-c", "echo 'hi' there"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(shown(&quoted), r"`sh -c 'echo '\''hi'\'' there'`");
    }

    #[test]
    fn the_record_says_why_the_cycle_stopped_and_keeps_who_and_since() {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        let record = DrainRecord::new("x".repeat(250), None, SystemTime::now());
        file.write(&record).unwrap();
        let e = CycleError::Command {
            command: "`false`".into(),
            how: "exited with 1".into(),
        };
        stopped(&file, &record, &e);
        let now = file.current().unwrap().record.unwrap();
        assert_eq!((&now.by, &now.since), (&record.by, &record.since));
        assert_eq!(now.reason.chars().count(), REASON_LIMIT);
        assert!(now.reason.starts_with("xxxx"));
        assert!(
            now.reason
                .ends_with("; cycle stopped: the command exited with 1")
        );
        let theirs = DrainRecord::new("kernel upgrade".into(), None, SystemTime::now());
        file.write(&theirs).unwrap();
        stopped(&file, &record, &e);
        assert_eq!(
            file.current().unwrap().record.unwrap(),
            theirs,
            "not ours: kept"
        );
        let short = DrainRecord::new("upgrade".into(), None, SystemTime::now());
        file.write(&short).unwrap();
        stopped(&file, &short, &e);
        assert_eq!(
            file.current().unwrap().record.unwrap().reason,
            "upgrade; cycle stopped: the command exited with 1"
        );
    }
}
