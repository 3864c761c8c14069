//! `pmcheck on-stop` and `pmcheck on-start`: what `pmcheck-drain-on-stop@.service` runs around
//! every stop of Puppet Server's unit, so that a restart nobody routed through `pmcheck cycle`
//! (an operator's `systemctl restart`, a package upgrade, Puppet's own `service` refresh)
//! drains first.
//!
//! The helper unit is `PartOf=` and `After=` Puppet Server's: systemd stops it (running
//! `on-stop`) before it stops Puppet Server, and starts it (running `on-start`) once Puppet
//! Server's start has finished. `on-stop` adds a hold of its own ([`Kind::Stop`]) beside
//! whatever else holds the node, and `on-start` takes out only that one: an operator's drain or
//! a cycle stays. Neither ever blocks the stop: whatever fails, `on-stop` says so and exits 0.

use std::process::Command;
use std::time::SystemTime;

use crate::cli::{OnStopArgs, StopArgs};
use crate::console::{errln, outln};
use crate::drain::file::{DrainError, DrainFile};
use crate::drain::holders::{Holder, Kind};
use crate::drain::holding::{Forced, Release};
use crate::drain::log::Action;
use crate::operator::drain::{say_lost, wait_settings};
use crate::operator::goal::Goal;
use crate::operator::run_single_threaded;
use crate::operator::wait::{self, WaitError};
use crate::text::seconds;

/// The unit named when `--unit` is not given.
const DEFAULT_UNIT: &str = "puppetserver.service";

/// `pmcheck on-stop`: holds the node drained for this stop and waits within `--max-wait`;
/// every failure is said on stderr (the journal) and lets the stop go on.
pub fn on_stop(args: OnStopArgs) {
    let StopArgs {
        drain_on_stop,
        unit,
        state,
    } = args.stop;
    let name = unit.as_deref().unwrap_or(DEFAULT_UNIT);
    if !drain_on_stop {
        outln!("PMCHECK_DRAIN_ON_STOP=no: {name} stops without a drain");
        return;
    }
    if let Some(unit) = &unit
        && let Some(false) = stopping(unit)
    {
        outln!("{unit} is not stopping (only this helper is): nothing drained");
        return;
    }
    let how = wait_settings(&args.waiting, &state);
    let file = DrainFile::new(&state.state_dir);
    // A load balancer's word that this is its last server changes nothing: Puppet Server stops
    // all the same, so there is nothing to wait for.
    let last = match run_single_threaded(wait::guard_last_server(&how, false)) {
        Ok(Err(last)) => Some(last.0),
        _ => None,
    };
    let mine = Holder::stop(name, SystemTime::now());
    if let Err(e) = hold(&file, &mine) {
        errln!("pmcheck on-stop: WARNING: {e}; {name} stops without a drain");
        return;
    }
    outln!(
        "drained for this stop of {name} (since {}); wrote {}",
        mine.tenure.since,
        file.path().display()
    );
    if let Some(said) = last {
        errln!("pmcheck on-stop: WARNING: {said}: not waiting; {name} stops now");
        return;
    }
    // The wait's first question finds out whether the daemon can be asked at all.
    let waited = run_single_threaded(wait::wait(Goal::Drained, &how, std::future::pending()));
    match waited {
        Ok(Ok(done)) => outln!(
            "safe to stop after {}: {}; {name} stops now",
            seconds(done.waited),
            done.summary
        ),
        Ok(Err(WaitError::NoDaemon(e))) => errln!(
            "pmcheck on-stop: WARNING: {e}; the load balancers were not waited for: {name} stops now, and agents still sent here fail"
        ),
        Ok(Err(e)) => errln!("pmcheck on-stop: WARNING: {e}; {name} stops now"),
        Err(e) => errln!("pmcheck on-stop: WARNING: {e}; {name} stops now"),
    }
}

/// `pmcheck on-start`: lets go of the stop's hold, and of nothing else.
pub fn on_start(args: StopArgs) -> Result<(), DrainError> {
    let file = DrainFile::new(&args.state.state_dir);
    let name = args.unit.as_deref().unwrap_or(DEFAULT_UNIT);
    let (left, lost) = file.release(|h| h.kind == Kind::Stop, Action::StopUndrain)?;
    say_lost(lost);
    match left {
        Release::NotDrained => outln!("{name} started; not drained"),
        Release::Undrained => outln!(
            "{name} started: let go of the stop's hold; the node returns once pmcheck's probe finds Puppet Server ready"
        ),
        Release::NotHeld(rest) | Release::StillHeld(rest) => {
            let held: Vec<String> = rest.iter().map(Holder::describe).collect();
            outln!(
                "{name} started; the node stays drained, held by {}",
                held.join(", ")
            );
        }
    }
    Ok(())
}

/// Adds `mine` to the holders, in place of an earlier stop's.
fn hold(file: &DrainFile, mine: &Holder) -> Result<(), DrainError> {
    let replaces = |h: &Holder| h.kind == Kind::Stop;
    let (_, lost) = file.hold(mine, replaces, Forced::Keep(None), Action::StopDrain)?;
    say_lost(lost);
    Ok(())
}

/// Whether systemd has a stop or restart job queued for `unit`; `None` when `systemctl`
/// cannot tell (not under systemd): then the node is drained, the safe side for agents.
fn stopping(unit: &str) -> Option<bool> {
    let out = Command::new("systemctl")
        .args(["list-jobs", "--no-legend", "--plain", "--full"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let jobs = String::from_utf8_lossy(&out.stdout);
    Some(jobs.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&unit)
            && fields
                .get(2)
                .is_some_and(|kind| ["stop", "restart", "try-restart"].contains(kind))
    }))
}
