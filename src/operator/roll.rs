//! `pmcheck roll begin|end`: this master's mark for one rolling restart
//! ([`crate::drain::roll`]). The playbook begins its roll on every master before the first
//! cycle, and ends it on every master at the end or at a failure.

use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::cli::{RollArgs, RollStep};
use crate::console::{errln, outln};
use crate::drain::file::DrainFile;
use crate::drain::roll::{Began, Ended, Mark, RollError};

/// What a roll runs, unless `begin --reason` says.
const DEFAULT_REASON: &str = "a rolling restart";

/// How long a mark lasts, unless `begin --for` says: longer than any roll of a few masters,
/// short enough that a roll whose control node died keeps no other out for a working day.
const DEFAULT_LASTING: Duration = Duration::from_secs(4 * 3600);

/// An option the other step takes: refused before anything is touched.
fn misplaced(args: &RollArgs) -> Result<(), RollError> {
    let (option, step, fix) = match args.step {
        RollStep::Begin if args.force => (
            "--force",
            "begin",
            "a roll's begin never takes another roll's mark away; end that roll first (`pmcheck roll end --name NAME`, or `pmcheck roll end --force` for one whose play is gone)",
        ),
        RollStep::End if args.reason.is_some() => (
            "--reason",
            "end",
            "the end takes the mark away whatever it says; leave --reason out",
        ),
        RollStep::End if args.lasting.is_some() => (
            "--for",
            "end",
            "the end takes the mark away at once; leave --for out",
        ),
        _ => return Ok(()),
    };
    Err(RollError::Misplaced { option, step, fix })
}

/// `status`'s `roll:` line: the mark on this master, if any, and whether it lapsed.
pub fn line(state_dir: &Path, now: SystemTime) -> Option<String> {
    let mark = match crate::drain::roll::read(state_dir) {
        Ok(mark) => mark?,
        Err(e) => return Some(format!("cannot tell: {e}")),
    };
    let fate = match mark.tenure.expired_at(now) {
        true => "lapsed, the next roll replaces it",
        false => "no other roll begins here until it ends",
    };
    Some(format!("{}: {fate}", mark.describe()))
}

/// Begins or ends the roll `args` names, saying what it found.
pub async fn roll(args: RollArgs) -> Result<(), RollError> {
    misplaced(&args)?;
    let file = DrainFile::new(&args.state.state_dir);
    let name = args.name.unwrap_or_default();
    let now = SystemTime::now();
    if args.step == RollStep::Begin && name.is_empty() {
        return Err(RollError::Unnamed);
    }
    let locked = (file.locked().await).map_err(|e| RollError::unlocked(file.dir(), e))?;
    match args.step {
        RollStep::Begin => {
            let reason = args.reason.as_deref().unwrap_or(DEFAULT_REASON);
            let mine = Mark::new(&name, reason, now, args.lasting.unwrap_or(DEFAULT_LASTING));
            let until = (mine.tenure.until.as_ref()).map_or("", |u| u.as_str());
            let marked = format!("marked this master for roll {name} until {until}");
            match locked.begin_roll(&mine, now)? {
                Began::Marked => outln!("pmcheck roll: {marked}"),
                Began::Renewed => outln!("pmcheck roll: renewed roll {name}'s mark until {until}"),
                Began::Replaced(lapsed) => outln!(
                    "pmcheck roll: {marked}, in place of the lapsed {}",
                    lapsed.describe()
                ),
            }
        }
        RollStep::End => match locked.end_roll(&name, args.force)? {
            Ended::Removed => outln!("pmcheck roll: roll {name} ended here; its mark is removed"),
            Ended::NotMarked => outln!("pmcheck roll: no roll mark here; nothing to do"),
            Ended::Other(other) => errln!(
                "pmcheck roll: the mark here is not roll {name}'s but {}: left as it is (--force removes it)",
                other.describe()
            ),
            Ended::Forced(Some(found)) => {
                outln!("pmcheck roll: removed the mark of {}", found.describe())
            }
            Ended::Forced(None) => outln!("pmcheck roll: removed the roll mark"),
        },
    }
    Ok(())
}
