//! `pmcheck drain` and `pmcheck undrain`: change the drain record's holders under the state
//! directory's lock, say what was written and what the daemon answers, and with `--wait` wait
//! for the load balancers.

use std::time::SystemTime;

use thiserror::Error;

use crate::cli::{DrainArgs, StateArgs, UndrainArgs, WaitArgs};
use crate::console::{errln, outln};
use crate::drain::file::{Change, DrainError, DrainFile};
use crate::drain::holders::{Holder, Kind};
use crate::drain::holding::Forced;
use crate::drain::log::{Action, Event, LogError};
use crate::drain::record::{Drain, DrainRecord, DrainState, Unreadable};
use crate::drain::tenure::Tenure;
use crate::operator::daemon;
use crate::operator::goal::{Goal, Wait};
use crate::operator::run_single_threaded;
use crate::operator::wait::{self, LastServer, WaitError};
use crate::text::seconds;

/// Why a drain or an undrain failed.
#[derive(Debug, Error)]
pub enum ChangeError {
    /// The drain record cannot be written or removed.
    #[error(transparent)]
    Drain(#[from] DrainError),
    /// `--wait` did not see its goal reached.
    #[error(transparent)]
    Wait(#[from] WaitError),
    /// A load balancer says this node is the last server taking traffic.
    #[error(transparent)]
    LastServer(#[from] LastServer),
    /// `undrain` without `--force` while running cycles hold the node.
    #[error(
        "refused: the node is held drained by {0}, which undrains it when done (if nobody else holds it); `pmcheck undrain --force` undrains now, and the cycle then leaves the node as it finds it"
    )]
    Held(String),
    /// The load balancer held the new drain: another master went out first, or at once.
    #[error(
        "refused: {0}. This drain was undone, so that the backend keeps a server taking agents: drain again once another master is back, or pass --force (the drain record notes it)"
    )]
    BackedOff(String),
    /// Writing to stdout or starting a runtime failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// `pmcheck drain`: refuses to drain a backend's last server (unless `--force`), adds this
/// operator's drain to the holders under the lock, says what it wrote, and with `--wait`
/// waits until it is safe to stop Puppet Server.
pub fn drain(args: DrainArgs) -> Result<(), ChangeError> {
    let how = wait_settings(&args.waiting, &args.state);
    let file = DrainFile::new(&args.state.state_dir);
    let guard = match run_single_threaded(wait::guard_last_server(&how, args.force))? {
        Ok(guard) => guard,
        Err(refused) => {
            log_refused(&file, &args.reason, &refused);
            return Err(refused.into());
        }
    };
    // `--force` on a node drained already overrides nothing the guard saw, but a load
    // balancer's hold all the same ([`crate::health::hold`]): the record says so.
    let forced = guard.forced.or_else(|| {
        args.force
            .then(|| "--force: the load balancers' hold of a drain is off".to_owned())
    });
    let mut mine = Holder::drain(args.reason, args.for_, SystemTime::now());
    mine.guarded = guard.checked;
    let forcing = forced.is_some();
    let replaces = |h: &Holder| h.kind == Kind::Drain;
    let (held, lost) = file.hold(&mine, replaces, Forced::Set(forced), Action::Drain)?;
    say_lost(lost);
    let (previous, others) = (held.before, held.others);
    // A node drained already takes nothing out: the guard let it through, and so does this.
    let fresh = !forcing
        && mine.guarded
        && previous
            .as_ref()
            .is_none_or(|p| p.expired_at(SystemTime::now()));
    if let Some(previous) = previous.filter(|p| {
        p.record
            .as_ref()
            .is_none_or(|r| r.holders().iter().any(|h| h.kind == Kind::Drain))
    }) {
        outln!("replaced the previous drain: {}", previous.describe());
    }
    let Tenure { by, since, until } = &mine.tenure;
    let until = until
        .as_ref()
        .map(|u| format!(" until {u}"))
        .unwrap_or_default();
    outln!(
        "drained: {} (by {by} since {since}{until}); wrote {}",
        mine.what,
        file.path().display()
    );
    for other in &others {
        outln!("also held by {}", other.describe());
    }
    // A new drain's effect, as the load balancers' own checks show it: held where this node
    // turned out to be the last server (another drain went out first), it is undone.
    if fresh && let Some(held) = run_single_threaded(wait::drain_held(&how))? {
        undo(&file, &mine, &held);
        return Err(ChangeError::BackedOff(held));
    }
    if !args.wait {
        match run_single_threaded(daemon::daemon_answer(&how, true))? {
            Ok(said) => outln!(
                "{said}\nHAProxy takes the node out at its next check with disable-on-404 or the agent check, else after its `fall` failed checks. `pmcheck undrain` puts it back; `pmcheck drain --wait` tells when it is safe to stop Puppet Server."
            ),
            Err(warning) => errln!("pmcheck: warning: {warning}"),
        }
        return Ok(());
    }
    let done = wait_for(Goal::Drained, &how).map_err(|e| annotate(e, "the node stays drained"))?;
    outln!(
        "safe to stop Puppet Server after {}: {}",
        seconds(done.waited),
        done.summary
    );
    for warning in &done.warnings {
        errln!("pmcheck: warning: {warning}");
    }
    Ok(())
}

