//! `pmcheck cycle -- COMMAND`: one maintenance window. Drain, wait until it is safe, run the
//! command, wait until Puppet Server can compile again, undrain, wait until the load balancers
//! take the node back; each step reported with its duration.
//!
//! Whatever goes wrong after the drain (the command fails, Puppet Server does not come back,
//! a wait times out, a signal) leaves the node drained with a record that says why: a node
//! half-way through an upgrade must not get agents. The cycle holds the drain beside whoever
//! else does ([`crate::drain::holders`]): an operator's drain from before, another cycle. It
//! lets go of its own hold only, and the node returns to rotation when nobody holds it.
//!
//! Its drain goes through the last-server guard ([`crate::operator::guard`]): while a load
//! balancer would hold it (another master's cycle has the other servers out), the cycle waits
//! its turn, saying so every 10 s, within `--max-wait`; a drain held after it took effect (the
//! other servers left meanwhile) lets go and waits its turn again, since nothing ran yet.
//!
//! Over 500 lines on purpose: the six steps, their one error type and the cycle's hold in the
//! record (taking it, letting go, marking it stopped) are one story, read top to bottom; the
//! hold's functions return the steps' errors, so a file of their own would import this one back.

use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use thiserror::Error;

use crate::console::{errln, outln};
use crate::drain::file::{Change, DrainError, DrainFile, Locked};
use crate::drain::holders::Holder;
use crate::drain::holding::Release;
use crate::drain::log::{Action, Event};
use crate::drain::record::{DrainRecord, REASON_LIMIT};
use crate::drain::tenure::Tenure;
use crate::operator::command::{Signals, exited, run_command, shown};
use crate::operator::daemon::{Daemon, EVERY};
use crate::operator::goal::{Goal, Wait};
use crate::operator::guard::{self, GuardError, Outcome, Request};
use crate::operator::wait::{self, Ticker, WaitError};
use crate::operator::warn;
use crate::protocol::lines::{Blocker, said};
use crate::settings::duration::format_duration;
use crate::text::seconds;

/// What the cycle does.
#[derive(Debug, Clone)]
pub struct Cycle {
    /// Why, for the drain record.
    pub reason: String,
    /// The daemon, and how long each wait may take.
    pub wait: Wait,
    /// Drain even when a load balancer says this node is the last server taking traffic, and
    /// run the command even when one has no server left for agents.
    pub force: bool,
    /// How long the command's processes get after a signal is passed on, before SIGKILL.
    pub kill_after: Duration,
    /// The command to run while drained.
    pub command: Vec<OsString>,
}

/// A step of the cycle, as its progress lines name it (`pmcheck cycle: step wait-drained ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Writing this cycle's hold into the drain record.
    Drain,
    /// Waiting until it is safe to stop Puppet Server.
    WaitDrained,
    /// Running the command.
    Command,
    /// Waiting until Puppet Server can compile again.
    WaitHealthy,
    /// Letting go of the hold.
    Undrain,
    /// Waiting until the load balancers took the node back.
    WaitUndrained,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Step::Drain => "drain",
            Step::WaitDrained => "wait-drained",
            Step::Command => "command",
            Step::WaitHealthy => "wait-healthy",
            Step::Undrain => "undrain",
            Step::WaitUndrained => "wait-undrained",
        })
    }
}

