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
//! its turn ([`Run::take_turn`]).

use std::time::{Duration, Instant, SystemTime};

use thiserror::Error;

use crate::cli::CycleArgs;
use crate::console::{errln, outln};
use crate::drain::file::{Change, DrainError, DrainFile};
use crate::drain::holders::{Holder, Kind, Release};
use crate::drain::log::{Action, Event};
use crate::drain::record::{Drain, DrainRecord, REASON_LIMIT};
use crate::operator::command::{Signals, exited, run_command, shown};
use crate::operator::daemon::{Daemon, EVERY};
use crate::operator::guard::{self, GuardError, Outcome, Request, described};
use crate::operator::wait::{self, Goal, Ticker, WaitError};
use crate::operator::warn;
use crate::protocol::lines::{Blocker, said};
use crate::settings::duration::format_duration;
use crate::text::seconds;

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

impl Step {
    /// What this step's failure leaves: the node drained, or after the undrain, `undrained`.
    fn left(self, undrained: &'static str) -> &'static str {
        match self {
            Step::WaitUndrained => undrained,
            _ => "; the node stays drained",
        }
    }
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

/// Why a cycle stopped; each says what it left the node as (see the module).
#[derive(Debug, Error)]
pub enum CycleError {
    /// The daemon cannot be asked: nothing was done.
    #[error("nothing done: {0}")]
    NoDaemon(WaitError),
    /// The guard could not check the drain (no answer, no key file): nothing was done.
    #[error("nothing done: {0}")]
    Guard(GuardError),
    /// The drain record cannot be written or replaced: nothing was run.
    #[error(transparent)]
    Drain(#[from] DrainError),
    /// A load balancer said this node was the last server taking traffic (`held`) for all of
    /// `--max-wait` (`waited`): nothing was done.
    #[error(
        "nothing done: refused: its turn did not come within --max-wait {}: {}; bring another compile master back first, or pass --force (the drain record notes it)",
        format_duration(*.waited),
        said(.held)
    )]
    Turn {
        held: Vec<Blocker>,
        waited: Duration,
    },
    /// Drained, a load balancer has no server left for agents (another master fell out
    /// meanwhile, as they `said`): the cycle let go of the node (which `left`) instead of
    /// running the command.
    #[error(
        "before the command: {said}; running it now would leave agents no compile master at \
         all, so this cycle let go ({left}) and ran nothing. Bring another compile master \
         back first, or pass --force"
    )]
    EmptyBackend { said: String, left: String },
    /// A wait for the drain, Puppet Server's health or the undrain (`step`) timed out.
    #[error(
        "{step}: {source}{}",
        step.left("; the node is undrained, but not every load balancer has taken it back")
    )]
    Wait { step: Step, source: WaitError },
    /// The command (as typed) failed, `how`.
    #[error("the command {command} {how}; the node stays drained")]
    Command { command: String, how: String },
    /// The drain record stopped naming this cycle during a wait (`step`); it holds what is
    /// `found` instead.
    #[error(
        "{step}: the drain record no longer holds this cycle (`pmcheck undrain --force`?); found {found}; stopping here"
    )]
    Released { step: Step, found: String },
    /// SIGINT, SIGTERM or SIGHUP, in this step.
    #[error("interrupted during {0}{left}", left = .0.left("; the node is already undrained"))]
    Interrupted(Step),
    /// SIGINT, SIGTERM or SIGHUP in the drain step, before its hold was written or once undone.
    #[error("interrupted during drain; nothing was changed")]
    Unchanged,
}

/// Runs the cycle `args` says, asking `daemon`.
pub async fn run(args: &CycleArgs, daemon: &Daemon) -> Result<(), CycleError> {
    let started = Instant::now();
    let command = shown(&args.command);
    let signals = Signals::new().map_err(|e| CycleError::Command {
        command: command.clone(),
        how: format!("was not run: cannot catch signals: {e}"),
    })?;
    // Nothing is touched unless the daemon answers, about this drain record: without it
    // nobody can tell when it is safe.
    let file = DrainFile::new(&args.state.state_dir);
    (wait::ready(daemon, &file).await).map_err(CycleError::NoDaemon)?;
    let typed = format!("pmcheck cycle: {}", command.trim_matches('`'));
    let reason = (args.reason.clone()).unwrap_or_else(|| printable(&typed, REASON_LIMIT));
    let mut run = Run {
        args,
        reason,
        daemon,
        file: &file,
        signals,
    };
    // Every failure once the hold is written leaves the node drained, and says so in it.
    let back = run.drained_steps(started).await;
    if let Err(e) = &back {
        stopped(&file, &mut run.signals, e).await;
    }
    if back? {
        // 6. wait until the load balancers take it back
        run.wait(Step::WaitUndrained, Goal::Undrained).await?;
    }
    outln!("pmcheck cycle: done in {}", seconds(started.elapsed()));
    Ok(())
}

