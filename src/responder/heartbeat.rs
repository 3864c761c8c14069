//! What systemd's watchdog is told: `WATCHDOG=1` only while the daemon makes progress. A
//! timer that pings on its own proves only that a timer runs; here the prober must keep its
//! schedule (a fresh report) and every listener's loop must turn, or the pings stop and systemd
//! restarts the daemon.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::puppet::report::ProbeReport;
use crate::settings::duration::format_duration;

/// How often an idle listener's loop turns on its own, to show that it still can.
pub(crate) const LISTENER_TICK: Duration = Duration::from_secs(1);

/// A listener's loop that has not turned for this long is stuck: ten of its own ticks, room
/// for a master whose compiles take every core.
const LISTENER_BOUND: Duration = Duration::from_secs(10);

/// When a loop last turned.
#[derive(Debug)]
pub(crate) struct Beat {
    epoch: Instant,
    /// Milliseconds from `epoch`.
    last: AtomicU64,
}

impl Beat {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            last: AtomicU64::new(0),
        })
    }

    pub(crate) fn mark(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last.store(ms, Ordering::Relaxed);
    }

    fn age(&self, now: Instant) -> Duration {
        let at = self.epoch + Duration::from_millis(self.last.load(Ordering::Relaxed));
        now.saturating_duration_since(at)
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
            let age = beat.age(now);
            (age > LISTENER_BOUND).then(|| {
                format!(
                    "the listener on {address} has not turned for {} (limit {})",
                    format_duration(round(age)),
                    format_duration(LISTENER_BOUND)
                )
            })
        })
    }
}

fn round(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
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
        beat.mark();
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
        report.finished = beat.epoch + Duration::from_secs(10);
        publish.send_replace(Some(Arc::new(report)));
        let stuck = progress
            .stalled(beat.epoch + Duration::from_secs(11))
            .unwrap();
        assert!(
            stuck.contains("listener on 127.0.0.1:9200 has not turned"),
            "{stuck}"
        );
    }
}