/// Why a cycle stopped. The node is left drained in every case but [`CycleError::Released`],
/// where somebody else undrained it (`pmcheck undrain --force`): the cycle leaves it so.
#[derive(Debug, Error)]
pub enum CycleError {
    /// The daemon cannot be asked: nothing was done.
    #[error("nothing done: {0}")]
    NoDaemon(WaitError),
    /// The daemon runs but did not answer the guard: nothing was done.
    #[error("nothing done: {0}")]
    Unasked(GuardError),
    /// The daemon cannot use its load balancer key file: nothing was done.
    #[error("nothing done: {0}")]
    KeyFile(GuardError),
    /// The drain record cannot be written or replaced: nothing was run.
    #[error(transparent)]
    Drain(#[from] DrainError),
    /// A load balancer said this node was the last server taking traffic for all of
    /// `--max-wait`: nothing was done.
    #[error(
        "nothing done: refused: its turn did not come within --max-wait {}: {}; bring another compile master back first, or pass --force (the drain record notes it)",
        format_duration(*.waited),
        said(.held)
    )]
    Turn {
        /// Where the drain would be held.
        held: Vec<Blocker>,
        /// How long the cycle waited: `--max-wait`.
        waited: Duration,
    },
    /// Drained, a load balancer has no server left for agents (another master fell out
    /// meanwhile): the cycle let go of the node instead of running the command.
    #[error(
        "before the command: {said}; running it now would leave agents no compile master at \
         all, so this cycle let go ({left}) and ran nothing. Bring another compile master \
         back first, or pass --force"
    )]
    EmptyBackend {
        /// What the load balancers said.
        said: String,
        /// What letting go did.
        left: String,
    },
    /// A wait for the drain, Puppet Server's health or the undrain timed out.
    #[error("{step}: {source}{left}")]
    Wait {
        /// The step that waited.
        step: Step,
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
    /// The drain record stopped naming this cycle during a wait: it does not go on as if
    /// it held the node.
    #[error(
        "{step}: the drain record no longer holds this cycle (`pmcheck undrain --force`?); found {found}; stopping here"
    )]
    Released {
        /// The step that waited.
        step: Step,
        /// What the record says instead.
        found: String,
    },
    /// SIGINT, SIGTERM or SIGHUP.
    #[error("interrupted during {step}{left}")]
    Interrupted {
        /// The step it stopped in.
        step: Step,
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
                step: Step::WaitHealthy,
                source: WaitError::TimedOut { .. },
                ..
            }
        )
    }
}

const LEFT_DRAINED: &str = "; the node stays drained";

/// Runs the cycle with the drain record in `state_dir`, asking `daemon`.
pub async fn run(cycle: &Cycle, state_dir: &Path, daemon: &Daemon) -> Result<(), CycleError> {
    let started = Instant::now();
    let command = shown(&cycle.command);
    let mut signals = Signals::new().map_err(|e| CycleError::Command {
        command: command.clone(),
        how: format!("was not run: cannot catch signals: {e}"),
    })?;
    // Nothing is touched unless the daemon answers, about this drain record: without it
    // nobody can tell when it is safe.
    let file = DrainFile::new(state_dir);
    ask_daemon(daemon, &file).await?;

    // 1. drain: this cycle holds the node drained, beside whoever already does, in its turn
    // 2. wait until the load balancers acted and the agents left
    let (me, done) = drained_in_turn(cycle, daemon, &file, &mut signals, started).await?;
    for warning in &done.warnings {
        errln!("pmcheck cycle: warning: {warning}");
    }
    // From here on every failure leaves the node drained, and says so in our holder.
    match drained_steps(cycle, daemon, &file, &mut signals).await {
        Ok(true) => {}
        Ok(false) => {
            outln!("pmcheck cycle: done in {}", seconds(started.elapsed()));
            return Ok(());
        }
        Err(e) => {
            stopped(&file, &me, &e, &mut signals).await;
            return Err(e);
        }
    }

    // 6. wait until the load balancers take it back
    let t = Instant::now();
    let done = wait_step(
        Step::WaitUndrained,
        Goal::Undrained,
        daemon,
        cycle,
        &mut signals,
        None,
    )
    .await
    .map_err(undrained_already)?;
    step(Step::WaitUndrained, t, &done.summary);
    outln!("pmcheck cycle: done in {}", seconds(started.elapsed()));
    Ok(())
}

/// The steps made while this cycle holds the node: the point of no return, the command
/// (3), the wait until Puppet Server can compile again (4), letting go (5). Whether the node
/// returns to rotation, so that the load balancers are waited for.
async fn drained_steps(
    cycle: &Cycle,
    daemon: &Daemon,
    file: &DrainFile,
    signals: &mut Signals,
) -> Result<bool, CycleError> {
    give_back_if_needed(cycle, daemon, file, signals).await?;

    // 3. the command
    let ended = command_step(cycle, signals).await?;

    // 4. wait until Puppet Server can compile again
    let t = Instant::now();
    let done = wait_step(
        Step::WaitHealthy,
        Goal::Healthy { since: ended },
        daemon,
        cycle,
        signals,
        Some(file),
    )
    .await?;
    step(Step::WaitHealthy, t, &done.summary);

    // 5. undrain: this cycle lets go; the node returns only if nobody else holds it
    let t = Instant::now();
    let locked = locked(file, signals, Step::Undrain, LEFT_DRAINED).await?;
    let release = let_go(locked)?;
    // Holders left: the daemon says whether they still hold the node. The stop's hold of this
    // restart's own stop holds nothing once Puppet Server is back ([`crate::health::hold`]),
    // though `on-start` may not have taken it out of the record yet; another stop since holds.
    let restarted = match &release {
        Release::StillHeld(_) => wait::answered(daemon, false).await.is_ok(),
        _ => false,
    };
    let said = match (&release, restarted) {
        (Release::StillHeld(held), true) => format!(
            "this cycle let go; what else the record holds ended with this restart: {}",
            holders(held)
        ),
        (release, _) => described(release, file),
    };
    step(Step::Undrain, t, &said);
    Ok(restarted || matches!(release, Release::Undrained))
}

