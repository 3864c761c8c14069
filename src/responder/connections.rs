//! The connection table: how many sockets pollers may hold at once, and who gives way when the
//! table is full.
//!
//! A health checker that can be knocked over takes the whole pool with it, so a new connection
//! is always accepted at once (nothing waits in the kernel's accept queue) and, past a limit,
//! one is closed: another, or the newcomer itself. A proven load balancer (it polled with its
//! key, or from an `--lb-address`) has room kept for it and is never closed to make room for
//! anyone else: a flood of polite pollers, each asking every few seconds, looks like monitors,
//! and regularity once protected it instead of the load balancer (the c8a278e audit). Among the
//! others, what goes first: a connection that never sent its request within [`GRACE`], then
//! one of the source holding the most (more than a monitor's [`LIGHT`]; a source as heavy as
//! any pays for its own newcomers), then the oldest one that has not asked yet; a newcomer
//! never displaces a connection that asked, it is closed instead. Each choice costs a lookup
//! in an index, never a walk through the table. The table stays below the process's
//! descriptor limit, which is raised at start.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::responder::throttle::EVERY as LOG_EVERY;
pub use crate::responder::throttle::Throttle;
pub use crate::settings::Limits;

/// Descriptors kept for everything but polls: listeners, the probe, the journal, blocking reads.
const RESERVED_FDS: u64 = 64;

