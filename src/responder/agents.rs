//! The agent connections to Puppet Server as the operator's JSON answer shows them.
//!
//! Reading the kernel's TCP tables costs in proportion to every socket of the host, TIME_WAIT
//! included (about 14 ms at 5,000 entries, over 100 ms at 100,000), so it never runs on an async
//! worker, where it would hold up the load balancers' polls and the prober's deadline: it runs
//! on the blocking pool, one read at a time, and a read is reused for [`FRESH`]. A load
//! balancer's poll never asks for it. The answer is bounded whatever the number of
//! connections: their count, the busiest sources and the first [`LISTED`] of them.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::protocol::{SourceAnswer, TrafficAnswer};
use crate::puppet::client::Address;
use crate::puppet::traffic;
use crate::text::ms;

/// How long one read of the TCP tables is reused.
pub const FRESH: Duration = Duration::from_millis(500);
/// Most connections listed one by one.
pub const LISTED: usize = 64;
/// Most source addresses counted one by one.
pub const SOURCES: usize = 32;

/// The latest read of the agent connections, shared by the operator's requests.
#[derive(Debug)]
pub struct Agents {
    puppet: Option<Address>,
    latest: Mutex<Option<(Instant, Arc<TrafficAnswer>)>>,
    reading: tokio::sync::Mutex<()>,
}

impl Agents {
    /// For the Puppet Server listening at `puppet` (where it listens now); `None` when the
    /// settings could not say.
    pub fn new(puppet: Option<Address>) -> Self {
        Self {
            puppet,
            latest: Mutex::new(None),
            reading: tokio::sync::Mutex::new(()),
        }
    }

    /// The latest read, without reading, saying how long before `now` it was made: a wait
    /// for the agents to leave must know whether it was made after the load balancers acted.
    pub fn latest(&self, now: Instant) -> Option<TrafficAnswer> {
        let latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        latest.as_ref().map(|(at, t)| TrafficAnswer {
            age_ms: Some(ms(now.saturating_duration_since(*at))),
            ..TrafficAnswer::clone(t)
        })
    }

    fn fresh(&self) -> bool {
        let latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        latest.as_ref().is_some_and(|(at, _)| at.elapsed() < FRESH)
    }

    /// Makes the latest read at most [`FRESH`] old, reading on the blocking pool; requests that
    /// come during a read wait for it instead of starting another.
    pub async fn refresh(&self) {
        let Some(puppet) = self.puppet.as_ref().map(|p| *p.borrow()) else {
            return;
        };
        let _reading = self.reading.lock().await;
        if self.fresh() {
            return;
        }
        let read = match tokio::task::spawn_blocking(move || read(puppet)).await {
            Ok(read) => read,
            Err(e) => TrafficAnswer::unreadable(puppet, format!("the read failed: {e}")),
        };
        let mut latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        *latest = Some((Instant::now(), Arc::new(read)));
    }
}

/// One read of the agent connections, bounded.
pub fn read(puppet: SocketAddr) -> TrafficAnswer {
    match traffic::connections(puppet) {
        Ok(connections) => bounded(puppet, connections),
        Err(e) => TrafficAnswer::unreadable(puppet, e.to_string()),
    }
}

/// `connections` as the answer carries them: all counted, the busiest [`SOURCES`] sources and
/// the first [`LISTED`] connections named.
pub fn bounded(puppet: SocketAddr, mut connections: Vec<SocketAddr>) -> TrafficAnswer {
    let total = connections.len();
    let mut by_source: HashMap<IpAddr, usize> = HashMap::new();
    for c in &connections {
        *by_source.entry(c.ip()).or_default() += 1;
    }
    let mut sources: Vec<SourceAnswer> = by_source
        .into_iter()
        .map(|(address, connections)| SourceAnswer {
            address,
            connections,
        })
        .collect();
    sources.sort_by(|a, b| {
        (b.connections.cmp(&a.connections)).then_with(|| a.address.cmp(&b.address))
    });
    let other_sources = sources.len().saturating_sub(SOURCES);
    sources.truncate(SOURCES);
    connections.sort();
    connections.truncate(LISTED);
    TrafficAnswer {
        listener: puppet,
        connections,
        total,
        sources,
        other_sources,
        problem: None,
        age_ms: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::puppet::client::fixed;

    #[test]
    fn thousands_of_connections_make_a_bounded_answer_that_counts_them_all() {
        let puppet: SocketAddr = "127.0.0.1:8140".parse().unwrap();
        let connections: Vec<SocketAddr> = (0..3500u32)
            .map(|i| SocketAddr::from(([10, 0, (i % 100) as u8, 1], 40000 + (i % 20000) as u16)))
            .collect();
        let answer = bounded(puppet, connections);
        assert_eq!(answer.total, 3500);
        assert_eq!(answer.connections.len(), LISTED);
        assert_eq!(answer.sources.len(), SOURCES);
        assert_eq!(answer.other_sources, 100 - SOURCES);
        assert_eq!(answer.sources[0].connections, 35);
        let json = serde_json::to_string(&answer).unwrap();
        assert!(json.len() < 8 * 1024, "{} bytes", json.len());
    }

    #[tokio::test]
    async fn one_read_serves_the_requests_that_come_within_fresh() {
        let agents = Agents::new(Some(fixed("127.0.0.1:1".parse().unwrap())));
        assert!(agents.latest(Instant::now()).is_none());
        agents.refresh().await;
        let read = |agents: &Agents| agents.latest.lock().unwrap().as_ref().map(|(at, _)| *at);
        let first = read(&agents).expect("read");
        agents.refresh().await;
        assert_eq!(read(&agents), Some(first), "read again within FRESH");
        let later = agents.latest(first + Duration::from_millis(300)).unwrap();
        assert_eq!(
            later.age_ms,
            Some(300),
            "the answer says how old the read is"
        );
        assert!(Agents::new(None).latest(Instant::now()).is_none());
    }
}
