//! The connection table: how many sockets pollers may hold at once, and who gives way when the
//! table is full.
//!
//! A health checker that can be knocked over takes the whole pool with it, so a new connection
//! is always accepted at once (nothing waits in the kernel's accept queue) and, past a limit,
//! another is closed. An address holding more connections than any load balancer or monitor
//! would sheds its own, oldest first. Otherwise the one that behaves least like a load
//! balancer goes: a connection that never sent a complete request, one whose answers the
//! client does not read, a regular poller's new connection
//! ([`crate::responder::pollers::REGULAR`]), then the idlest of an address that is not a
//! regular poller, and a regular poller's last.
//! A load balancer's check sends its request at once and reads the answer, and a monitor's
//! kept-alive connection asks again every few seconds, so neither is closed while a flood,
//! from one address or from thousands, holds connections that do neither. A source at its own
//! limit sheds its own connection by the same order. The table stays below the process's
//! descriptor limit, which is raised at start.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

pub use crate::settings::Limits;

/// Descriptors kept for everything but polls: listeners, the probe, the journal, blocking reads.
const RESERVED_FDS: u64 = 64;
/// How often a repeating event (shedding, refusals, accept errors) is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);

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
    /// The origin of the times in each [`Activity`].
    epoch: Instant,
}

/// What a connection has done, as shedding reads it: written by the connection's task without
/// taking the table's lock.
#[derive(Debug)]
pub struct Activity {
    epoch: Instant,
    /// When the last complete request arrived, in ms after `epoch` plus one; 0 for none yet.
    asked: AtomicU64,
    /// Since when a write has waited for the client to read, in ms after `epoch` plus one; 0
    /// while none waits.
    stalled: AtomicU64,
}

impl Activity {
    fn new(epoch: Instant) -> Self {
        Self {
            epoch,
            asked: AtomicU64::new(0),
            stalled: AtomicU64::new(0),
        }
    }

    fn stamp(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    /// A complete request arrived (or, on the agent port, the line was taken).
    pub fn asked(&self) {
        self.asked.store(self.stamp(), Ordering::Relaxed);
    }

    /// A complete request has arrived on this connection.
    pub fn has_asked(&self) -> bool {
        self.asked.load(Ordering::Relaxed) != 0
    }

    /// A write waits for the client (`true`), or went through (`false`).
    pub fn stalled(&self, waiting: bool) {
        if !waiting {
            self.stalled.store(0, Ordering::Relaxed);
        } else if self.stalled.load(Ordering::Relaxed) == 0 {
            self.stalled.store(self.stamp(), Ordering::Relaxed);
        }
    }
}

struct Table {
    next: u64,
    /// By id, and ids only grow: the first entry of a source is its oldest connection.
    live: BTreeMap<u64, Live>,
    per_source: HashMap<IpAddr, usize>,
    /// How many sources hold more than [`HEAVY`] connections.
    heavy: usize,
    shed: Throttle,
}

struct Live {
    source: IpAddr,
    /// The source was a regular poller when the connection was accepted.
    regular: bool,
    activity: Arc<Activity>,
    /// Dropping it tells the connection's task to close the socket.
    _close: oneshot::Sender<()>,
}

/// More connections than any load balancer or monitor holds from one address: HAProxy opens
/// one per check, a monitor keeps one or two alive.
const HEAVY: usize = 8;

impl Live {
    /// Which connection goes first, lowest first. An address holding more than [`HEAVY`]
    /// sheds its own, oldest first, whatever they do: a flood from one address pays for
    /// itself. Otherwise the least like a load balancer's: one that never asked (oldest
    /// first), one whose client does not read its answers (stalled longest first), a regular
    /// poller's new connection, then by idleness one from an address that is not a regular
    /// poller, and a regular poller's last. (Ids grow with time, so a never-asked connection's
    /// id is its age.)
    fn rank(&self, id: u64, held: usize) -> (u8, u64) {
        let asked = self.activity.asked.load(Ordering::Relaxed);
        let stalled = self.activity.stalled.load(Ordering::Relaxed);
        match (asked, stalled) {
            _ if held > HEAVY => (0, id),
            (0, _) if !self.regular => (1, id),
            (_, 1..) => (2, stalled),
            (0, _) => (3, id),
            _ if !self.regular => (4, asked),
            _ => (5, asked),
        }
    }
}

/// A place in the table, given back when dropped. `shed` resolves when the connection must
/// close at once to make room.
pub struct Ticket {
    id: u64,
    connections: Arc<Connections>,
    pub shed: oneshot::Receiver<()>,
    /// What the connection does, for the shedding order.
    pub activity: Arc<Activity>,
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
                heavy: 0,
                shed: Throttle::new(LOG_EVERY),
            }),
            epoch: Instant::now(),
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

    /// Enters a new connection from `source` (`regular`: a regular poller), closing another
    /// first when a limit is reached.
    pub fn admit(self: &Arc<Self>, source: IpAddr, regular: bool) -> Ticket {
        let source = source.to_canonical();
        let (close, closed) = oneshot::channel();
        let activity = Arc::new(Activity::new(self.epoch));
        let mut table = self.lock();
        let from_source = table.per_source.get(&source).copied().unwrap_or(0);
        if from_source >= self.limits.per_source {
            table.shed(Some(source), self.limits);
        } else if table.live.len() >= self.limits.total {
            table.shed(None, self.limits);
        }
        let id = table.next;
        table.next += 1;
        table.live.insert(
            id,
            Live {
                source,
                regular,
                activity: Arc::clone(&activity),
                _close: close,
            },
        );
        let held = table.per_source.entry(source).or_default();
        *held += 1;
        if *held == HEAVY + 1 {
            table.heavy += 1;
        }
        Ticket {
            id,
            connections: Arc::clone(self),
            shed: closed,
            activity,
        }
    }
}