/// What every step uses; the signals are caught for the whole run, so none kills it half-way.
struct Run<'a> {
    args: &'a CycleArgs,
    /// Why, for the drain record: `--reason`, else the command.
    reason: String,
    daemon: &'a Daemon,
    file: &'a DrainFile,
    signals: Signals,
}

impl Run<'_> {
    /// Steps 1 to 5, from the hold to letting go: whether the node returns to rotation, so
    /// that the load balancers are waited for.
    async fn drained_steps(&mut self, started: Instant) -> Result<bool, CycleError> {
        // 1 and 2: a drain held meanwhile (the other servers left) lets go and waits its turn
        // again, since nothing ran yet.
        let done = loop {
            self.take_turn(started).await?;
            let held = match self.wait(Step::WaitDrained, Goal::Drained).await {
                Err(CycleError::Wait {
                    source: WaitError::Held { held, .. },
                    ..
                }) => held,
                done => break done?,
            };
            let release = self.let_go(Step::WaitDrained, None).await?;
            let (held, left) = (said(&held), release_line(&release, self.file, false));
            errln!(
                "pmcheck cycle: drain held before the command: {held}; this cycle let go ({left}) and waits its turn again"
            );
        };
        for warning in &done.warnings {
            errln!("pmcheck cycle: warning: {warning}");
        }
        // The point of no return, unless `--force`. The guard looked before the drain; if another
        // master fell out since, this node is the one agents could still have: give it back.
        if !self.args.force {
            let empty = (self.daemon.ask().await).map_or(Vec::new(), |view| view.empty_backends());
            if !empty.is_empty() {
                let said = empty.join("; ");
                // The trail says why the hold goes: the command was refused, as a drain would be.
                let release = self.let_go(Step::WaitDrained, Some(&said)).await?;
                let left = release_line(&release, self.file, false);
                return Err(CycleError::EmptyBackend { said, left });
            }
        }
        let since = self.command_step().await?;
        self.wait(Step::WaitHealthy, Goal::Healthy { since })
            .await?;

        // 5. undrain: this cycle lets go; the node returns only if nobody else holds it
        let t = Instant::now();
        let release = self.let_go(Step::Undrain, None).await?;
        // Holders left: the daemon says whether they still hold the node. The stop's hold of
        // this restart's own stop holds nothing once Puppet Server is back
        // ([`crate::health::hold`]), though `on-start` may not have taken it out of the record
        // yet; another stop since holds.
        let restarted =
            matches!(release, Release::StillHeld(_)) && wait::undrained(self.daemon).await.is_ok();
        let line = release_line(&release, self.file, restarted);
        step(Step::Undrain, t, &line);
        Ok(restarted || matches!(release, Release::Undrained))
    }

    /// Step 1, where the guard lets it: waits its turn (see the module), saying so every 10 s,
    /// within `--max-wait` of its start (`since`); then refuses, and logs it as `drain` does (a
    /// lost trail is only a warning).
    async fn take_turn(&mut self, since: Instant) -> Result<(), CycleError> {
        let (mut ticker, max_wait, t) = (Ticker::new(), self.args.waiting.max_wait, Instant::now());
        let step = Step::Drain;
        // A signal (`None`) ends the step wherever it is: the lock's wait, the daemon's answer,
        // the load balancers' checks. Once the hold is written, the node stays drained, marked.
        let taken = loop {
            let request = Request {
                mine: Holder::cycle(self.reason.clone(), SystemTime::now()),
                force: self.args.force,
            };
            let taking = guard::take(self.daemon, self.file, &self.args.waiting, request);
            let held = match self.signals.unless(taking).await {
                Some(Err(GuardError::Refused(held) | GuardError::BackedOff(held))) => held,
                taken => break taken,
            };
            let waited = since.elapsed();
            if waited >= max_wait {
                ticker.clear();
                let logged = guard::log_refused(self.file, &self.reason, &held);
                (self.signals.unless(logged).await).ok_or(CycleError::Unchanged)?;
                let waited = max_wait;
                return Err(CycleError::Turn { held, waited });
            }
            let ends = held.first().map(Blocker::ends).unwrap_or_default();
            let (took, max, held) = (seconds(waited), format_duration(max_wait), said(&held));
            ticker.show_line(&format!(
                "pmcheck cycle: waiting its turn ({took} of --max-wait {max}): {held}; {ends}"
            ));
            // Asked again as every loop asks, and in time for the line every 10 s.
            let next = EVERY.min(ticker.due_in()).max(Duration::from_millis(10));
            if (self.signals.unless(tokio::time::sleep(next)).await).is_none() {
                break None;
            }
        };
        ticker.clear();
        match taken {
            Some(Ok(taken)) => {
                warn(&taken.warnings);
                self::step(step, t, &drained(&taken, self.file));
                Ok(())
            }
            Some(Err(GuardError::Drain(e))) => Err(e.into()),
            Some(Err(GuardError::LetGo(found))) => Err(CycleError::Released { step, found }),
            Some(Err(e)) => Err(CycleError::Guard(e)),
            // A hold already written (or one the guard failed to undo) keeps the node drained,
            // and [`stopped`] says why in it.
            None if guard::let_go_of(self.file, Holder::is_me).is_some() => {
                Err(CycleError::Unchanged)
            }
            None => Err(CycleError::Interrupted(step)),
        }
    }

    /// Step 3: the command, which must exit 0; when it ended.
    async fn command_step(&mut self) -> Result<Instant, CycleError> {
        let (t, args) = (Instant::now(), self.args);
        let ran = run_command(&args.command, &mut self.signals, args.kill_after).await;
        let (ended, command) = (Instant::now(), shown(&args.command));
        let how = match ran {
            Ok(status) if status.success() => {
                step(Step::Command, t, &format!("{command} exited 0"));
                return Ok(ended);
            }
            Ok(status) => exited(status),
            Err(Some(how)) => how,
            Err(None) => return Err(CycleError::Interrupted(Step::Command)),
        };
        Err(CycleError::Command { command, how })
    }

    /// Takes this cycle's hold out of the record (logging the drain as `refused`, if given).
    /// A Ctrl-C never waits for another command's change: `step` is interrupted, still drained.
    async fn let_go(&mut self, step: Step, refused: Option<&str>) -> Result<Release, CycleError> {
        let locked = (self.signals.unless(self.file.locked()).await)
            .ok_or(CycleError::Interrupted(step))??;
        if let Some(why) = refused {
            let event = Event::refused(&self.reason, why, SystemTime::now());
            warn(locked.log(&[event]));
        }
        let (release, lost) = locked.release(Holder::is_me, Action::CycleUndrain)?;
        warn(&lost);
        Ok(release)
    }

    /// One wait, stopped by a signal, or while the cycle holds the node, when the record stops
    /// naming it (somebody ran `pmcheck undrain --force`): it must not go on as if it held it.
    async fn wait(&mut self, step: Step, goal: Goal) -> Result<wait::Done, CycleError> {
        let t = Instant::now();
        let (file, signals) = (self.file, &mut self.signals);
        let mut found = None;
        let stop = async {
            tokio::select! {
                // The record first: a hold let go of before the wait began is found at once.
                biased;
                // After the undrain, this cycle holds nothing.
                let_go = released(file), if step != Step::WaitUndrained => found = Some(let_go),
                _ = signals.next() => {}
            }
        };
        let waited = wait::wait(goal, self.daemon, &self.args.waiting, self.file, stop).await;
        match (waited, found) {
            (Ok(done), _) => {
                self::step(step, t, &done.summary);
                Ok(done)
            }
            (Err(WaitError::Interrupted { .. }), Some(found)) => {
                Err(CycleError::Released { step, found })
            }
            (Err(WaitError::Interrupted { .. }), None) => Err(CycleError::Interrupted(step)),
            (Err(source), _) => Err(CycleError::Wait { step, source }),
        }
    }
}