/// Steps 1 and 2: this cycle's hold, in its turn, and the wait until the load balancers
/// acted and the agents left; a drain held meanwhile (the other servers left) lets go and
/// waits its turn again, since nothing ran yet. The hold, and what the wait met.
async fn drained_in_turn(
    cycle: &Cycle,
    daemon: &Daemon,
    file: &DrainFile,
    signals: &mut Signals,
    started: Instant,
) -> Result<(Holder, wait::Done), CycleError> {
    loop {
        let t = Instant::now();
        let (me, detail) = take_turn(cycle, daemon, file, signals, started).await?;
        step(Step::Drain, t, &detail);
        let t = Instant::now();
        let drained = Goal::Drained;
        match wait_step(
            Step::WaitDrained,
            drained,
            daemon,
            cycle,
            signals,
            Some(file),
        )
        .await
        {
            Ok(done) => {
                step(Step::WaitDrained, t, &done.summary);
                return Ok((me, done));
            }
            Err(CycleError::Wait {
                source: WaitError::Held { held, .. },
                ..
            }) => {
                let released = match locked(file, signals, Step::WaitDrained, LEFT_DRAINED).await {
                    Ok(locked) => let_go(locked)?,
                    Err(e) => {
                        stopped(file, &me, &e, signals).await;
                        return Err(e);
                    }
                };
                let left = described(&released, file);
                errln!(
                    "pmcheck cycle: drain held before the command: {}; this cycle let go ({left}) and waits its turn again",
                    said(&held)
                );
            }
            Err(e) => {
                stopped(file, &me, &e, signals).await;
                return Err(e);
            }
        }
    }
}

/// The point of no return. The guard looked before the drain; if another master fell out
/// since, this node is the one agents could still have: give it back.
async fn give_back_if_needed(
    cycle: &Cycle,
    daemon: &Daemon,
    file: &DrainFile,
    signals: &mut Signals,
) -> Result<(), CycleError> {
    if cycle.force {
        return Ok(());
    }
    let empty = match daemon.ask().await {
        Ok(view) => view.empty_backends(),
        Err(_) => return Ok(()),
    };
    if empty.is_empty() {
        return Ok(());
    }
    let said = empty.join("; ");
    // The trail says why the hold goes: the command was refused, as a drain would be.
    let locked = locked(file, signals, Step::WaitDrained, LEFT_DRAINED).await?;
    warn(locked.log(&[Event::refused(&cycle.reason, &said, SystemTime::now())]));
    let left = described(&let_go(locked)?, file);
    Err(CycleError::EmptyBackend { said, left })
}

/// The daemon answers, and watches this drain record.
async fn ask_daemon(daemon: &Daemon, file: &DrainFile) -> Result<(), CycleError> {
    let view = daemon
        .ask()
        .await
        .map_err(|e| CycleError::NoDaemon(WaitError::NoDaemon(e)))?;
    match view.other_file(daemon.url(), &file.resolved()) {
        Some(e) => Err(CycleError::NoDaemon(e.into())),
        None => Ok(()),
    }
}

/// Step 3: the command, which must exit 0; when it ended.
async fn command_step(cycle: &Cycle, signals: &mut Signals) -> Result<Instant, CycleError> {
    let t = Instant::now();
    let command = shown(&cycle.command);
    let status = run_command(&cycle.command, signals, cycle.kill_after)
        .await
        .map_err(|how| match how {
            None => CycleError::Interrupted {
                step: Step::Command,
                left: LEFT_DRAINED,
            },
            Some(how) => CycleError::Command {
                command: command.clone(),
                how,
            },
        })?;
    let ended = Instant::now();
    if !status.success() {
        return Err(CycleError::Command {
            command,
            how: exited(status),
        });
    }
    step(Step::Command, t, &format!("{command} exited 0"));
    Ok(ended)
}

/// A failure after the undrain says the node is undrained already.
fn undrained_already(e: CycleError) -> CycleError {
    match e {
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
    }
}

