//! `pmcheck drain` and `pmcheck undrain`: change the drain record's holders under the state
//! directory's lock (a drain only where the last-server guard lets it:
//! [`crate::operator::guard`]), say what was decided, and with `--wait` wait for the load
//! balancers.
//!
//! And `pmcheck status --history N`: the last drain events, read from the state directory's
//! event log (its tail only), for a person or as JSON. Needs no daemon: the log is the record.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use thiserror::Error;

use crate::cli::{DrainArgs, UndrainArgs};
use crate::console::{errln, outln};
use crate::drain::file::{Change, DrainError, DrainFile};
use crate::drain::holders::{Holder, Kind};
use crate::drain::log::{Action, DrainLog, Event};
use crate::drain::record::{Drain, DrainState};
use crate::drain::tenure::Tenure;
use crate::operator::daemon::Daemon;
use crate::operator::guard::{self, GuardError, Outcome, Request, Taken, described};
use crate::operator::wait::{self, Goal, WaitError};
use crate::operator::warn;
use crate::text::seconds;

/// Why a drain or an undrain failed.
#[derive(Debug, Error)]
pub enum ChangeError {
    /// The drain record cannot be written or removed.
    #[error(transparent)]
    Drain(#[from] DrainError),
    /// The guard refused the drain, or undid it.
    #[error(transparent)]
    Guard(#[from] GuardError),
    /// `--wait` did not see its goal reached.
    #[error("{}{}", .1, left(.1, *.0))]
    Wait(Goal, WaitError),
    /// `undrain` without `--force` while running cycles hold the node.
    #[error(
        "refused: the node is held drained by {0}, which undrains it when done (if nobody else holds it); `pmcheck undrain --force` undrains now, and the cycle then leaves the node as it finds it"
    )]
    Held(String),
}

/// `pmcheck drain`: the guard refuses a drain a load balancer would hold (unless `--force`),
/// else the operator's drain replaces theirs among the holders; says what was decided, and with
/// `--wait` waits until it is safe to stop Puppet Server.
pub async fn drain(args: &DrainArgs, daemon: &Daemon) -> Result<(), ChangeError> {
    // "Safe after" counts from here: the guard's checks after the write are part of the wait.
    let began = Instant::now();
    let (how, file) = (&args.waiting, DrainFile::new(&args.state.state_dir));
    let request = Request {
        mine: Holder::drain(args.reason.clone(), args.for_, SystemTime::now()),
        force: args.force,
    };
    let taken = guard::take(daemon, &file, how, request).await;
    if let Err(GuardError::Refused(held)) = &taken {
        guard::log_refused(&file, &args.reason, held).await;
    }
    told(&taken?, &file);
    if args.wait {
        let waited = wait::wait(Goal::Drained, daemon, how, &file, std::future::pending()).await;
        let done = waited.map_err(|e| ChangeError::Wait(Goal::Drained, e))?;
        let after = seconds(began.elapsed());
        outln!("safe to stop Puppet Server after {after}: {}", done.summary);
        warn(&done.warnings);
    } else {
        outln!(
            "`pmcheck undrain` puts it back; `pmcheck drain --wait` tells when it is safe to stop Puppet Server."
        );
    }
    Ok(())
}

/// Says what the guard did with the drain written to `file`, and who else holds the node.
fn told(taken: &Taken, file: &DrainFile) {
    warn(&taken.warnings);
    for previous in &taken.held.replaced {
        let (Tenure { by, since, .. }, what) = (&previous.tenure, &previous.what);
        outln!("replaced the previous drain: {what} (by {by} since {since})");
    }
    let Tenure { by, since, until } = &taken.mine.tenure;
    let until = (until.as_ref()).map_or(String::new(), |u| format!(" until {u}"));
    let (what, path) = (&taken.mine.what, file.path().display());
    outln!("drained: {what} (by {by} since {since}{until}); wrote {path}");
    if let Some(forced) = &taken.mine.forced {
        outln!("forced: {forced}");
    }
    for other in &taken.held.others {
        outln!("also held by {}", other.describe());
    }
    match &taken.outcome {
        Outcome::Out { lines, says } => outln!("out: {}\n{says}", lines.join("; ")),
        Outcome::Unwatched { says, late } => {
            warn(late);
            outln!(
                "{says}\nHAProxy takes the node out at its next check with disable-on-404 or the agent check, else after its `fall` failed checks."
            );
        }
        Outcome::Unchecked => {}
    }
}