/// Turns this cycle's hold into a stopped cycle's, which keeps the node drained until
/// `pmcheck undrain`, saying why (`e`). A further signal gives up waiting for the lock: the
/// node stays drained either way.
async fn stopped(file: &DrainFile, signals: &mut Signals, e: &CycleError) {
    let why = match e {
        CycleError::Wait {
            step,
            source: WaitError::TimedOut { waited, .. },
        } => format!("{step} timed out after {}", format_duration(*waited)),
        CycleError::Wait { step, .. } => format!("{step} failed"),
        CycleError::Command { how, .. } => format!("the command {how}"),
        CycleError::Interrupted(step) => format!("interrupted during {step}"),
        _ => return,
    };
    // The cause is the point: the operator's reason is shortened, never the cause.
    let why = printable(&format!("; cycle stopped: {why}"), REASON_LIMIT / 2);
    let Some(locked) = signals.unless(file.locked()).await else {
        return errln!(
            "pmcheck cycle: the node stays drained; interrupted again before the record said why"
        );
    };
    let updated = locked.and_then(|locked| {
        locked.update_logged(|current| {
            let mut held = Drain::holders_of(current);
            let Some(mine) = held.iter_mut().find(|h| h.is_me()) else {
                return (Change::Keep, Vec::new(), false);
            };
            let keep = REASON_LIMIT - why.chars().count();
            mine.what = mine.what.chars().take(keep).chain(why.chars()).collect();
            let event = Event::of(Action::CycleStopped, mine, SystemTime::now());
            mine.kind = Kind::StoppedCycle;
            mine.process = None;
            DrainRecord::held_by(held).map_or((Change::Keep, Vec::new(), false), |r| {
                (Change::Write(r), vec![event], true)
            })
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

/// The drain step's line, for scripts and people.
fn drained(taken: &guard::Taken, file: &DrainFile) -> String {
    let me = &taken.mine;
    let mut detail = if taken.held.others.is_empty() {
        let (what, by, since) = (&me.what, &me.tenure.by, &me.tenure.since);
        format!("drained: {what} (by {by} since {since})")
    } else {
        format!(
            "already drained by {}: this cycle holds it too, and the node returns to rotation only when no holder is left",
            described(&taken.held.others)
        )
    };
    detail.extend((me.forced.as_ref()).map(|forced| format!("; forced: {forced}")));
    detail.push_str(&format!("; wrote {}", file.path().display()));
    if let Outcome::Out { lines, .. } = &taken.outcome {
        detail.push_str(&format!("; out: {}", lines.join("; ")));
    }
    detail
}

/// The undrain step's line; `restarted`: what else the record holds ended with this restart.
fn release_line(release: &Release, file: &DrainFile, restarted: bool) -> String {
    let path = file.path().display();
    match release {
        Release::StillHeld(held) if restarted => format!(
            "this cycle let go; what else the record holds ended with this restart: {}",
            described(held)
        ),
        Release::Undrained => format!("removed {path}"),
        Release::NotDrained => format!(
            "found no drain record at {path}: somebody removed it meanwhile (`pmcheck undrain --force`?); not waiting for the load balancers"
        ),
        Release::NotHeld(held) => format!(
            "skipped: somebody replaced the drain record meanwhile; it is held by {}, left as it is",
            described(held)
        ),
        Release::StillHeld(held) => format!(
            "this cycle let go; the node stays drained, held by {}",
            described(held)
        ),
    }
}

/// What the record `file` holds once it no longer holds this cycle.
async fn released(file: &DrainFile) -> String {
    loop {
        if let Some(found) = guard::let_go_of(file, Holder::is_me) {
            return found;
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// `text` with a space for each control character, cut to `limit` characters: for a reason.
fn printable(text: &str, limit: usize) -> String {
    (text.chars())
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(limit)
        .collect()
}

/// `pmcheck cycle: step NAME took 1.2s: DETAIL`, the line scripts may read.
fn step(name: Step, since: Instant, detail: &str) {
    let took = seconds(since.elapsed());
    outln!("pmcheck cycle: step {name} took {took}: {detail}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

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
        stopped(&file, &mut signals, &e).await;
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
        stopped(&file, &mut signals, &e).await;
        assert_eq!(
            file.current().unwrap().record.unwrap(),
            record,
            "not ours: kept"
        );
        // Alone, its reason is the record's.
        let short = Holder::cycle("upgrade".into(), now);
        file.write(&DrainRecord::held_by(vec![short.clone()]).unwrap())
            .unwrap();
        stopped(&file, &mut signals, &e).await;
        assert_eq!(
            file.current().unwrap().record.unwrap().reason(),
            "upgrade; cycle stopped: the command exited with 1"
        );
    }
}