/// How the waits ask the daemon about the drain record in `state`, from the command line.
pub fn wait_settings(args: &WaitArgs, state: &StateArgs) -> Wait {
    let (max_wait, deprecated) = args.max_wait();
    if deprecated {
        errln!(
            "pmcheck: warning: --timeout (PMCHECK_WAIT_TIMEOUT) of drain, undrain and cycle is deprecated: write --max-wait (PMCHECK_MAX_WAIT); --timeout is the probe's deadline elsewhere"
        );
    }
    Wait {
        url: args.daemon.url.clone(),
        max_wait,
        polls: args.polls,
        lb_interval: args.lb_interval,
        drain_file: Some(DrainFile::new(&state.state_dir).resolved()),
    }
}

/// Runs one wait on its own runtime; a signal ends the process as usual.
fn wait_for(goal: Goal, how: &Wait) -> Result<wait::Done, ChangeError> {
    Ok(run_single_threaded(wait::wait(
        goal,
        how,
        std::future::pending(),
    ))??)
}

/// A timed-out wait's error, with what became of the node (the line before said what was
/// written, so a daemon that cannot be reached needs no more).
fn annotate(e: ChangeError, left: &str) -> ChangeError {
    match e {
        ChangeError::Wait(WaitError::TimedOut { waited, pending }) => {
            ChangeError::Wait(WaitError::TimedOut {
                waited,
                pending: format!("{pending} ({left})"),
            })
        }
        other => other,
    }
}