impl Table {
    /// Closes the connection least like a load balancer's, of `source` only when given.
    fn shed(&mut self, source: Option<IpAddr>, limits: Limits) {
        // Oldest first, so the scan stops at the first connection of the best rank there can
        // be: one of a heavy address, or a never-asked one when no address is heavy. Under a
        // flood that is one of the first few.
        let mut best: Option<((u8, u64), u64, IpAddr)> = None;
        for (id, live) in &self.live {
            if source.is_some_and(|s| live.source != s) {
                continue;
            }
            let held = self.per_source.get(&live.source).copied().unwrap_or(0);
            let rank = live.rank(*id, held);
            if best.as_ref().is_none_or(|(b, _, _)| rank < *b) {
                best = Some((rank, *id, live.source));
            }
            if rank.0 == 0 || (rank.0 == 1 && (self.heavy == 0 || source.is_some())) {
                break;
            }
        }
        let Some((_, id, victim)) = best else {
            return;
        };
        let held = self.per_source.get(&victim).copied().unwrap_or(0);
        self.release(id);
        if let Some(count) = self.shed.hit(Instant::now()) {
            tracing::warn!(
                count,
                peer = %victim,
                held,
                "connection limit reached ({} in all, {} per source): closed {count} \
                 connection(s) in the last {}s that sent no request, did not read their \
                 answers or were idle longest, the latest from {victim}, which held {held}",
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
            if *count == HEAVY + 1 {
                self.heavy -= 1;
            }
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
        let mut first = table.admit(ip("10.0.0.1"), false);
        let _second = table.admit(ip("10.0.0.1"), false);
        let mut other = table.admit(ip("10.0.0.2"), false);
        let _third = table.admit(ip("10.0.0.1"), false);
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

    fn closed(ticket: &mut Ticket) -> bool {
        ticket
            .shed
            .try_recv()
            .is_err_and(|e| e == oneshot::error::TryRecvError::Closed)
    }

    /// Spread over thousands of addresses, a flood holds one connection per address: the
    /// order sheds what a load balancer never does, whatever the addresses.
    #[test]
    fn a_full_table_sheds_what_a_load_balancer_never_does() {
        let table = Connections::new(Limits {
            total: 5,
            per_source: 5,
        });
        let mut monitor = table.admit(ip("10.0.0.4"), true);
        let mut lb = table.admit(ip("10.0.0.9"), false);
        let mut reader = table.admit(ip("10.0.1.1"), false);
        let mut stalled = table.admit(ip("10.0.1.2"), false);
        let mut idle = table.admit(ip("10.0.1.3"), false);
        monitor.activity.asked();
        reader.activity.asked();
        stalled.activity.asked();
        stalled.activity.stalled(true);
        lb.activity.asked();
        // Full: the connection that never asked goes first, although it is the newest.
        let next = table.admit(ip("10.0.1.4"), false);
        assert!(closed(&mut idle));
        next.activity.asked();
        // Then the one whose client does not read its answers.
        let last = table.admit(ip("10.0.1.5"), false);
        assert!(closed(&mut stalled));
        last.activity.asked();
        // Among those that asked, an unknown address idle longest, never the regular poller.
        std::thread::sleep(Duration::from_millis(3));
        for ticket in [&lb, &next, &last] {
            ticket.activity.asked();
        }
        let _newcomer = table.admit(ip("10.0.1.6"), false);
        assert!(closed(&mut reader), "the unknown address idle longest");
        assert!(!closed(&mut monitor), "a regular poller is shed last");
        assert!(!closed(&mut lb));
        assert_eq!(table.open(), 5);
    }

    /// A load balancer's new connection has not asked yet either: an address holding more
    /// than a monitor would goes first, however much older the load balancer's is.
    #[test]
    fn a_heavy_address_sheds_before_an_older_light_one() {
        let table = Connections::new(Limits {
            total: 10,
            per_source: 10,
        });
        let mut lb = table.admit(ip("10.0.0.9"), false);
        let mut flood: Vec<_> = (0..9).map(|_| table.admit(ip("10.0.0.1"), false)).collect();
        let last = table.admit(ip("10.0.0.1"), false);
        assert!(!closed(&mut lb));
        assert!(closed(&mut flood[0]));
        // The flood gone, nobody is heavy: the oldest that never asked goes first again.
        drop(flood);
        let others: Vec<_> = (2..10)
            .map(|n| table.admit(ip(&format!("10.0.1.{n}")), false))
            .collect();
        assert_eq!(table.open(), 10);
        let _newcomer = table.admit(ip("10.0.2.1"), false);
        assert!(closed(&mut lb));
        drop((last, others));
        assert_eq!(table.open(), 1);
    }

    #[test]
    fn a_stalled_write_that_went_through_no_longer_counts() {
        let table = Connections::new(Limits {
            total: 2,
            per_source: 2,
        });
        let mut first = table.admit(ip("10.0.0.1"), false);
        let mut second = table.admit(ip("10.0.0.2"), false);
        first.activity.asked();
        first.activity.stalled(true);
        first.activity.stalled(false);
        std::thread::sleep(Duration::from_millis(3));
        second.activity.asked();
        second.activity.stalled(true);
        let _third = table.admit(ip("10.0.0.3"), false);
        assert!(closed(&mut second));
        assert!(!closed(&mut first));
    }

    #[test]
    fn dropped_tickets_give_their_place_back() {
        let table = Connections::new(Limits {
            total: 2,
            per_source: 2,
        });
        let a = table.admit(ip("10.0.0.1"), false);
        let b = table.admit(ip("10.0.0.2"), false);
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
