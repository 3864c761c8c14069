//! The connection table: how many sockets pollers may hold at once, and who gives way when the
//! table is full.
//!
//! A health checker that can be knocked over takes the whole pool with it, so a new connection
//! is always accepted at once (nothing waits in the kernel's accept queue) and, past a limit, the
//! oldest connection of the source holding the most is closed. A flood from one address sheds
//! its own connections; a load balancer's check, short-lived and from another address, is not
//! touched. The table stays below the process's descriptor limit, which is raised at start.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// Descriptors kept for everything but polls: listeners, the probe, the journal, blocking reads.
const RESERVED_FDS: u64 = 64;
/// How often a repeating event (shedding, refusals, accept errors) is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// How many connections may be open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub total: usize,
    pub per_source: usize,
}

impl Limits {
    /// Raises the soft descriptor limit to the hard one, then shrinks the limits to fit under
    /// it, saying so: a table larger than the descriptors would let `accept` fail instead.
    pub fn fit_descriptors(self) -> Self {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let soft = match getrlimit(Resource::RLIMIT_NOFILE) {
            Ok((soft, hard))
                if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() =>
            {
                tracing::debug!("raised the descriptor limit from {soft} to {hard}");
                hard
            }
            Ok((soft, _)) => soft,
            Err(e) => {
                tracing::warn!(
                    "cannot read the descriptor limit ({e}); keeping --max-connections as given"
                );
                return self;
            }
        };
        // Half for the table, half for the sockets of shed connections still being closed
        // (a flood replaces them as fast as they go), so that `accept` never runs out.
        let room = usize::try_from(soft.saturating_sub(RESERVED_FDS) / 2)
            .unwrap_or(usize::MAX)
            .max(1);
        if self.total <= room {
            return self;
        }
        tracing::warn!(
            "--max-connections {} does not fit the descriptor limit {soft}; using {room} (raise LimitNOFILE= in the unit)",
            self.total
        );
        Self {
            total: room,
            per_source: self.per_source.min(room),
        }
    }
}

/// The live connections, oldest first.
pub struct Connections {
    limits: Limits,
    table: Mutex<Table>,
}

struct Table {
    next: u64,
    /// By id, and ids only grow: the first entry of a source is its oldest connection.
    live: BTreeMap<u64, Live>,
    per_source: HashMap<IpAddr, usize>,
    shed: Throttle,
}

struct Live {
    source: IpAddr,
    /// Dropping it tells the connection's task to close the socket.
    _close: oneshot::Sender<()>,
}

/// A place in the table, given back when dropped. `shed` resolves when the connection must
/// close at once to make room.
pub struct Ticket {
    id: u64,
    connections: Arc<Connections>,
    pub shed: oneshot::Receiver<()>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.connections.lock().release(self.id);
    }
}

impl Connections {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            table: Mutex::new(Table {
                next: 0,
                live: BTreeMap::new(),
                per_source: HashMap::new(),
                shed: Throttle::new(LOG_EVERY),
            }),
        })
    }

    /// The number of connections open now.
    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.lock().live.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Enters a new connection from `source`, closing another first when a limit is reached.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Ticket {
        let source = source.to_canonical();
        let (close, closed) = oneshot::channel();
        let mut table = self.lock();
        let from_source = table.per_source.get(&source).copied().unwrap_or(0);
        let victim = if from_source >= self.limits.per_source {
            Some(source)
        } else if table.live.len() >= self.limits.total {
            table.heaviest()
        } else {
            None
        };
        if let Some(victim) = victim {
            table.evict_oldest(victim, self.limits);
        }
        let id = table.next;
        table.next += 1;
        table.live.insert(
            id,
            Live {
                source,
                _close: close,
            },
        );
        *table.per_source.entry(source).or_default() += 1;
        Ticket {
            id,
            connections: Arc::clone(self),
            shed: closed,
        }
    }
}