/// `pmcheck undrain`: removes the record unless a running cycle holds the node (then only with
/// `--force`), and with `--wait` waits until the load balancers took the node back.
pub fn undrain(args: UndrainArgs) -> Result<(), ChangeError> {
    let state = args.state;
    let file = DrainFile::new(&state.state_dir);
    let force = args.force;
    let (outcome, lost) = file.update_logged(|current| {
        let Some(drain) = current else {
            // What the daemon refuses to read there (a link, a FIFO, a record too large or
            // unreadable) answers UNKNOWN, and its message names `pmcheck undrain`: cleared
            // here as a record is, the link itself and never what it points to.
            return match file.state(SystemTime::now()) {
                DrainState::Unknown(why) if file.occupied() => (
                    Change::Remove,
                    vec![Event::bare(Action::Undrain, SystemTime::now())],
                    Undrain::Cleared(why),
                ),
                _ => (Change::Keep, Vec::new(), Undrain::NotDrained),
            };
        };
        let held = drain
            .record
            .as_ref()
            .map(DrainRecord::holders)
            .unwrap_or_default();
        let running: Vec<Holder> = held.iter().filter(|h| h.running()).cloned().collect();
        if !running.is_empty() && !force {
            return (Change::Keep, Vec::new(), Undrain::Held(running));
        }
        let now = SystemTime::now();
        let events = match held.iter().find(|h| h.kind == Kind::Drain).or(held.first()) {
            Some(holder) => vec![Event::of(Action::Undrain, holder, now)],
            None => vec![Event::bare(Action::Undrain, now)],
        };
        (Change::Remove, events, Undrain::Removed(drain, held))
    })?;
    say_lost(lost);
    match outcome {
        Undrain::NotDrained => outln!(
            "not drained: there is no {}; nothing to do",
            file.path().display()
        ),
        Undrain::Cleared(why) => outln!(
            "undrained: removed {}, which pmcheck could not read as a drain record ({why})",
            file.path().display()
        ),
        Undrain::Held(running) => {
            let held: Vec<String> = running.iter().map(Holder::describe).collect();
            return Err(ChangeError::Held(held.join(", ")));
        }
        Undrain::Removed(previous, held) => {
            outln!(
                "undrained: removed {} (was: {})",
                file.path().display(),
                previous.describe()
            );
            for h in held.iter().filter(|h| h.kind != Kind::Drain) {
                outln!("let go of {}", h.describe());
            }
        }
    }
    let how = wait_settings(&args.waiting, &state);
    if args.wait {
        let done =
            wait_for(Goal::Undrained, &how).map_err(|e| annotate(e, "the node is undrained"))?;
        outln!(
            "back in rotation after {}: {}",
            seconds(done.waited),
            done.summary
        );
    } else {
        match run_single_threaded(daemon::daemon_answer(&how, false))? {
            Ok(said) => outln!("{said}"),
            Err(warning) => errln!("pmcheck: warning: {warning}"),
        }
    }
    Ok(())
}

/// Takes `mine` out of the holders again (the record goes when nobody else holds it), and
/// logs the drain as refused for `why`.
fn undo(file: &DrainFile, mine: &Holder, why: &str) {
    let result = file.update_logged(|current| {
        let now = SystemTime::now();
        let record = current.and_then(|d| d.record);
        let forced = record.as_ref().and_then(|r| r.forced.clone());
        let mut held = record
            .as_ref()
            .map(DrainRecord::holders)
            .unwrap_or_default();
        held.retain(|h| h != mine);
        let change = match DrainRecord::held_by(held, forced) {
            Some(rest) => Change::Write(rest),
            None => Change::Remove,
        };
        (change, vec![Event::refused(&mine.what, why, now)], ())
    });
    match result {
        Ok(((), lost)) => say_lost(lost),
        Err(e) => errln!("pmcheck: warning: the held drain could not be undone: {e}"),
    }
}

/// Says on stderr which events the log lost: never silently.
pub(crate) fn say_lost(lost: Vec<LogError>) {
    for e in lost {
        errln!("pmcheck: warning: {e}");
    }
}

/// Logs a drain the last-server guard refused, saying on stderr when that fails.
pub(crate) fn log_refused(file: &DrainFile, reason: &str, refused: &LastServer) {
    let event = Event::refused(reason, &refused.0, SystemTime::now());
    match file.log(&[event]) {
        Ok(lost) => say_lost(lost),
        Err(e) => errln!("pmcheck: warning: the refused drain was not logged: {e}"),
    }
}

/// What `undrain` found.
enum Undrain {
    /// No record.
    NotDrained,
    /// Running cycles hold the node, and no `--force`.
    Held(Vec<Holder>),
    /// The record was removed: what it was, and who held it.
    Removed(Drain, Vec<Holder>),
    /// What stood at the record's path and could not be read as one was removed: why not.
    Cleared(Unreadable),
}