/// Step 1: adds this cycle's hold to the record, where the last-server guard lets it; returns
/// the hold and what to say of it. While a load balancer would hold it, or held it at its
/// checks right after (another master's cycle has the other servers out), the cycle waits its
/// turn, within `--max-wait` of its start (`since`), saying so every 10 s; then refuses.
async fn take_turn(
    cycle: &Cycle,
    daemon: &Daemon,
    file: &DrainFile,
    signals: &mut Signals,
    since: Instant,
) -> Result<(Holder, String), CycleError> {
    let mut ticker = Ticker::new();
    loop {
        let mine = Holder::cycle(cycle.reason.clone(), SystemTime::now());
        let request = Request {
            mine: mine.clone(),
            replaces: |_: &Holder| false,
            force: cycle.force.into(),
            action: Action::CycleDrain,
        };
        let taking = guard::take(daemon, file, &cycle.wait, request);
        // A signal ends the step wherever it is: the lock's wait, the daemon's answer, the
        // load balancers' checks. Once the hold is written, the node stays drained, marked.
        let taken = tokio::select! {
            taken = taking => taken,
            _ = signals.next() => {
                ticker.clear();
                return Err(interrupted_taking(file, &mine, signals).await);
            }
        };
        let held = match taken {
            Ok(taken) => {
                ticker.clear();
                warn(&taken.warnings);
                return Ok((taken.mine.clone(), drained(&taken, file)));
            }
            Err(GuardError::Drain(e)) => return Err(e.into()),
            Err(e @ (GuardError::Unasked(_) | GuardError::Daemon(_))) => {
                return Err(CycleError::Unasked(e));
            }
            Err(e @ GuardError::KeyFile(_)) => return Err(CycleError::KeyFile(e)),
            Err(GuardError::LetGo(found)) => {
                ticker.clear();
                return Err(CycleError::Released {
                    step: Step::Drain,
                    found,
                });
            }
            Err(GuardError::Refused(held) | GuardError::BackedOff(held)) => held,
        };
        let waited = since.elapsed();
        if waited >= cycle.wait.max_wait {
            ticker.clear();
            return Err(no_turn(cycle, file, signals, held).await);
        }
        let ends = held.first().map(Blocker::ends).unwrap_or_default();
        ticker.show_line(&format!(
            "pmcheck cycle: waiting its turn ({} of --max-wait {}): {}; {ends}",
            seconds(waited),
            format_duration(cycle.wait.max_wait),
            said(&held)
        ));
        // Asked again as every loop asks, and in time for the line every 10 s.
        let next = EVERY.min(ticker.due_in()).max(Duration::from_millis(10));
        tokio::select! {
            () = tokio::time::sleep(next) => {}
            // A hold the guard failed to undo may still be there: said as it is.
            _ = signals.next() => {
                ticker.clear();
                return Err(interrupted_taking(file, &mine, signals).await);
            }
        }
    }
}

/// A turn that did not come within `--max-wait`: refused, and said in the event log. A trail
/// that cannot be written is only a warning (the guard's, as `drain` says it), and a signal
/// does not wait for its lock.
async fn no_turn(
    cycle: &Cycle,
    file: &DrainFile,
    signals: &mut Signals,
    held: Vec<Blocker>,
) -> CycleError {
    let why = said(&held);
    tokio::select! {
        lost = guard::log_refused(file, &cycle.reason, &why) => warn(lost),
        _ = signals.next() => return CycleError::Interrupted {
            step: Step::Drain,
            left: "; nothing was changed",
        },
    }
    CycleError::Turn {
        held,
        waited: cycle.wait.max_wait,
    }
}

/// A drain step stopped by a signal: when the record holds this cycle already, the node stays
/// drained and the hold says why; otherwise nothing was changed.
async fn interrupted_taking(file: &DrainFile, mine: &Holder, signals: &mut Signals) -> CycleError {
    let step = Step::Drain;
    if guard::let_go_of(file, Holder::is_me).is_some() {
        return CycleError::Interrupted {
            step,
            left: "; nothing was changed",
        };
    }
    let e = CycleError::Interrupted {
        step,
        left: LEFT_DRAINED,
    };
    stopped(file, mine, &e, signals).await;
    e
}

