//! The last-server guard of `drain` and `cycle`: a holder is written only where the drain rule
//! ([`crate::health::hold`]) lets it through, and taken out again when the load balancers'
//! checks right after the write hold it (another master went out at the same moment), the
//! holders it replaced put back. `--force` goes past it, and the holder records that.
//!
//! Without a daemon (nothing listens at its URL) nothing can be checked: the holder is written
//! unchecked, and a load balancer never holds it. A daemon that runs but does not answer may
//! still answer the load balancers: the drain is refused unless `--force`.

use std::ops::ControlFlow;
use std::time::{Instant, SystemTime};

use thiserror::Error;

use crate::cli::WaitArgs;
use crate::drain::file::{Change, DrainError, DrainFile};
use crate::drain::holders::{Held, Holder};
use crate::drain::log::{Event, LogError};
use crate::drain::record::{Drain, DrainRecord, DrainState};
use crate::health::hold;
use crate::operator::daemon::{Daemon, StatusError};
use crate::operator::view::View;
use crate::operator::warn;
use crate::protocol::lines::{Blocker, said};
use crate::protocol::progress::Ask;
use crate::text::seconds;

/// A holder the guard let through, as written.
#[derive(Debug)]
pub struct Taken {
    /// The holder as written: checked, and what `--force` went past.
    pub mine: Holder,
    /// The live holders beside it, and those it replaced (an operator's earlier drain).
    pub held: Held,
    /// What became of it.
    pub outcome: Outcome,
    /// What went wrong that the holder's writer should see (the event log, the daemon).
    pub warnings: Vec<String>,
}

/// What became of a holder the guard let through.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every server line a proven load balancer checks was checked since the write, and none
    /// holds the drain: each of the `lines` with what it was answered, and what the daemon
    /// `says` (`pmcheck at URL answers DRAINED (404): ...`).
    Out { lines: Vec<String>, says: String },
    /// The daemon `says` DRAINED, but no line can hold the drain, or some were not checked:
    /// what was not seen in time (`late`), if anything was awaited.
    Unwatched { says: String, late: Option<String> },
    /// No daemon answered, or it watches another record: written unchecked.
    Unchecked,
}

/// Why the guard wrote nothing, or took its holder out again.
#[derive(Debug, Error)]
pub enum GuardError {
    /// The drain rule holds a drain of the record's holders where a load balancer says this
    /// node is its backend's last server taking agents, or that none is left.
    #[error("refused: {}; draining this node would leave that backend without a server taking new agents. Bring another compile master back first, or pass --force (the drain record notes it)", said(.0))]
    Refused(Vec<Blocker>),
    /// Written, the drain was held at the load balancers' next checks, and undone.
    #[error("refused: drain held: {}. This drain was undone, so that the backend keeps a server taking agents: drain again once another master is back, or pass --force (the drain record notes it)", said(.0))]
    BackedOff(Vec<Blocker>),
    /// The daemon runs but did not answer (`0`): a drain it never checked could empty a backend.
    #[error(
        "refused: {0}, asked {ASKS} times: cannot check whether a load balancer says this node is the last server taking agents. Fix the daemon (`pmcheck status`, its log), or pass --force to drain without the check"
    )]
    Unasked(String),
    /// The daemon is of another version, whose answer this command cannot read.
    #[error("refused: {0}")]
    Daemon(StatusError),
    /// The daemon cannot use its key file (`0`): no load balancer proves its word.
    #[error(
        "refused: cannot check whether a load balancer says this node is the last server taking agents: the daemon cannot use its key file: {0}. Fix it and reload the daemon (`systemctl reload pmcheck`; `pmcheck config --check` tells first), or pass --force to drain without the check"
    )]
    KeyFile(String),
    /// Someone let go of the drain before the load balancers' checks: what the record holds.
    #[error("the drain record no longer holds this drain (`pmcheck undrain --force`?); found {0}")]
    LetGo(String),
    /// The drain record cannot be written.
    #[error(transparent)]
    Drain(#[from] DrainError),
}

/// What a command asks the guard to write.
pub struct Request {
    /// The new holder, in place of those it replaces ([`Holder::replaces`]).
    pub mine: Holder,
    /// `--force`: written even where a load balancer would hold it, saying what it went past.
    pub force: bool,
}

