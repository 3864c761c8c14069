//! The one rule every holder of the drain follows: a hold joins the live holders, in place of
//! those it replaces; letting go takes one holder out, and the record goes with the last one.
//! Both are made under the state directory's lock, with their event logged in the same section.

use std::time::SystemTime;

use crate::drain::file::{Change, DrainError, Locked};
use crate::drain::holders::{Held, Holder, Kind, Release};
use crate::drain::log::{Action, Event, LogError};
use crate::drain::record::{Drain, DrainRecord};

impl Locked<'_> {
    /// Adds `mine` to the record's holders, logged as its kind's action; the holders it
    /// replaces ([`Holder::replaces`]) and the expired ones go.
    pub fn hold(self, mine: &Holder) -> Result<(Held, Vec<LogError>), DrainError> {
        let action = match mine.kind {
            Kind::Drain => Action::Drain,
            Kind::Cycle | Kind::StoppedCycle => Action::CycleDrain,
            Kind::Stop => Action::StopDrain,
        };
        self.update_logged(|before| {
            let now = SystemTime::now();
            let (replaced, mut held): (Vec<_>, Vec<_>) =
                (Drain::holders_of(before).into_iter()).partition(|h| mine.replaces(h));
            held.retain(|h| !h.tenure.expired_at(now));
            let others = held.clone();
            held.push(mine.clone());
            // Never empty: `mine` is in it.
            let change = DrainRecord::held_by(held).map_or(Change::Keep, Change::Write);
            let events = vec![Event::of(action, mine, now)];
            (change, events, Held { replaced, others })
        })
    }

    /// Takes out the holder `which` names, logged as `action`; the record goes when no live
    /// holder is left.
    pub fn release(
        self,
        which: impl Fn(&Holder) -> bool,
        action: Action,
    ) -> Result<(Release, Vec<LogError>), DrainError> {
        self.update_logged(|current| {
            let Some(record) = current.and_then(|d| d.record) else {
                return (Change::Keep, Vec::new(), Release::NotDrained);
            };
            let now = SystemTime::now();
            let held = record.holders();
            let Some(gone) = held.iter().find(|h| which(h)).cloned() else {
                return (Change::Keep, Vec::new(), Release::NotHeld(held.to_vec()));
            };
            let events = vec![Event::of(action, &gone, now)];
            let rest: Vec<Holder> = (held.iter())
                .filter(|h| !which(h) && !h.tenure.expired_at(now))
                .cloned()
                .collect();
            match DrainRecord::held_by(rest.clone()) {
                None => (Change::Remove, events, Release::Undrained),
                Some(record) => (Change::Write(record), events, Release::StillHeld(rest)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::file::DrainFile;
    use crate::drain::log::DrainLog;

    #[test]
    fn each_cycle_holds_on_its_own_and_each_hold_is_logged_as_its_kind() {
        use Action::{CycleDrain, Drain as Drained, StopDrain};
        let (dir, file) = file();
        let now = SystemTime::now();
        let hold = |mine: &Holder| file.lock().unwrap().hold(mine).unwrap().0;
        let first = Holder::cycle("first".into(), now);
        hold(&first);
        let held = hold(&Holder::cycle("second".into(), now));
        assert_eq!((held.others, held.replaced), (vec![first], vec![]));
        hold(&Holder::stop("puppetserver.service", now));
        hold(&Holder::drain("kernel".into(), None, now));
        let events = DrainLog::new(dir.path()).tail(10).unwrap();
        let actions: Vec<Action> = events.iter().map(|e| e.action).collect();
        assert_eq!(actions, [CycleDrain, CycleDrain, StopDrain, Drained]);
    }

    fn file() -> (tempfile::TempDir, DrainFile) {
        let dir = tempfile::tempdir().unwrap();
        let file = DrainFile::new(dir.path());
        (dir, file)
    }

    #[test]
    fn a_hold_replaces_its_own_kind_and_keeps_the_others_until_the_last_lets_go() {
        let (_dir, file) = file();
        let now = SystemTime::now();
        let drain = Holder::drain("kernel".into(), None, now);
        let stop = Holder::stop("puppetserver.service", now);
        let is = |kind: Kind| move |h: &Holder| h.kind == kind;

        let hold = |mine: &Holder| {
            let (held, lost) = file.lock().unwrap().hold(mine).unwrap();
            assert!(lost.is_empty(), "{lost:?}");
            held
        };
        let forced = || {
            let record = file.current().and_then(|d| d.record)?;
            record.forced().map(str::to_owned)
        };

        let held = hold(&drain);
        assert!(held.replaced.is_empty() && held.others.is_empty());
        let forced_drain = Holder {
            forced: Some("--force".to_owned()),
            ..drain.clone()
        };
        let held = hold(&forced_drain);
        assert_eq!(
            held.others,
            Vec::<Holder>::new(),
            "a drain replaces a drain"
        );
        let held = hold(&stop);
        assert_eq!(held.others, vec![forced_drain.clone()]);
        // A second stop replaces the first; the forced drain keeps its note.
        let held = hold(&stop);
        assert_eq!(held.others, vec![forced_drain.clone()]);
        assert_eq!(forced().as_deref(), Some("--force"));
        let held = hold(&drain);
        assert_eq!(held.others, vec![stop.clone()]);
        assert_eq!(
            forced(),
            None,
            "each drain says for itself whether it was forced"
        );

        let release = |kind: Kind, action| {
            let (left, _) = file.lock().unwrap().release(is(kind), action).unwrap();
            left
        };
        let left = release(Kind::Stop, Action::StopUndrain);
        assert_eq!(left, Release::StillHeld(vec![drain.clone()]));
        let left = release(Kind::Stop, Action::StopUndrain);
        assert_eq!(left, Release::NotHeld(vec![drain]));
        assert_eq!(release(Kind::Drain, Action::Undrain), Release::Undrained);
        assert!(file.current().is_none());
        assert_eq!(release(Kind::Drain, Action::Undrain), Release::NotDrained);
    }
}
