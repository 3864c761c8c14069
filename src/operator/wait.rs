//! `drain --wait`, `undrain --wait` and the waits of `cycle` and `on-stop`: ask the running
//! daemon a few times a second until its progress ([`crate::protocol::progress`]) says the goal
//! ([`Goal`]) is reached, as the command line says to wait ([`WaitArgs`]). The daemon decides; this
//! only renders, so it needs no privileges or settings.

use std::future::Future;
use std::io::{IsTerminal, Write};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::cli::WaitArgs;
use crate::drain::file::DrainFile;
use crate::operator::daemon::{Daemon, StatusError};
use crate::operator::view::OtherFile;
use crate::protocol::lines::{Blocker, said};
use crate::protocol::progress::{Ask, Stage};
use crate::settings::duration::format_duration;
use crate::text::seconds;

/// What to wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goal {
    /// Safe to stop Puppet Server: every recent poller has acted on DRAINED, no agent
    /// connection is left and no JRuby instance is borrowed.
    Drained,
    /// Back in rotation: every recent poller has been told OK often enough to act on it.
    Undrained,
    /// Puppet Server can compile again: a probe made after `since` (when the command that
    /// restarted it ended) found it running with its pool full (warm or busy, not warming).
    Healthy { since: Instant },
}

/// How often a line is repeated when nothing changes and the output is not a terminal.
pub const REPEAT: Duration = Duration::from_secs(10);

/// Why a wait ended without reaching its goal.
#[derive(Debug, Error)]
pub enum WaitError {
    /// The daemon did not answer the first question.
    #[error("{0}; only the daemon knows what the load balancers were told (--url)")]
    NoDaemon(StatusError),
    /// The daemon watches another drain record than the command changed.
    #[error(transparent)]
    OtherFile(#[from] OtherFile),
    /// The drain is held where a load balancer says this node is the last server taking
    /// agents: it takes effect once another server takes agents there.
    #[error(
        "held after {}: drain held: {}; the drain stays written and takes effect once another server takes new agents there",
        crate::text::seconds(*.waited),
        said(.held)
    )]
    Held {
        waited: Duration,
        held: Vec<Blocker>,
    },
    /// The goal was not reached in time: it waited the timeout.
    #[error("gave up after {}: {pending}", format_duration(*.waited))]
    TimedOut { waited: Duration, pending: String },
    /// A signal asked to stop.
    #[error("interrupted after {}: {pending}", crate::text::seconds(*.waited))]
    Interrupted { waited: Duration, pending: String },
}

/// A goal reached.
#[derive(Debug, Clone)]
pub struct Done {
    pub waited: Duration,
    /// What was reached, for a person.
    pub summary: String,
    /// What the operator should know all the same.
    pub warnings: Vec<String>,
}

impl Done {
    /// `stage` reached after `waited`, with the agent connections the wait saw close (the most
    /// at once, and when the last one went).
    fn of(stage: &Stage, waited: Duration, (most, gone): (usize, Option<Duration>)) -> Self {
        let mut met = stage.met.clone();
        if let (n @ 1.., Some(after)) = (most, gone) {
            let after = seconds(after);
            met.push(format!(
                "up to {n} agent connection(s) in flight, the last closed after {after}"
            ));
        }
        let (summary, warnings) = (met.join("; "), stage.warnings.clone());
        Done {
            waited,
            summary,
            warnings,
        }
    }
}

/// Asks `daemon` about the drain record `file` until `goal` is reached, `--max-wait` passes or
/// `stop` resolves, showing progress on stderr (one updating line on a terminal, a line per
/// change otherwise). A drain held by a load balancer ends a wait for [`Goal::Drained`] at once.
pub async fn wait(
    goal: Goal,
    daemon: &Daemon,
    how: &WaitArgs,
    file: &DrainFile,
    stop: impl Future<Output = ()>,
) -> Result<Done, WaitError> {
    let start = Instant::now();
    // A daemon that watches another record than the command changed cannot tell anything
    // about it.
    let drain_file = file.resolved();
    let mut ticker = Ticker::new();
    // The agent connections: the most seen at once, and when the last one went.
    let (mut most, mut gone) = (0, None);
    let mut pending = String::new();
    let ask = || Ask {
        polls: how.polls,
        lb_interval: how.lb_interval,
        ended: match goal {
            Goal::Healthy { since } => Some(since.elapsed()),
            _ => None,
        },
    };
    let asking = daemon.asking(ask, |answer| {
        // What the wait still misses: an answer's, or why there was none.
        pending = 'line: {
            let view = match answer {
                Ok(view) => view,
                Err(e) if pending.is_empty() || matches!(e, StatusError::OtherVersion { .. }) => {
                    return ControlFlow::Break(Err(WaitError::NoDaemon(e)));
                }
                Err(e) => break 'line e.to_string(),
            };
            if let Some(e) = view.other_file(&daemon.url, &drain_file) {
                return ControlFlow::Break(Err(e.into()));
            }
            let a = match goal {
                Goal::Drained => &view.progress.drain,
                Goal::Undrained => &view.progress.undrain,
                Goal::Healthy { .. } => &view.progress.healthy,
            };
            let waited = start.elapsed();
            if !a.held.is_empty() {
                let held = a.held.clone();
                return ControlFlow::Break(Err(WaitError::Held { waited, held }));
            }
            if a.connections > 0 {
                (most, gone) = (most.max(a.connections), None);
            } else if most > 0 && gone.is_none() {
                gone = Some(waited);
            }
            if a.met() {
                return ControlFlow::Break(Ok(Done::of(a, waited, (most, gone))));
            }
            let acted: Vec<String> = a.acted.iter().map(ToString::to_string).collect();
            match acted[..] {
                [] => a.missing(),
                _ => format!("{}; acted: {}", a.missing(), acted.join(", ")),
            }
        };
        ticker.show_line(&format!("waiting {}: {pending}", seconds(start.elapsed())));
        if start.elapsed() >= how.max_wait {
            let (waited, pending) = (how.max_wait, pending.clone());
            return ControlFlow::Break(Err(WaitError::TimedOut { waited, pending }));
        }
        ControlFlow::Continue(())
    });
    let ended = tokio::select! {
        done = asking => Some(done),
        () = stop => None,
    };
    ticker.clear();
    let waited = start.elapsed();
    ended.unwrap_or(Err(WaitError::Interrupted { waited, pending }))
}