/// Writes the request's holder as the guard lets it.
pub async fn take(
    daemon: &Daemon,
    file: &DrainFile,
    how: &WaitArgs,
    request: Request,
) -> Result<Taken, GuardError> {
    let Request { mut mine, force } = request;
    let mut warnings = Vec::new();
    let view = view_of(daemon, file, force, &mut warnings).await?;
    let started = view.as_ref().and_then(|v| v.started());
    if let Some(view) = &view {
        // Without its key file the daemon proves no load balancer's word.
        match view.key_file_problem() {
            Some(problem) if !force => return Err(GuardError::KeyFile(problem.to_owned())),
            Some(problem) => warnings.push(format!(
                "--force: drained although the daemon cannot use its key file: {problem}"
            )),
            None => {}
        }
        mine.checked = true;
        // The holders the record would have: the live ones, less those it replaces, and it.
        let current = Drain::holders_of(file.current());
        let resulting: Vec<Holder> = (hold::live(&current, started, SystemTime::now()))
            .filter(|h| !mine.replaces(h))
            .chain([&mine])
            .cloned()
            .collect();
        let blockers = view.would_hold(&resulting);
        match (blockers.is_empty(), force) {
            (false, false) => return Err(GuardError::Refused(blockers)),
            (false, true) => mine.forced = Some(format!("--force past: {}", said(&blockers))),
            // It went past no hold: its drain is never held.
            (true, true) => mine.forced = Some("--force: never held by a load balancer".into()),
            (true, false) => warnings.extend(unproven(view)),
        }
    }
    let written = Instant::now();
    let (held, lost) = (file.locked().await?).hold(&mine)?;
    warnings.extend(lost.iter().map(ToString::to_string));
    let mut taken = Taken {
        mine,
        held,
        outcome: Outcome::Unchecked,
        warnings,
    };
    if view.is_some() {
        taken.outcome = watched(daemon, file, how, &mut taken, (written, started)).await?;
    }
    Ok(taken)
}