/// The drain step's line: what was written, who else holds the node, what the load balancers
/// did.
fn drained(taken: &guard::Taken, file: &DrainFile) -> String {
    let me = &taken.mine;
    let mut detail = if taken.others.is_empty() {
        let Tenure { by, since, .. } = &me.tenure;
        format!("drained: {} (by {by} since {since})", me.what)
    } else {
        let held: Vec<String> = taken.others.iter().map(Holder::describe).collect();
        format!(
            "already drained by {}: this cycle holds it too, and the node returns to rotation only when no holder is left",
            held.join(", ")
        )
    };
    if let Some(forced) = &me.forced {
        detail.push_str(&format!("; forced: {forced}"));
    }
    detail.push_str(&format!("; wrote {}", file.path().display()));
    if let Outcome::Out { lines, .. } = &taken.outcome {
        detail.push_str(&format!("; out: {}", lines.join("; ")));
    }
    detail
}

/// Step 5: takes this cycle's hold out of the record, removing the record when no holder is
/// left.
fn let_go(locked: Locked<'_>) -> Result<Release, DrainError> {
    let (release, lost) = locked.release(Holder::is_me, Action::CycleUndrain)?;
    warn(&lost);
    Ok(release)
}

/// The state directory's lock, unless a signal comes first: a Ctrl-C never waits for another
/// command's change. Interrupted during `step`, the node is `left`.
async fn locked<'a>(
    file: &'a DrainFile,
    signals: &mut Signals,
    step: Step,
    left: &'static str,
) -> Result<Locked<'a>, CycleError> {
    tokio::select! {
        locked = file.locked() => Ok(locked?),
        _ = signals.next() => Err(CycleError::Interrupted { step, left }),
    }
}

/// The undrain step's line.
fn described(release: &Release, file: &DrainFile) -> String {
    match release {
        Release::Undrained => format!("removed {}", file.path().display()),
        Release::NotDrained => format!(
            "found no drain record at {}: somebody removed it meanwhile (`pmcheck undrain --force`?); not waiting for the load balancers",
            file.path().display()
        ),
        Release::NotHeld(held) => format!(
            "skipped: somebody replaced the drain record meanwhile; it is held by {}, left as it is",
            holders(held)
        ),
        Release::StillHeld(held) => format!(
            "this cycle let go; the node stays drained, held by {}",
            holders(held)
        ),
    }
}

/// One wait, stopped by a signal, or when the drain record stops naming this cycle (`held`:
/// somebody ran `pmcheck undrain --force` or rewrote the record).
async fn wait_step(
    name: Step,
    goal: Goal,
    daemon: &Daemon,
    cycle: &Cycle,
    signals: &mut Signals,
    held: Option<&DrainFile>,
) -> Result<wait::Done, CycleError> {
    let mut found = None;
    let stop = async {
        tokio::select! {
            // The record first: a hold let go of before the wait began is found at once.
            biased;
            let_go = released(held) => found = Some(let_go),
            _ = signals.next() => {}
        }
    };
    match (wait::wait(goal, daemon, &cycle.wait, stop).await, found) {
        (Ok(done), _) => Ok(done),
        (Err(WaitError::Interrupted { .. }), Some(found)) => {
            Err(CycleError::Released { step: name, found })
        }
        (Err(WaitError::Interrupted { .. }), None) => Err(CycleError::Interrupted {
            step: name,
            left: LEFT_DRAINED,
        }),
        (Err(source), _) => Err(CycleError::Wait {
            step: name,
            source,
            left: LEFT_DRAINED,
        }),
    }
}