/// Whether a wait can be had before anything changes: the daemon answers, about `file`.
pub async fn ready(daemon: &Daemon, file: &DrainFile) -> Result<(), WaitError> {
    let view = (daemon.ask().await).map_err(WaitError::NoDaemon)?;
    (view.other_file(&daemon.url, &file.resolved())).map_or(Ok(()), |e| Err(e.into()))
}

/// What the daemon answers right after an undrain, asked for up to two seconds (it sees the
/// record within milliseconds): `Ok` with its words once it no longer answers DRAINED; `Err`
/// with a warning when it cannot be asked or still answers DRAINED.
pub async fn undrained(daemon: &Daemon) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(2);
    let answered = daemon.asking(Ask::default, |answer| {
        ControlFlow::Break(match answer {
            Err(e) => Err(format!(
                "{e}; the record is written, and a daemon watching it answers accordingly from its start"
            )),
            Ok(view) if !view.drained() => Ok(view.says(&daemon.url)),
            Ok(view) if Instant::now() >= deadline => {
                Err(format!("after 2s, {}", view.says(&daemon.url)))
            }
            Ok(_) => return ControlFlow::Continue(()),
        })
    });
    answered.await
}

/// Progress on stderr: one line rewritten in place on a terminal, at most once a second and
/// never wider than the terminal; plain lines otherwise (a line when the state it tells
/// changes, and every [`REPEAT`] when it does not: the timers in it are not a change).
#[derive(Default)]
pub struct Ticker {
    terminal: bool,
    last: String,
    last_at: Option<Instant>,
}

/// How often the line on a terminal is redrawn: the seconds it shows change no faster.
const REDRAW: Duration = Duration::from_secs(1);