/// What became of a drain written at `written` (Puppet Server `started`) at the load
/// balancers' next checks: a drain held there is undone.
async fn watched(
    daemon: &Daemon,
    file: &DrainFile,
    how: &WaitArgs,
    taken: &mut Taken,
    (written, started): (Instant, Option<SystemTime>),
) -> Result<Outcome, GuardError> {
    let mine = &taken.mine;
    let live = hold::live(&taken.held.others, started, SystemTime::now());
    let holdable = live.chain([mine]).all(hold::holdable);
    let gone = || let_go_of(file, |h| h == mine);
    // Asked until the DRAINED answer settles: where the drain can be held, the daemon knows its
    // load balancers and every proven line was checked since the write. For at most `--polls`
    // + 1 check intervals, or until the drain is let go of; then the last DRAINED answer.
    let deadline = written + how.lb_interval * (how.polls + 1);
    let mut last = None;
    let watched = daemon.asking(Ask::default, |answer| {
        if gone().is_some() {
            return ControlFlow::Break(());
        }
        if let Ok(view) = answer
            && view.drained()
        {
            let settled = !holdable
                || (view.heard_all(how.lb_interval) && view.checked_within(written.elapsed()));
            last = Some((view, settled));
        }
        if matches!(last, Some((_, true))) || Instant::now() >= deadline {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    watched.await;
    if let Some(found) = gone() {
        return Err(GuardError::LetGo(found));
    }
    Ok(match last {
        Some((view, _)) if holdable && !view.held().is_empty() => {
            let held = view.held();
            let lost = undo(file, mine, &taken.held.replaced, &said(&held)).await;
            taken.warnings.extend(lost);
            return Err(GuardError::BackedOff(held));
        }
        Some((view, true)) if holdable && view.lines().next().is_some() => Outcome::Out {
            lines: (view.lines())
                .map(|l| {
                    let (told, age, who) = (l.state.told.as_str(), seconds(l.age()), l.who());
                    let (backend, server) = (&l.lb.backend, &l.lb.server);
                    format!("{who} answered {told} for {backend}/{server} ({age} ago)")
                })
                .collect(),
            says: view.says(&daemon.url),
        },
        Some((view, settled)) => Outcome::Unwatched {
            says: view.says(&daemon.url),
            late: (!settled).then(|| late(&view, how, written)),
        },
        None => {
            let (url, path) = (&daemon.url, file.path().display());
            taken.warnings.push(format!(
                "pmcheck at {url} does not answer DRAINED after the drain: is it watching {path}?"
            ));
            Outcome::Unchecked
        }
    })
}

/// The pollers whose word the guard could not use, and how to make them prove it.
fn unproven(view: &View) -> Option<String> {
    let unproven = view.unproven_views();
    let how = if view.lb_key_file.is_some() {
        "send the key of the daemon's key file from those load balancers, from an address its line names, as packaging/haproxy/pmcheck.cfg does"
    } else {
        "set PMCHECK_LB_KEY_FILE and send its key from HAProxy, as packaging/haproxy/pmcheck.cfg does"
    };
    let unproven = (!unproven.is_empty()).then(|| unproven.join("; "))?;
    Some(format!(
        "cannot check whether a load balancer says this node is the last server taking agents: {unproven}; {how}"
    ))
}

/// What the daemon watching `file` answers; `None`, and why in `warnings`, when the drain is
/// to be written unchecked (see the module). A daemon that runs is asked [`ASKS`] times.
async fn view_of(
    daemon: &Daemon,
    file: &DrainFile,
    force: bool,
    warnings: &mut Vec<String>,
) -> Result<Option<View>, GuardError> {
    let mut asked = 0;
    let found = daemon.asking(Ask::default, |answer| {
        asked += 1;
        let why = match answer {
            Ok(view) => match view.other_file(&daemon.url, &file.resolved()) {
                None => return ControlFlow::Break(Ok(Some(view))),
                Some(other) => other.to_string(),
            },
            Err(e @ StatusError::OtherVersion { .. }) => {
                return ControlFlow::Break(Err(GuardError::Daemon(e)));
            }
            Err(e) if e.absent() || force => e.to_string(),
            Err(e) if asked >= ASKS => {
                return ControlFlow::Break(Err(GuardError::Unasked(e.to_string())));
            }
            Err(_) => return ControlFlow::Continue(()),
        };
        warnings.push(format!(
            "{why}; cannot check whether a load balancer says this node is the last server taking agents: the record is written unchecked, so no load balancer holds it, and a daemon watching it answers accordingly from its start"
        ));
        ControlFlow::Break(Ok(None))
    });
    found.await
}

/// How many times the guard asks a daemon that runs but fails to answer: for two seconds, in
/// which a restarting daemon answers again.
const ASKS: u32 = 8;

/// What a watch that ran out did not see: the lines not checked since `written`, or a daemon
/// too new to know its load balancers.
fn late(view: &View, how: &WaitArgs, written: Instant) -> String {
    let since = written.elapsed();
    let lines: Vec<String> = (view.lines())
        .filter(|l| !l.checked_since(since))
        .map(|l| format!("{}/{} of {}", l.lb.backend, l.lb.server, l.who()))
        .collect();
    if lines.is_empty() {
        let (listened, needed) = (seconds(view.listened()), seconds(2 * how.lb_interval));
        return format!(
            "the daemon had listened for only {listened} of the {needed} (two --lb-interval) it takes to know its load balancers; whether one holds the drain shows at its next check (`pmcheck status`)"
        );
    }
    let (within, lines) = (seconds(how.lb_interval * (how.polls + 1)), lines.join(", "));
    format!(
        "not checked within {within} of the drain: {lines}; whether they hold it shows at their next check (`pmcheck status`; is --lb-interval their `inter`?)"
    )
}

/// Once the record no longer holds the holder `mine` picks (someone let go of it): what it
/// holds instead. `None` while it does, and while it cannot be read.
pub fn let_go_of(file: &DrainFile, mine: impl Fn(&Holder) -> bool) -> Option<String> {
    let path = file.path().display();
    let d = match file.state(SystemTime::now()) {
        DrainState::NotDrained => return Some(format!("no drain record at {path}")),
        DrainState::Unknown(_) => return None,
        DrainState::Drained(d) | DrainState::Expired(d) => d,
    };
    match d.record.as_ref().map(DrainRecord::holders) {
        Some(held) if held.iter().any(mine) => None,
        Some(held) => Some(format!(
            "the drain record {path} held by {}",
            described(held)
        )),
        None => Some(d.describe()),
    }
}

/// Holders, for people: `drain (...), cycle pid 4242 (...)`.
pub fn described(held: &[Holder]) -> String {
    (held.iter().map(Holder::describe))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Takes `mine` out again, puts back what it replaced, logs it refused for `why`; what failed.
async fn undo(file: &DrainFile, mine: &Holder, replaced: &[Holder], why: &str) -> Vec<String> {
    let undone = file.locked().await.and_then(|locked| {
        locked.update_logged(|current| {
            let now = SystemTime::now();
            let mut held = Drain::holders_of(current);
            held.retain(|h| h != mine);
            for h in replaced {
                if !held.contains(h) && !h.tenure.expired_at(now) {
                    held.push(h.clone());
                }
            }
            let change = DrainRecord::held_by(held).map_or(Change::Remove, Change::Write);
            (change, vec![Event::refused(&mine.what, why, now)], ())
        })
    });
    match undone {
        Ok(((), lost)) => lost.iter().map(LogError::to_string).collect(),
        Err(e) => vec![format!("the held drain could not be undone: {e}")],
    }
}

/// Logs a drain the guard refused (as `held` said) in the event log, or warns why it cannot.
pub async fn log_refused(file: &DrainFile, reason: &str, held: &[Blocker]) {
    let event = Event::refused(reason, &said(held), SystemTime::now());
    match file.locked().await.map(|locked| locked.log(&[event])) {
        Ok(lost) => warn(&lost),
        Err(e) => warn([format!("the refused drain was not logged: {e}")]),
    }
}