impl Limits {
    /// Raises the soft descriptor limit to the hard one, then shrinks the limits to fit under
    /// it, saying so: a table larger than the descriptors would let `accept` fail instead.
    pub fn fit_descriptors(self) -> Self {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        let soft = match getrlimit(Resource::RLIMIT_NOFILE) {
            Ok((soft, hard))
                if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() =>
            {
                tracing::debug!(from = soft, to = hard, "raised the descriptor limit");
                hard
            }
            Ok((soft, _)) => soft,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "cannot read the descriptor limit; keeping --max-connections as given"
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
            max_connections = self.total,
            descriptor_limit = soft,
            using = room,
            "--max-connections does not fit the descriptor limit (raise LimitNOFILE= in the unit)"
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
    /// Told of the first request, for a stop that waits for it.
    first: tokio::sync::Notify,
    /// Its latest request did not prove itself a load balancer's: a connection admitted as a
    /// proven load balancer's (by its address) loses its kept room.
    unproven: AtomicBool,
}

impl Activity {
    /// Its latest request proved itself a load balancer's (its key, or an `--lb-address`), or
    /// did not.
    pub fn proved(&self, proven: bool) {
        self.unproven.store(!proven, Ordering::Relaxed);
    }

    fn stamp(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    /// A complete request arrived (or, on the agent port, the line was taken).
    pub fn asked(&self) {
        if self.asked.swap(self.stamp(), Ordering::Relaxed) == 0 {
            // A permit, kept until [`Activity::first_request`] takes it.
            self.first.notify_one();
        }
    }

    /// Resolves once a complete request has arrived on this connection.
    pub async fn first_request(&self) {
        if !self.has_asked() {
            self.first.notified().await;
        }
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

#[derive(Default)]
struct Table {
    next: u64,
    /// By id, and ids only grow: the first entry is the oldest connection.
    live: BTreeMap<u64, Live>,
    sources: HashMap<IpAddr, Source>,
    /// The sources of unproven connections by how many each holds, the most last.
    heaviest: BTreeSet<(usize, IpAddr)>,
    /// Unproven connections not seen to ask yet, oldest first (those that asked since are
    /// dropped when met).
    fresh: BTreeSet<u64>,
    /// The connections admitted as a proven load balancer's, until they show otherwise (never
    /// closed for another's); every other live one counts as unproven.
    proven: BTreeSet<u64>,
    shed: Throttle,
    refused: Throttle,
}

/// One source's connections.
#[derive(Default)]
struct Source {
    ids: BTreeSet<u64>,
    unproven: usize,
}

struct Live {
    source: IpAddr,
    /// When it was accepted, as [`Activity`] stamps time.
    accepted: u64,
    activity: Arc<Activity>,
    /// Dropping it tells the connection's task to close the socket.
    _close: oneshot::Sender<()>,
}

/// How long a new connection has to send its request: a load balancer's check sends it at once.
pub const GRACE: Duration = Duration::from_secs(1);
/// What a monitor holds from one address (one or two kept-alive connections): a source holding
/// no more is never shed for being the heaviest.
const LIGHT: usize = 2;

/// The loopback address the operator's commands use by default (`--url`).
fn operator(source: IpAddr) -> bool {
    source == IpAddr::from([127, 0, 0, 1]) || source == IpAddr::from(std::net::Ipv6Addr::LOCALHOST)
}

/// The room kept for proven load balancers: an eighth of the table, at most 64 (HAProxy holds
/// one connection per check while it runs, a few milliseconds each).
fn reserved(total: usize) -> usize {
    (total / 8).min(64)
}

impl Live {
    /// Which of one source's connections goes first, lowest first: one that never asked within
    /// its grace, one whose client does not read its answers (stalled longest first), the
    /// idlest of those that asked, and one still within its grace last.
    fn rank(&self, id: u64, now: u64) -> (u8, u64) {
        let asked = self.activity.asked.load(Ordering::Relaxed);
        let stalled = self.activity.stalled.load(Ordering::Relaxed);
        match (asked, stalled) {
            (0, _) if self.late(now) => (0, id),
            (1.., 1..) => (1, stalled),
            (1.., _) => (2, asked),
            (0, _) => (3, id),
        }
    }

    /// It has not asked and its grace is over.
    fn late(&self, now: u64) -> bool {
        self.activity.asked.load(Ordering::Relaxed) == 0
            && now.saturating_sub(self.accepted) > GRACE.as_millis() as u64
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
            table: Mutex::default(),
            epoch: Instant::now(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Enters a new connection from `source` (`proven`: a proven load balancer's address),
    /// closing another first when a limit is reached, or, when none may go, this one: its
    /// ticket's `shed` has resolved already.
    pub fn admit(self: &Arc<Self>, source: IpAddr, proven: bool) -> Ticket {
        let source = source.to_canonical();
        let (close, closed) = oneshot::channel();
        let activity = Arc::new(Activity {
            epoch: self.epoch,
            asked: AtomicU64::new(0),
            stalled: AtomicU64::new(0),
            first: tokio::sync::Notify::new(),
            unproven: AtomicBool::new(false),
        });
        let now = activity.stamp();
        let limits = self.limits;
        let mut table = self.lock();
        let id = table.next;
        table.next += 1;
        let ticket = Ticket {
            id,
            connections: Arc::clone(self),
            shed: closed,
            activity: Arc::clone(&activity),
        };
        let held = table.sources.get(&source).map_or(0, |s| s.ids.len());
        // The operator's own commands (`status`, the waits) ask from this host's loopback, one
        // or two connections at a time: they have a load balancer's room while that address
        // holds no more than a monitor's two, so a flood never locks the operator out (a
        // flood from there has none).
        let proven = proven || (held < LIGHT && operator(source));
        let crowded =
            held >= limits.per_source || table.live.len() + reserved(limits.total) >= limits.total;
        if crowded {
            table.demote(now);
        }
        let room = if held >= limits.per_source {
            Some(table.least_useful(source, now, false))
        } else if table.live.len() >= limits.total
            || (!proven
                && table.live.len() - table.proven.len() >= limits.total - reserved(limits.total))
        {
            table.victim(source, proven, now)
        } else {
            Some(None)
        };
        match room {
            Some(Some(victim)) => table.shed(victim, limits),
            Some(None) => {}
            None => {
                // `close` is dropped: the connection closes at once.
                table.refuse(source, limits);
                return ticket;
            }
        }
        table.live.insert(
            id,
            Live {
                source,
                accepted: now,
                activity,
                _close: close,
            },
        );
        table.sources.entry(source).or_default().ids.insert(id);
        if proven {
            table.proven.insert(id);
        } else {
            table.count_unproven(id, source);
        }
        ticket
    }
}

impl Table {
    /// Counts `id` of `source` among the connections that are no proven load balancer's.
    fn count_unproven(&mut self, id: u64, source: IpAddr) {
        let from = self.sources.entry(source).or_default();
        self.heaviest.remove(&(from.unproven, source));
        from.unproven += 1;
        self.heaviest.insert((from.unproven, source));
        if self.live.get(&id).is_some_and(|l| !l.activity.has_asked()) {
            self.fresh.insert(id);
        }
    }

    /// Connections admitted as a proven load balancer's by their address that did not prove
    /// themselves (a request without the key, or none within [`GRACE`]) lose their kept room:
    /// a keyless curl loop on the load balancer's host is shed like anyone's. A walk through
    /// those connections only, each leaving the set once.
    fn demote(&mut self, now: u64) {
        let unproven: Vec<u64> = (self.proven.iter())
            .filter(|id| {
                self.live
                    .get(id)
                    .is_some_and(|l| l.activity.unproven.load(Ordering::Relaxed) || l.late(now))
            })
            .copied()
            .collect();
        for id in unproven {
            self.proven.remove(&id);
            if let Some(source) = self.live.get(&id).map(|l| l.source) {
                self.count_unproven(id, source);
            }
        }
    }

    /// Which connection makes room for a newcomer from `source`: `Some(Some(id))`, or
    /// `Some(None)` when none need go, or `None` when the newcomer must (module doc).
    fn victim(&mut self, source: IpAddr, proven: bool, now: u64) -> Option<Option<u64>> {
        // Not yet asked, oldest first: those that asked meanwhile leave the index here.
        let oldest_fresh = loop {
            let Some(&id) = self.fresh.first() else {
                break None;
            };
            match self.live.get(&id) {
                Some(live) if !live.activity.has_asked() => break Some((id, live.late(now))),
                _ => {
                    self.fresh.pop_first();
                }
            }
        };
        if let Some((id, true)) = oldest_fresh {
            return Some(Some(id));
        }
        let mine = if proven {
            0
        } else {
            self.sources.get(&source).map_or(0, |s| s.unproven) + 1
        };
        let heaviest = self.heaviest.last().copied();
        if let Some((count, heavy)) = heaviest {
            if !proven && mine > LIGHT && mine >= count {
                return None;
            }
            if count > LIGHT && count > mine {
                return Some(self.least_useful(heavy, now, true));
            }
        }
        if let Some((id, _)) = oldest_fresh {
            return Some(Some(id));
        }
        if !proven {
            return None;
        }
        match heaviest {
            Some((_, heavy)) => Some(self.least_useful(heavy, now, true)),
            None => Some(self.live.keys().next().copied()),
        }
    }

    /// The connection of `source` that goes first (unproven ones only, when `unproven`), if
    /// it has any. A scan of one source's connections, at most
    /// `--max-connections-per-source`.
    fn least_useful(&self, source: IpAddr, now: u64, unproven: bool) -> Option<u64> {
        let ids = self.sources.get(&source).map(|s| &s.ids);
        (ids.into_iter().flatten())
            .filter_map(|id| Some((*id, self.live.get(id)?)))
            .filter(|(id, _)| !(unproven && self.proven.contains(id)))
            .min_by_key(|(id, live)| live.rank(*id, now))
            .map(|(id, _)| id)
    }

    /// Closes `id` to make room.
    fn shed(&mut self, id: u64, limits: Limits) {
        let Some(victim) = self.live.get(&id).map(|l| l.source) else {
            return;
        };
        let held = self.sources.get(&victim).map_or(0, |s| s.ids.len());
        self.release(id);
        if let Some(count) = self.shed.hit(Instant::now()) {
            tracing::warn!(
                count,
                peer = %victim,
                held,
                total = limits.total,
                per_source = limits.per_source,
                reserved = reserved(limits.total),
                every_s = LOG_EVERY.as_secs(),
                "connection limit reached: closed connections that sent no request, did not read \
                 their answers or came from the address holding the most"
            );
        }
    }

    /// Notes a newcomer closed at once: every connection that might go was a proven load
    /// balancer's or had asked, or its source holds as many as any.
    fn refuse(&mut self, source: IpAddr, limits: Limits) {
        if let Some(count) = self.refused.hit(Instant::now()) {
            let held = self.sources.get(&source).map_or(0, |s| s.ids.len());
            tracing::warn!(
                count,
                peer = %source,
                held,
                total = limits.total,
                reserved = reserved(limits.total),
                every_s = LOG_EVERY.as_secs(),
                "connection limit reached: closed new connections at once (the others asked, or \
                 belong to proven load balancers)"
            );
        }
    }

    fn release(&mut self, id: u64) {
        let Some(live) = self.live.remove(&id) else {
            return;
        };
        let proven = self.proven.remove(&id);
        let Some(mut from) = self.sources.remove(&live.source) else {
            return;
        };
        from.ids.remove(&id);
        if !proven {
            self.heaviest.remove(&(from.unproven, live.source));
            from.unproven -= 1;
            if from.unproven > 0 {
                self.heaviest.insert((from.unproven, live.source));
            }
            self.fresh.remove(&id);
        }
        if !from.ids.is_empty() {
            self.sources.insert(live.source, from);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Connections {
        /// The number of connections open now.
        pub fn open(&self) -> usize {
            self.lock().live.len()
        }
    }

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

    /// A table whose connections are `age` old (their grace over when it is more than
    /// [`GRACE`]): a tiny epoch moved back.
    fn aged(limits: Limits, age: Duration) -> Arc<Connections> {
        let connections = Connections::new(limits);
        let table = Arc::into_inner(connections).unwrap();
        Arc::new(Connections {
            epoch: Instant::now().checked_sub(age).unwrap(),
            ..table
        })
    }

    /// The c8a278e audit: a polite flood (many addresses, several kept-alive connections
    /// each, every one asking) filled the table, and each check of a load balancer, not yet
    /// asked, was the first to go. A proven load balancer's newcomer displaces the flood, and
    /// the flood's own newcomers are closed, not the connections that asked.
    #[test]
    fn a_polite_flood_never_takes_a_proven_load_balancers_place() {
        let table = Connections::new(Limits {
            total: 16,
            per_source: 8,
        });
        assert_eq!(reserved(16), 2);
        let mut flood: Vec<_> = (0..14)
            .map(|n| table.admit(ip(&format!("10.1.0.{}", n / 7)), false))
            .collect();
        for t in &flood {
            t.activity.asked();
        }
        // The unproven have all but the reserved room: a flood's newcomer is closed at once.
        let mut more = table.admit(ip("10.1.0.0"), false);
        assert!(closed(&mut more));
        assert!(flood.iter_mut().all(|t| !closed(t)));
        // The proven load balancer's checks take the reserved room, then displace the flood.
        let mut lb: Vec<_> = (0..4).map(|_| table.admit(ip("10.0.0.9"), true)).collect();
        assert!(lb.iter_mut().all(|t| !closed(t)));
        assert_eq!(flood.iter_mut().map(closed).filter(|&c| c).count(), 2);
        assert_eq!(table.open(), 16);
        // Not asked yet, they stay while the flood knocks again.
        for n in 0..20 {
            let mut newcomer = table.admit(ip(&format!("10.1.0.{}", n % 2)), false);
            assert!(
                closed(&mut newcomer),
                "a flood's newcomer displaced someone"
            );
        }
        assert!(lb.iter_mut().all(|t| !closed(t)));
        // An unproven poller from a light address still gets in, at the heaviest's expense.
        let mut monitor = table.admit(ip("10.0.0.4"), false);
        assert!(!closed(&mut monitor));
        assert_eq!(flood.iter_mut().map(closed).filter(|&c| c).count(), 3);
    }

    /// The audit at 4743d29: every connection from a proven load balancer's address was kept,
    /// keyless or not. Admitted as the load balancer's by its address, a connection that asks
    /// without the key (or does not ask within its grace) is shed like anyone's; one that
    /// proved itself stays.
    #[test]
    fn a_keyless_connection_from_a_proven_address_loses_its_kept_room() {
        let table = Connections::new(Limits {
            total: 16,
            per_source: 16,
        });
        let mut keyed = table.admit(ip("10.0.0.9"), true);
        keyed.activity.asked();
        keyed.activity.proved(true);
        let mut curl: Vec<_> = (0..6).map(|_| table.admit(ip("10.0.0.9"), true)).collect();
        for t in &curl {
            t.activity.asked();
            t.activity.proved(false);
        }
        let mut flood: Vec<_> = (0..7)
            .map(|n| table.admit(ip(&format!("10.1.0.{n}")), false))
            .collect();
        for t in &flood {
            t.activity.asked();
        }
        assert_eq!(table.open(), 14);
        // Crowded: the keyless ones from the load balancer's address are its heaviest
        // unproven source, and pay for the newcomers down to a monitor's two; the keyed check
        // never does.
        for n in 0..5 {
            let mut newcomer = table.admit(ip(&format!("10.2.0.{n}")), false);
            assert!(!closed(&mut newcomer), "newcomer {n} was refused");
            newcomer.activity.asked();
            std::mem::forget(newcomer);
        }
        assert!(!closed(&mut keyed));
        assert_eq!(curl.iter_mut().map(closed).filter(|&c| c).count(), 4);
        assert!(flood.iter_mut().all(|t| !closed(t)));
        let mut refused = table.admit(ip("10.2.0.9"), false);
        assert!(
            closed(&mut refused),
            "a monitor's two and the keyed check stay"
        );
        assert!(!closed(&mut keyed));
    }

    /// The audit at 4743d29: under a polite flood (every connection asked) the operator's
    /// `/status` from 127.0.0.1 was closed as any newcomer is, and `drain` could not ask the
    /// daemon. The operator's loopback has room of its own, for a monitor's two connections.
    #[test]
    fn the_operators_loopback_gets_in_under_a_polite_flood() {
        let table = Connections::new(Limits {
            total: 16,
            per_source: 16,
        });
        let mut flood: Vec<_> = (0..14)
            .map(|n| table.admit(ip(&format!("127.1.0.{n}")), false))
            .collect();
        for t in &flood {
            t.activity.asked();
        }
        let mut stranger = table.admit(ip("127.2.0.1"), false);
        assert!(closed(&mut stranger), "a flood's newcomer waits its turn");
        for source in ["127.0.0.1", "::1", "127.0.0.1"] {
            let mut operator = table.admit(ip(source), false);
            assert!(
                !closed(&mut operator),
                "the operator from {source} was refused"
            );
            operator.activity.asked();
            std::mem::forget(operator);
        }
        assert!(flood.iter_mut().any(closed), "room was made");
        // A third connection of the operator's address is anyone's.
        let mut third = table.admit(ip("127.0.0.1"), false);
        assert!(closed(&mut third));
    }

    /// Spread over thousands of addresses, a flood holds one connection per address: what
    /// never asked within its grace goes first, then a newcomer displaces only the oldest that
    /// has not asked yet, never a monitor that asked.
    #[test]
    fn a_spread_flood_sheds_what_never_asked_and_never_a_monitor_that_did() {
        let limits = Limits {
            total: 5,
            per_source: 5,
        };
        let table = aged(limits, Duration::ZERO);
        let mut monitor = [
            table.admit(ip("10.0.0.4"), false),
            table.admit(ip("10.0.0.4"), false),
        ];
        let mut idle = table.admit(ip("10.0.1.1"), false);
        let mut asked = table.admit(ip("10.0.1.2"), false);
        let mut lb = table.admit(ip("10.0.0.9"), false);
        for t in monitor.iter().chain([&asked]) {
            t.activity.asked();
        }
        // Within their grace, the oldest that has not asked goes.
        let mut next = table.admit(ip("10.0.1.3"), false);
        assert!(closed(&mut idle));
        assert!(!closed(&mut lb) && !closed(&mut next));
        lb.activity.asked();
        next.activity.asked();
        // All asked: a newcomer of one more light address is closed itself.
        let mut late = table.admit(ip("10.0.1.4"), false);
        assert!(closed(&mut late));
        assert!(monitor.iter_mut().chain([&mut asked]).all(|t| !closed(t)));

        // A connection that never asked within its grace goes before anything else.
        let old = aged(limits, GRACE * 2);
        let mut slow = old.admit(ip("10.0.1.1"), false);
        let mut rest: Vec<_> = (2..6)
            .map(|n| old.admit(ip(&format!("10.0.1.{n}")), false))
            .collect();
        for t in &rest {
            t.activity.asked();
        }
        let mut newcomer = old.admit(ip("10.0.2.1"), false);
        assert!(closed(&mut slow) && !closed(&mut newcomer));
        assert!(rest.iter_mut().all(|t| !closed(t)));
    }

    /// A proven load balancer's connections go only for its own at its per-source limit, or
    /// for another proven one when nothing else is left.
    #[test]
    fn only_a_proven_load_balancer_closes_a_proven_one() {
        let table = Connections::new(Limits {
            total: 3,
            per_source: 2,
        });
        let mut lb = [
            table.admit(ip("10.0.0.9"), true),
            table.admit(ip("10.0.0.9"), true),
        ];
        let mut other = table.admit(ip("10.0.0.8"), true);
        let mut flood = table.admit(ip("10.1.0.1"), false);
        assert!(closed(&mut flood), "no room for the unproven");
        assert!(lb.iter_mut().chain([&mut other]).all(|t| !closed(t)));
        let _third = table.admit(ip("10.0.0.9"), true);
        assert!(closed(&mut lb[0]) && !closed(&mut lb[1]) && !closed(&mut other));
    }

    /// Within a source, a client that does not read its answers goes before one that does.
    #[test]
    fn a_stalled_write_that_went_through_no_longer_counts() {
        let table = Connections::new(Limits {
            total: 4,
            per_source: 2,
        });
        let mut first = table.admit(ip("10.0.0.1"), false);
        let mut second = table.admit(ip("10.0.0.1"), false);
        first.activity.asked();
        first.activity.stalled(true);
        first.activity.stalled(false);
        std::thread::sleep(Duration::from_millis(3));
        second.activity.asked();
        second.activity.stalled(true);
        let _third = table.admit(ip("10.0.0.1"), false);
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
        let t = table.lock();
        assert!(t.sources.is_empty() && t.heaviest.is_empty() && t.fresh.is_empty());
        assert!(t.live.is_empty() && t.proven.is_empty());
    }

    #[test]
    fn the_throttle_speaks_once_per_period_with_the_count() {
        let t = Throttle::default();
        let start = Instant::now();
        assert_eq!(t.hit(start), Some(1));
        for i in 1..1000 {
            assert_eq!(t.hit(start + Duration::from_millis(i)), None);
        }
        assert_eq!(t.hit(start + Duration::from_secs(10)), Some(1000));
    }
}