/// What a wait for `goal` that gave up (`e`) left the node as; the line before said what was done.
fn left(e: &WaitError, goal: Goal) -> &'static str {
    match (e, goal) {
        (WaitError::TimedOut { .. }, Goal::Drained) => " (the node stays drained)",
        (WaitError::TimedOut { .. }, Goal::Undrained) => " (the node is undrained)",
        _ => "",
    }
}

/// `pmcheck undrain`: removes the record unless a running cycle holds the node (then only with
/// `--force`), and with `--wait` waits until the load balancers took the node back.
pub async fn undrain(args: &UndrainArgs, daemon: &Daemon) -> Result<(), ChangeError> {
    let file = DrainFile::new(&args.state.state_dir);
    let (said, lost) =
        (file.locked().await?).update_logged(|current| undrained(&file, current, args.force))?;
    warn(&lost);
    outln!("{}", said.map_err(ChangeError::Held)?);
    if args.wait {
        let how = &args.waiting;
        let waited = wait::wait(Goal::Undrained, daemon, how, &file, std::future::pending()).await;
        let done = waited.map_err(|e| ChangeError::Wait(Goal::Undrained, e))?;
        let after = seconds(done.waited);
        outln!("back in rotation after {after}: {}", done.summary);
    } else {
        match wait::undrained(daemon).await {
            Ok(says) => outln!("{says}"),
            Err(warning) => errln!("pmcheck: warning: {warning}"),
        }
    }
    Ok(())
}

/// What `undrain` does with the record `current`, and what it says: removes it, unless running
/// cycles hold the node and there is no `force` (then who they are, to refuse).
fn undrained(
    file: &DrainFile,
    current: Option<Drain>,
    force: bool,
) -> (Change, Vec<Event>, Result<String, String>) {
    let now = SystemTime::now();
    let path = file.path().display();
    let Some(drain) = current else {
        // What the daemon refuses to read there (a link, a FIFO, a record too large or
        // unreadable) answers UNKNOWN, and its message names `pmcheck undrain`: cleared
        // here as a record is, the link itself and never what it points to.
        return match file.state(now) {
            DrainState::Unknown(why) if file.occupied() => (
                Change::Remove,
                vec![Event::bare(Action::Undrain, now)],
                Ok(format!(
                    "undrained: removed {path}, which pmcheck could not read as a drain record ({why})"
                )),
            ),
            _ => (
                Change::Keep,
                Vec::new(),
                Ok(format!("not drained: there is no {path}; nothing to do")),
            ),
        };
    };
    let mut said = format!("undrained: removed {path} (was: {})", drain.describe());
    let held = Drain::holders_of(Some(drain));
    let running: Vec<Holder> = held.iter().filter(|h| h.running()).cloned().collect();
    if !running.is_empty() && !force {
        return (Change::Keep, Vec::new(), Err(described(&running)));
    }
    let event = match held.iter().find(|h| h.kind == Kind::Drain).or(held.first()) {
        Some(holder) => Event::of(Action::Undrain, holder, now),
        None => Event::bare(Action::Undrain, now),
    };
    let let_go = held.iter().filter(|h| h.kind != Kind::Drain);
    said.extend(let_go.map(|h| format!("\nlet go of {}", h.describe())));
    (Change::Remove, vec![event], Ok(said))
}

/// Why the event log cannot be shown.
#[derive(Debug, Error)]
#[error("cannot read the drain event log {path}: {source}{hint}", hint = hint(source))]
pub struct HistoryError {
    pub path: PathBuf,
    pub source: io::Error,
}

fn hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::PermissionDenied => {
            "; only root and the group pmcheck read it: run the command with sudo, or as a member of pmcheck"
        }
        _ => "; check --state-dir (PMCHECK_STATE_DIR)",
    }
}

/// Prints the last `n` events, oldest first: one line each, or one JSON array.
pub fn history(state_dir: &Path, n: usize, json: bool) -> Result<(), HistoryError> {
    let log = DrainLog::new(state_dir);
    let fail = |source| HistoryError {
        path: log.path().to_owned(),
        source,
    };
    let events = log.tail(n).map_err(fail)?;
    if json {
        let text = serde_json::to_string_pretty(&events).map_err(|e| fail(e.into()))?;
        outln!("{text}");
    } else if events.is_empty() {
        outln!("no drain events in {}", log.path().display());
    } else {
        for event in &events {
            outln!("{}", event.describe());
        }
    }
    Ok(())
}