impl Table {
    fn heaviest(&self) -> Option<IpAddr> {
        self.per_source
            .iter()
            .max_by_key(|(_, count)| **count)
            .map(|(source, _)| *source)
    }

    fn evict_oldest(&mut self, source: IpAddr, limits: Limits) {
        let Some(id) = self
            .live
            .iter()
            .find(|(_, live)| live.source == source)
            .map(|(id, _)| *id)
        else {
            return;
        };
        let held = self.per_source.get(&source).copied().unwrap_or(0);
        self.release(id);
        if let Some(count) = self.shed.hit(Instant::now()) {
            tracing::warn!(
                "connection limit reached ({} in all, {} per source): closed {count} oldest \
                 connection(s) in the last {}s, the latest from {source}, which held {held}",
                limits.total,
                limits.per_source,
                LOG_EVERY.as_secs()
            );
        }
    }

    fn release(&mut self, id: u64) {
        let Some(live) = self.live.remove(&id) else {
            return;
        };
        if let Some(count) = self.per_source.get_mut(&live.source) {
            *count -= 1;
            if *count == 0 {
                self.per_source.remove(&live.source);
            }
        }
    }
}

/// Counts an event that may repeat thousands of times a second, and says when it is time to
/// log it again: at the first occurrence, then at most once per period, with the count since.
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    last: Option<Instant>,
    count: u64,
}

impl Throttle {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            count: 0,
        }
    }

    /// Records one event; `Some(n)` when it should be logged, `n` counting this one.
    pub fn hit(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < self.every)
        {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_source_at_its_limit_sheds_its_own_oldest() {
        let table = Connections::new(Limits {
            total: 10,
            per_source: 2,
        });
        let mut first = table.admit(ip("10.0.0.1"));
        let _second = table.admit(ip("10.0.0.1"));
        let mut other = table.admit(ip("10.0.0.2"));
        let _third = table.admit(ip("10.0.0.1"));
        assert!(
            first
                .shed
                .try_recv()
                .is_err_and(|e| e == oneshot::error::TryRecvError::Closed)
        );
        assert!(
            other
                .shed
                .try_recv()
                .is_err_and(|e| e == oneshot::error::TryRecvError::Empty)
        );
        assert_eq!(table.open(), 3);
    }

    #[test]
    fn a_full_table_sheds_from_the_heaviest_source() {
        let table = Connections::new(Limits {
            total: 4,
            per_source: 4,
        });
        let mut lb = table.admit(ip("10.0.0.9"));
        let mut flood: Vec<_> = (0..3).map(|_| table.admit(ip("10.0.0.1"))).collect();
        let _new_lb_poll = table.admit(ip("::ffff:10.0.0.9"));
        assert_eq!(table.open(), 4);
        assert!(
            lb.shed
                .try_recv()
                .is_err_and(|e| e == oneshot::error::TryRecvError::Empty)
        );
        assert!(
            flood[0]
                .shed
                .try_recv()
                .is_err_and(|e| e == oneshot::error::TryRecvError::Closed)
        );
        assert!(
            flood[1]
                .shed
                .try_recv()
                .is_err_and(|e| e == oneshot::error::TryRecvError::Empty)
        );
    }

    #[test]
    fn dropped_tickets_give_their_place_back() {
        let table = Connections::new(Limits {
            total: 2,
            per_source: 2,
        });
        let a = table.admit(ip("10.0.0.1"));
        let b = table.admit(ip("10.0.0.2"));
        drop((a, b));
        assert_eq!(table.open(), 0);
        assert!(table.lock().per_source.is_empty());
    }

    #[test]
    fn the_throttle_speaks_once_per_period_with_the_count() {
        let mut t = Throttle::new(Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(t.hit(start), Some(1));
        for i in 1..1000 {
            assert_eq!(t.hit(start + Duration::from_millis(i)), None);
        }
        assert_eq!(t.hit(start + Duration::from_secs(10)), Some(1000));
    }
}