impl Ticker {
    /// A ticker for this process's stderr.
    pub fn new() -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            ..Self::default()
        }
    }

    /// Shows `line`, when due (see [`Ticker`]).
    pub fn show_line(&mut self, line: &str) {
        let width = terminal_size::terminal_size_of(std::io::stderr())
            .map_or(80, |(terminal_size::Width(w), _)| usize::from(w));
        let Some(text) = self.frame(Instant::now(), line, width) else {
            return;
        };
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[2K{text}");
            let _ = err.flush();
        } else {
            let _ = writeln!(err, "{text}");
        }
    }

    /// What to write now, if anything: on a terminal, a line that fits `width` columns
    /// (one short, so that the cursor does not wrap) once a [`REDRAW`] has passed.
    fn frame(&mut self, now: Instant, line: &str, width: usize) -> Option<String> {
        let stale = (self.last_at).is_none_or(|t| now.duration_since(t) >= self.every());
        let said = without_timers(line);
        if !stale && (self.terminal || said == self.last) {
            return None;
        }
        (self.last, self.last_at) = (said, Some(now));
        let room = width.saturating_sub(1).max(20);
        if !self.terminal || line.chars().count() <= room {
            return Some(line.to_owned());
        }
        let short: String = line.chars().take(room - 3).collect();
        Some(short + "...")
    }

    /// How often a line that says nothing new is due.
    fn every(&self) -> Duration {
        if self.terminal { REDRAW } else { REPEAT }
    }

    /// How long until a line that says nothing new is due again.
    pub fn due_in(&self) -> Duration {
        let due = |t: Instant| (t + self.every()).saturating_duration_since(Instant::now());
        self.last_at.map_or(Duration::ZERO, due)
    }

    /// Clears the line on a terminal, once one was drawn: the ticker's last use.
    pub fn clear(&mut self) {
        if self.terminal && self.last_at.take().is_some() {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

/// `text` with its running times (`2.0s`, `850ms`, `3m`) blanked: what a wait is waiting for,
/// whose words change when the state does, not with every tick of its clocks.
fn without_timers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
        let (before, from) = rest.split_at(start);
        out.push_str(before);
        let number = (from.find(|c: char| !(c.is_ascii_digit() || c == '.'))).unwrap_or(from.len());
        let after = &from[number..];
        let ends = |tail: &str| !tail.starts_with(|c: char| c.is_ascii_alphanumeric());
        let unit =
            (["ms", "s", "m", "h"].into_iter()).find(|u| after.strip_prefix(u).is_some_and(ends));
        let preceded = out.ends_with(|c: char| c.is_ascii_alphanumeric() || c == ':');
        let (shown, skipped) = match unit {
            Some(unit) if !preceded => (format!("#{unit}"), number + unit.len()),
            _ => (from[..number].to_owned(), number),
        };
        out.push_str(&shown);
        rest = &from[skipped..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_are_not_a_change_counts_and_clock_times_are() {
        let said = |n: &str, free: u32| {
            format!(
                "NOLB (as of {n}s ago), told DRAINED for 2{n}s, {free} of 2 JRubies free, wait 850ms, since 01:44:30Z, 10m left"
            )
        };
        assert_eq!(
            without_timers(&said("1.1", 2)),
            without_timers(&said("39.2", 2))
        );
        assert_ne!(
            without_timers(&said("1.1", 2)),
            without_timers(&said("1.1", 1))
        );
        assert_eq!(
            without_timers("since 01:44:30Z (3s) for 2.5s, 12 sessions"),
            "since 01:44:30Z (#s) for #s, 12 sessions"
        );
    }

    #[test]
    fn elsewhere_a_ticking_clock_alone_writes_no_line() {
        let mut t = ticker(false);
        let t0 = Instant::now();
        assert!(
            framed(
                &mut t,
                t0,
                Duration::ZERO,
                "NOLB, told DRAINED for 1.0s",
                80
            )
            .is_some()
        );
        for tick in 1..40 {
            let now = t0 + Duration::from_millis(250 * tick);
            let text = format!("NOLB, told DRAINED for {:.1}s", 1.0 + 0.25 * tick as f64);
            assert_eq!(
                framed(&mut t, now, now - t0, &text, 80),
                None,
                "tick {tick}"
            );
        }
        let heartbeat = t0 + REPEAT;
        assert!(
            framed(
                &mut t,
                heartbeat,
                REPEAT,
                "NOLB, told DRAINED for 11.0s",
                80
            )
            .is_some()
        );
        assert!(
            framed(&mut t, heartbeat, REPEAT, "UP, told OK for 0.1s", 80).is_some(),
            "a change of state is said at once"
        );
    }

    /// The frame of the wait's line for `pending` after `waited`.
    fn framed(
        t: &mut Ticker,
        now: Instant,
        waited: Duration,
        pending: &str,
        width: usize,
    ) -> Option<String> {
        t.frame(
            now,
            &format!("waiting {}: {pending}", seconds(waited)),
            width,
        )
    }

    fn ticker(terminal: bool) -> Ticker {
        Ticker {
            terminal,
            last: String::new(),
            last_at: None,
        }
    }

    #[test]
    fn on_a_terminal_the_line_fits_and_is_redrawn_once_a_second() {
        let mut t = ticker(true);
        let t0 = Instant::now();
        let long = "lb 10.0.0.5 (lb1) still sends: 3 sessions; ".repeat(6);
        let first = framed(&mut t, t0, Duration::ZERO, &long, 80).expect("drawn at once");
        assert_eq!(first.chars().count(), 79, "{first}");
        assert!(first.ends_with("..."), "{first}");
        let quarter = Duration::from_millis(250);
        assert_eq!(framed(&mut t, t0 + quarter, quarter, "changed", 80), None);
        assert_eq!(
            framed(&mut t, t0 + quarter * 3, quarter * 3, "changed", 80),
            None
        );
        let again = framed(&mut t, t0 + REDRAW, REDRAW, "changed", 80).unwrap();
        assert_eq!(again, "waiting 1.0s: changed");
        // A narrow terminal still gets a useful line.
        let narrow = framed(&mut t, t0 + REDRAW * 2, REDRAW, &long, 10).unwrap();
        assert_eq!(narrow.chars().count(), 20, "{narrow}");
    }

    #[test]
    fn elsewhere_a_line_per_change_and_a_reminder() {
        let mut t = ticker(false);
        let t0 = Instant::now();
        let long = "x".repeat(300);
        assert_eq!(
            framed(&mut t, t0, Duration::ZERO, &long, 80).map(|l| l.len()),
            Some(300 + "waiting 0.0s: ".len()),
            "plain lines are whole"
        );
        assert_eq!(
            framed(&mut t, t0 + REDRAW, REDRAW, &long, 80),
            None,
            "unchanged"
        );
        assert!(
            framed(&mut t, t0 + REDRAW, REDRAW, "other", 80).is_some(),
            "changed"
        );
        assert!(
            framed(&mut t, t0 + REDRAW + REPEAT, REPEAT, "other", 80).is_some(),
            "reminder"
        );
    }
}
