//! What systemd's watchdog is told: `WATCHDOG=1` only while the daemon makes progress. A
//! timer that pings on its own proves only that a timer runs; here the prober must keep its
//! schedule (a fresh report) and every listener's loop must turn when the watchdog asks it to,
//! or the pings stop and systemd restarts the daemon. An idle listener turns only when asked,
//! so a daemon without a watchdog, or between its pings, sleeps.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};

use crate::puppet::report::ProbeReport;
use crate::settings::duration::format_duration;
use crate::systemd::Notifier;

/// A listener's loop asked to turn and not turned for this long is stuck: room for a master
/// whose compiles take every core.
const LISTENER_BOUND: Duration = Duration::from_secs(10);

/// When a loop last turned, and when the watchdog last asked it to.
#[derive(Debug)]
pub(crate) struct Beat {
    epoch: Instant,
    /// Milliseconds from `epoch`.
    last: AtomicU64,
    /// Milliseconds from `epoch`; 0: never asked.
    asked_at: AtomicU64,
    /// Told when the watchdog asks the loop to turn (an ask made meanwhile is kept).
    pub(crate) asking: Notify,
}

impl Beat {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            asked_at: AtomicU64::new(0),
            asking: Notify::new(),
        })
    }

    /// The loop turned at `now`.
    pub(crate) fn mark(&self, now: Instant) {
        self.last.store(self.ms(now), Ordering::Relaxed);
    }

    /// How long it has been asked to turn without turning, at `now`.
    fn waiting(&self, now: Instant) -> Option<Duration> {
        let asked = self.asked_at.load(Ordering::Relaxed);
        (asked > self.last.load(Ordering::Relaxed))
            .then(|| now.saturating_duration_since(self.epoch + Duration::from_millis(asked)))
    }

    fn ms(&self, now: Instant) -> u64 {
        crate::text::ms(now.saturating_duration_since(self.epoch))
    }
}

/// Everything whose progress the watchdog's pings stand for.
pub struct Progress {
    /// Each listener's address, and its loop's beat.
    pub(crate) listeners: Vec<(String, Arc<Beat>)>,
    /// The prober's latest report.
    pub(crate) latest: watch::Receiver<Option<Arc<ProbeReport>>>,
    /// When probing began (before the first report).
    pub(crate) since: Instant,
    /// How old the latest report may grow: twice the age at which the verdict already calls
    /// the prober stuck (UNKNOWN), so a master starved of CPU is not restarted for it.
    pub(crate) probe_bound: Duration,
}

impl Progress {
    /// Why the daemon is not making progress at `now`, or `None` when it is.
    pub fn stalled(&self, now: Instant) -> Option<String> {
        let finished = (self.latest.borrow().as_ref()).map_or(self.since, |r| r.finished);
        let age = now.saturating_duration_since(finished);
        if age > self.probe_bound {
            return Some(format!(
                "the prober has made no probe for {} (limit {})",
                format_duration(round(age)),
                format_duration(self.probe_bound)
            ));
        }
        self.listeners.iter().find_map(|(address, beat)| {
            let age = beat.waiting(now).filter(|&age| age > LISTENER_BOUND)?;
            Some(format!(
                "the listener on {address} has not turned for {} since asked (limit {})",
                format_duration(round(age)),
                format_duration(LISTENER_BOUND)
            ))
        })
    }

    /// Asks every listener's loop to turn, so that by the next look an idle one has shown
    /// that it still can.
    pub fn ask(&self, now: Instant) {
        for (_, beat) in &self.listeners {
            beat.asked_at.store(beat.ms(now).max(1), Ordering::Relaxed);
            beat.asking.notify_one();
        }
    }
}

fn round(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// Pings `WATCHDOG=1` at half of `WatchdogSec`, when systemd asked for it for this process,
/// while `progress` says the daemon makes progress; otherwise says why once, and stays
/// silent so that systemd restarts it.
pub fn watchdog(
    notifier: &Notifier,
    progress: Progress,
) -> Option<impl Future<Output = ()> + Send + 'static> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if usec == 0 {
        return None;
    }
    if let Ok(pid) = std::env::var("WATCHDOG_PID")
        && pid.parse::<u32>().ok()? != std::process::id()
    {
        return None;
    }
    let period = Duration::from_micros(usec) / 2;
    let notifier = notifier.clone();
    let limit = Duration::from_micros(usec);
    Some(async move {
        let mut ticks = tokio::time::interval(period);
        let mut silent = false;
        loop {
            ticks.tick().await;
            let now = Instant::now();
            let stalled = progress.stalled(now);
            progress.ask(now);
            match stalled {
                None => {
                    if silent {
                        tracing::warn!("progress again: pinging systemd's watchdog again");
                        silent = false;
                    }
                    notifier.notify("WATCHDOG=1");
                }
                Some(why) if !silent => {
                    tracing::error!(
                        %why,
                        watchdog = %crate::settings::duration::format_duration(limit),
                        "not pinging systemd's watchdog: systemd restarts pmcheck once that long passes without a ping (WatchdogSec)"
                    );
                    silent = true;
                }
                Some(_) => {}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::puppet::report::ProbeOutcome;

    #[test]
    fn a_late_probe_or_a_listener_that_stopped_turning_stalls_the_pings() {
        let start = Instant::now();
        let (publish, latest) = watch::channel(None);
        let beat = Beat::new();
        beat.mark(Instant::now());
        let progress = Progress {
            listeners: vec![("127.0.0.1:9200".into(), Arc::clone(&beat))],
            latest,
            since: start,
            probe_bound: Duration::from_secs(4),
        };
        assert_eq!(progress.stalled(start + Duration::from_secs(3)), None);
        let late = progress.stalled(start + Duration::from_secs(5)).unwrap();
        assert!(late.contains("no probe for 5s (limit 4s)"), "{late}");
        let mut report = ProbeReport::new(ProbeOutcome::Healthy(None), Duration::ZERO, None);
        report.finished = start + Duration::from_secs(5);
        publish.send_replace(Some(Arc::new(report)));
        assert_eq!(progress.stalled(start + Duration::from_secs(6)), None);
        let mut report = ProbeReport::new(ProbeOutcome::Healthy(None), Duration::ZERO, None);
        report.finished = beat.epoch + Duration::from_secs(30);
        publish.send_replace(Some(Arc::new(report)));
        // An idle listener not asked to turn is not stuck, however long it sleeps.
        let at = |s| beat.epoch + Duration::from_secs(s);
        assert_eq!(progress.stalled(at(29)), None);
        // Asked, it has LISTENER_BOUND to turn.
        progress.ask(at(20));
        assert_eq!(progress.stalled(at(30)), None);
        let stuck = progress.stalled(at(31)).unwrap();
        assert!(
            stuck.contains("listener on 127.0.0.1:9200 has not turned for 11s since asked"),
            "{stuck}"
        );
        beat.mark(at(25));
        assert_eq!(progress.stalled(at(31)), None, "turned since");
    }
}