/// Holders, for people.
fn holders(held: &[Holder]) -> String {
    (held.iter().map(Holder::describe))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Resolves when the drain record `file` no longer holds this cycle, with what it holds
/// instead; never without a record to watch.
async fn released(file: Option<&DrainFile>) -> String {
    let Some(file) = file else {
        return std::future::pending().await;
    };
    loop {
        if let Some(found) = guard::let_go_of(file, Holder::is_me) {
            return found;
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// Turns this cycle's hold into a stopped cycle's, which keeps the node drained until
/// `pmcheck undrain`, and says why in it; a record that no longer has this cycle is left as it is.
/// While another command holds the lock, a further signal gives up saying why (the node
/// stays drained either way).
async fn stopped(file: &DrainFile, me: &Holder, e: &CycleError, signals: &mut Signals) {
    let why = match e {
        CycleError::Wait {
            step,
            source: WaitError::TimedOut { waited, .. },
            ..
        } => format!("{step} timed out after {}", format_duration(*waited)),
        CycleError::Wait { step, .. } => format!("{step} failed"),
        CycleError::Command { how, .. } => format!("the command {how}"),
        CycleError::Interrupted { step, .. } => format!("interrupted during {step}"),
        CycleError::NoDaemon(_)
        | CycleError::Unasked(_)
        | CycleError::KeyFile(_)
        | CycleError::Drain(_)
        | CycleError::Turn { .. }
        | CycleError::EmptyBackend { .. }
        | CycleError::Released { .. } => return,
    };
    // The cause is the point: shorten the operator's reason, never the cause.
    let why = format!("; cycle stopped: {why}");
    let why: String = why
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(REASON_LIMIT / 2)
        .collect();
    let keep = REASON_LIMIT - why.chars().count();
    let what: String = me.what.chars().take(keep).chain(why.chars()).collect();
    let locked = tokio::select! {
        locked = file.locked() => locked,
        _ = signals.next() => {
            errln!("pmcheck cycle: the node stays drained; interrupted again before the record said why");
            return;
        }
    };
    let updated = locked.and_then(|locked| {
        locked.update_logged(|current| {
            let Some(record) = current.and_then(|d| d.record) else {
                return (Change::Keep, Vec::new(), false);
            };
            let mut held = record.holders().to_vec();
            let Some(mine) = held.iter_mut().find(|h| h.is_me()) else {
                return (Change::Keep, Vec::new(), false);
            };
            let event = Event::of(
                Action::CycleStopped,
                &Holder {
                    what: what.clone(),
                    ..mine.clone()
                },
                SystemTime::now(),
            );
            *mine = Holder {
                kind: crate::drain::holders::Kind::StoppedCycle,
                what: what.clone(),
                process: None,
                ..mine.clone()
            };
            match DrainRecord::held_by(held) {
                Some(record) => (Change::Write(record), vec![event], true),
                None => (Change::Keep, Vec::new(), false),
            }
        })
    });
    match updated {
        Ok((true, lost)) => warn(&lost),
        Ok((false, _)) => errln!(
            "pmcheck cycle: the drain record does not hold this cycle any more; left as it is: {}",
            file.path().display()
        ),
        Err(e) => {
            errln!("pmcheck cycle: the node stays drained, but the record could not say why: {e}")
        }
    }
}

/// `pmcheck cycle: step NAME took 1.2s: DETAIL`, the line scripts may read.
fn step(name: Step, since: Instant, detail: &str) {
    outln!(
        "pmcheck cycle: step {name} took {}: {detail}",
        seconds(since.elapsed())
    );
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

    #[tokio::test]
    async fn a_stopped_cycle_keeps_its_hold_says_why_and_keeps_who_and_since() {
        let mut signals = Signals::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        let now = SystemTime::now();
        let me = Holder::cycle("x".repeat(250), now);
        let operator = Holder::drain("kernel upgrade".into(), None, now);
        let both = DrainRecord::held_by(vec![me.clone(), operator.clone()]).unwrap();
        file.write(&both).unwrap();
        let e = CycleError::Command {
            command: "`false`".into(),
            how: "exited with 1".into(),
        };
        stopped(&file, &me, &e, &mut signals).await;
        let record = file.current().unwrap().record.unwrap();
        assert_eq!(
            record.reason(),
            "kernel upgrade",
            "the operator's reason first"
        );
        assert_eq!(record.holders()[0], operator);
        let mine = &record.holders()[1];
        assert_eq!(mine.kind, crate::drain::holders::Kind::StoppedCycle);
        assert_eq!(
            mine.process, None,
            "held until `pmcheck undrain`, not until this process ends"
        );
        assert_eq!(mine.tenure, me.tenure);
        assert_eq!(mine.what.chars().count(), REASON_LIMIT);
        assert!(mine.what.starts_with("xxxx"));
        assert!(
            mine.what
                .ends_with("; cycle stopped: the command exited with 1")
        );
        // A record that no longer names this cycle is left as it is.
        stopped(&file, &me, &e, &mut signals).await;
        assert_eq!(
            file.current().unwrap().record.unwrap(),
            record,
            "not ours: kept"
        );
        // Alone, its reason is the record's.
        let short = Holder::cycle("upgrade".into(), now);
        file.write(&DrainRecord::held_by(vec![short.clone()]).unwrap())
            .unwrap();
        stopped(&file, &short, &e, &mut signals).await;
        assert_eq!(
            file.current().unwrap().record.unwrap().reason(),
            "upgrade; cycle stopped: the command exited with 1"
        );
    }
}
