//! Who polls this node, and what each was told: the load balancers the drain rule, the waits
//! and `status` read.
//!
//! A poller is an address (HAProxy checks from one address, on a new port each time), its key
//! line, and whether its polls prove that they come from a load balancer ([`Proof`]): the load
//! balancer's own checks and anything else on its host (a user's curl, a monitoring loop) are
//! two pollers, so an unproven poll never changes what a proven one said. Each poller has
//! what its HTTP checks and its agent checks were last told and how many times in a row, and,
//! each server line it checks this node for (one per backend and HAProxy `node`, at most
//! [`STATES`]: [`crate::responder::server_line`]). Two keys at one address are two views.
//!
//! Whether a poller, or one of its server lines, still polls has one definition
//! ([`crate::responder::server_line::polling`]), by its own rhythm; the operator's JSON
//! carries it.
//!
//! A poller is *regular* once it has polled [`REGULAR`] times in a row, each within
//! [`MAX_GAP`] of the one before: a load balancer, or a monitoring loop. The table has a fixed
//! size and recording a poll allocates nothing. A new address takes the place of one gone for
//! [`GONE_AFTER`], else of the not-regular one silent longest; a regular poller is never
//! pushed out. When every place is held by a regular poller the poll is counted as
//! *unrecorded*, and the waits treat recent unrecorded polls as an unknown load balancer:
//! a flood of addresses can delay a wait, never end it early. Only proven polls can be
//! unrecorded: a proven newcomer takes the place of the unproven poller silent longest,
//! regular or not, and an unproven poll that finds no place is not kept at all.

use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::health::hold::Held;
use crate::health::lb_state;
use crate::health::verdict::Verdict;
use crate::protocol::UnrecordedAnswer;
use crate::responder::client_name::ClientName;
use crate::responder::server_line::{Followed, ServerLine, Told};
use crate::settings::lb_proof::Proof;
use crate::text::ms;

/// Most pollers remembered: a few load balancers, monitoring and an operator's curl fit.
pub const CAPACITY: usize = 64;
/// A poller silent this long is gone: it is no longer listed, and its place is free.
pub const GONE_AFTER: Duration = Duration::from_secs(600);
/// Polls in a row that make a poller regular.
pub const REGULAR: u32 = 3;
/// The longest gap between two polls of a regular poller: HAProxy's `inter` is seconds.
pub const MAX_GAP: Duration = Duration::from_secs(60);
/// Most server lines of one load balancer whose state is kept: a line per backend and `node`.
pub const STATES: usize = 16;
/// How a poll came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// An HTTP check (`option httpchk`, curl).
    Http,
    /// HAProxy's agent check.
    Agent,
}

/// One address that polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Poller {
    /// Where the polls come from (IPv4-mapped addresses as IPv4).
    pub address: IpAddr,
    /// How its latest poll proved itself: proven and unproven polls of one address are two
    /// pollers.
    pub proof: Proof,
    /// The key it proves itself with (its first line in the key file): two load balancers
    /// at one address with a key each are two pollers.
    pub key_line: Option<usize>,
    /// The first poll remembered.
    pub first: Instant,
    /// The latest poll of either kind.
    pub last: Instant,
    /// How many polls since `first`, of either kind (saturating).
    pub polls: u32,
    /// Polls in a row, each within [`MAX_GAP`] of the one before.
    pub steady: u32,
    /// Its HTTP checks, if it makes any.
    pub http: Option<Told>,
    /// Its agent checks, if it makes any, whichever line they name.
    pub agent: Option<Told>,
    /// The server lines its HTTP checks sent a state header for.
    pub lines: [Option<ServerLine>; STATES],
    /// Its latest HTTP check that named no client (a load balancer's own, not curl) and sent
    /// no state header: a header older than that is no longer the load balancer's word (its
    /// `http-check send-state` is gone), and is not shown or judged by.
    pub headerless: Option<Instant>,
    /// The client its latest HTTP poll named (`User-Agent`); `None` for HAProxy's checks.
    pub client: Option<ClientName>,
    /// The lack of proof its checks were last logged for: said once per address and kind.
    pub warned: Option<Proof>,
}

impl Poller {
    /// Whether `line` is no longer the load balancer's word: its checks went without a header
    /// since (`http-check send-state` gone), and the line fell silent by its own rhythm. A check
    /// without the header names no line: alone it stops none, so a backend that does not send
    /// its state takes nothing from one beside it that does.
    pub(crate) fn stopped(&self, line: &ServerLine, now: Instant) -> bool {
        self.headerless.is_some_and(|h| h > line.at) && !line.polling(now)
    }

    /// Polls at a steady rhythm and has not fallen silent: a load balancer, never pushed out.
    pub fn regular(&self, now: Instant) -> bool {
        self.steady >= REGULAR && now.saturating_duration_since(self.last) <= MAX_GAP
    }

    /// Still polls, by the rhythm of either kind of check ([`polling`](crate::responder::server_line::polling)).
    pub fn polling(&self, now: Instant) -> bool {
        (self.http.iter().chain(&self.agent)).any(|t| t.polling(now))
    }

    /// Its server lines that are its word at `now`: read well, and not stopped.
    fn current_lines(&self, now: Instant) -> impl Iterator<Item = &ServerLine> {
        (self.lines.iter().flatten()).filter(move |l| l.well_formed && !self.stopped(l, now))
    }

    /// Keeps `header`, answered `verdict` (held for `held`): a well-formed header replaces its
    /// server line's, else takes a free place, else the oldest; a malformed one only another
    /// malformed one's, else a free place.
    fn note_state(&mut self, header: &[u8], well_formed: bool, poll: &Poll<'_>, now: Instant) {
        let (name, node) = (lb_state::name_of(header), lb_state::node_of(header));
        let lines = &mut self.lines;
        let same = lines
            .iter()
            .position(|l| {
                l.as_ref()
                    .is_some_and(|l| l.well_formed && l.name() == name && l.node() == node)
            })
            .filter(|_| well_formed);
        let free = || lines.iter().position(Option::is_none);
        let slot = if well_formed {
            same.or_else(free)
                .or_else(|| (0..STATES).min_by_key(|&i| lines[i].as_ref().map(|l| l.at)))
        } else {
            (lines.iter())
                .position(|l| l.as_ref().is_some_and(|l| !l.well_formed))
                .or_else(free)
        };
        let Some(slot) = slot else { return };
        let before = same.and_then(|i| lines[i].as_ref());
        let mut line = ServerLine::new(now, header, well_formed);
        line.told = poll.verdict;
        line.held = poll.held;
        line.held_last = poll.held.map(|held| (held, now));
        if let Some(before) = before {
            line.follows(before);
        }
        lines[slot] = Some(line);
    }
}

/// One poll, as the table records it.
#[derive(Debug, Clone, Copy)]
pub struct Poll<'a> {
    /// Where it came from.
    pub address: IpAddr,
    /// How.
    pub via: Via,
    /// What it was told.
    pub verdict: Verdict,
    /// Its `X-Haproxy-Server-State` header, if it sent one.
    pub state: Option<&'a [u8]>,
    /// The drain was held for it ([`crate::health::hold`]).
    pub held: Option<Held>,
    /// The server line an agent check named (`agent-send`), if any.
    pub line: Option<&'a [u8]>,
    /// Its `User-Agent` header, if it sent one: HAProxy's checks send none, curl does.
    pub client: Option<&'a [u8]>,
    /// How it proved that it comes from a load balancer.
    pub proof: Proof,
    /// With which key ([`key_line`](crate::settings::lb_proof::Whose::key_line)).
    pub key_line: Option<usize>,
}

#[derive(Debug)]
struct Table {
    pollers: Vec<Poller>,
    /// Polls no entry could hold, and when the latest came.
    unrecorded: Option<(u64, Instant)>,
}

impl Table {
    /// The entry of `address` with this proof and key, made when there is none (pushing out
    /// one that counts for less, when the table is full); `None` when there is no room.
    fn entry(
        &mut self,
        address: IpAddr,
        proof: Proof,
        key_line: Option<usize>,
        now: Instant,
    ) -> Option<usize> {
        let proven = proof.proven();
        let same = |p: &Poller| {
            p.address == address
                && p.proof.proven() == proven
                && (!proven || p.key_line == key_line)
        };
        if let Some(index) = self.pollers.iter().position(same) {
            return Some(index);
        }
        let pollers = &mut self.pollers;
        pollers.retain(|p| now.saturating_duration_since(p.last) < GONE_AFTER);
        if pollers.len() >= CAPACITY {
            // Unproven first, the one silent longest; a proven poller also pushes out a
            // regular unproven one, an unproven poller never pushes out a proven one.
            let loser = (0..pollers.len())
                .filter(|&i| {
                    let p = &pollers[i];
                    !p.proof.proven() && (proven || !p.regular(now))
                })
                .min_by_key(|&i| (pollers[i].regular(now), pollers[i].last))
                .or_else(|| {
                    (0..pollers.len())
                        .filter(|&i| proven && !pollers[i].regular(now))
                        .min_by_key(|&i| pollers[i].last)
                });
            let Some(i) = loser else {
                if proven {
                    let polls = self.unrecorded.map_or(0, |(polls, _)| polls);
                    self.unrecorded = Some((polls.saturating_add(1), now));
                }
                return None;
            };
            pollers.swap_remove(i);
        }
        pollers.push(Poller {
            address,
            proof,
            key_line,
            first: now,
            last: now,
            polls: 0,
            steady: 0,
            http: None,
            agent: None,
            lines: [None; STATES],
            headerless: None,
            client: None,
            warned: None,
        });
        Some(pollers.len() - 1)
    }

    /// The proven pollers at `address`: one per key it proves itself with.
    fn proven(&self, address: IpAddr) -> impl Iterator<Item = &Poller> {
        (self.pollers.iter()).filter(move |p| p.address == address && p.proof.proven())
    }
}

/// The table of pollers; every poll records itself here.
#[derive(Debug)]
pub struct Pollers(Mutex<Table>);

impl Default for Pollers {
    /// An empty table, allocated once.
    fn default() -> Self {
        Self(Mutex::new(Table {
            pollers: Vec::with_capacity(CAPACITY),
            unrecorded: None,
        }))
    }
}

impl Pollers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `address` proved itself a load balancer (its key, or an `--lb-address`) within
    /// [`GONE_AFTER`]: the connection table keeps room for it and never closes its
    /// connections for anyone else's.
    pub fn is_proven(&self, address: IpAddr, now: Instant) -> bool {
        (self.lock().proven(address.to_canonical()))
            .any(|p| now.saturating_duration_since(p.last) < GONE_AFTER)
    }

    /// What the drain rule reads of the server line that `header` is about, of the proven
    /// load balancer at `address` with `key_line`, at its HTTP check.
    pub fn line_facts(
        &self,
        address: IpAddr,
        key_line: Option<usize>,
        header: &[u8],
        now: Instant,
    ) -> Option<ServerLine> {
        let (name, node) = (lb_state::name_of(header), lb_state::node_of(header));
        let table = self.lock();
        let poller = (table.proven(address.to_canonical())).find(|p| p.key_line == key_line)?;
        (poller.current_lines(now))
            .find(|l| l.name() == name && l.node() == node)
            .copied()
    }

    /// What an agent check from `address` follows, which proved itself with `key_line` (`None`
    /// when unproven) and named the server line `name`: what the HTTP checks of its lines
    /// were answered last, while they are checked. An agent check carries no `node`: of the
    /// lines of that name, and of every line when it names none or names a line its load
    /// balancer does not check, the most careful: held first, then one not answered DRAINED.
    /// When no line sends its state, the HTTP checks' latest answer (a load balancer without
    /// `send-state`). An agent check that cannot be placed (unproven, its load balancer checks
    /// nothing known, or a held line at its address has no agent check of its own: a copied
    /// `agent-send`, or another load balancer's key in it) follows any line held at its
    /// address: it never takes out a node held there. A drain that may be held (`holdable`)
    /// counts a line held lately as held ([`ServerLine::held_lately`]); `None`: nothing known.
    pub fn followed(
        &self,
        address: IpAddr,
        key_line: Option<Option<usize>>,
        name: Option<&[u8]>,
        holdable: bool,
        now: Instant,
    ) -> Option<Followed> {
        let table = self.lock();
        let address = address.to_canonical();
        let held = |l: &ServerLine| match holdable {
            true => l.held_lately(now),
            false => l.held,
        };
        let held_lines = || {
            (table.proven(address).flat_map(|p| p.current_lines(now)))
                .filter(|l| l.polling(now) && held(l).is_some())
        };
        let held_here = || careful(held, held_lines);
        // A held line at this address whose agent check is not heard: some agent check names
        // another line, or carries another load balancer's key (a copied `agent-send`).
        let heard = |l: &ServerLine| l.agent.is_some_and(|a| a.polling(now));
        let unheard = || held_lines().any(|l| !heard(l));
        let poller = key_line.and_then(|k| table.proven(address).find(|p| p.key_line == k));
        let Some(poller) = poller.filter(|_| !unheard()) else {
            return held_here();
        };
        let checked = || poller.current_lines(now).filter(|l| l.polling(now));
        let named = name.filter(|n| checked().any(|l| l.name() == *n));
        let found = match named {
            Some(n) => careful(held, || checked().filter(|l| l.name() == n))
                .map(|f| Followed { placed: true, ..f }),
            None => careful(held, checked),
        };
        match (found, poller.http.filter(|t| t.polling(now))) {
            (Some(found), _) => Some(found),
            (None, Some(http)) => Some(Followed {
                told: http.verdict,
                held: None,
                placed: false,
            }),
            (None, None) => held_here(),
        }
    }

    /// Notes that `poll.address` was just told `poll.verdict`. What the poll lacked to prove
    /// itself, when it is a load balancer's check (HAProxy's names no client) and the first of
    /// its address with that lack: for the log, once.
    pub fn record(&self, poll: Poll<'_>, now: Instant) -> Option<Proof> {
        let address = poll.address.to_canonical();
        // Read before the lock: a malformed header never takes a good one's place.
        let well_formed = poll.state.map(lb_state::well_formed);
        let mut table = self.lock();
        let index = table.entry(address, poll.proof, poll.key_line, now)?;
        let poller = &mut table.pollers[index];
        let check = poll.via == Via::Agent || poll.client.is_none();
        let lacks = matches!(
            poll.proof,
            Proof::NoKey | Proof::WrongKey | Proof::Elsewhere
        );
        let first = (check && lacks && poller.warned != Some(poll.proof)).then(|| {
            poller.warned = Some(poll.proof);
            poll.proof
        });
        let gap = now.saturating_duration_since(poller.last);
        poller.steady = if poller.polls == 0 || gap <= MAX_GAP {
            poller.steady.saturating_add(1)
        } else {
            1
        };
        poller.last = poller.last.max(now);
        poller.polls = poller.polls.saturating_add(1);
        poller.proof = poll.proof;
        if poll.via == Via::Http {
            poller.client = poll.client.and_then(ClientName::of);
        }
        // A check without the header leaves the last one in place: an operator's curl may
        // come from the load balancer's host. One that names no client is the load
        // balancer's own, which stopped sending it: what it sent before is no longer its view.
        if let (Some(header), Some(well_formed)) = (poll.state, well_formed) {
            poller.note_state(header, well_formed, &poll, now);
        } else if poll.via == Via::Http && poll.client.is_none() {
            poller.headerless = Some(now);
        }
        // An agent check that names a line is noted on the lines of that name (it names no
        // HAProxy `node`), when they are known.
        if let (Via::Agent, Some(name)) = (poll.via, poll.line) {
            let lines = poller.lines.iter_mut().flatten();
            for line in lines.filter(|l| l.well_formed && l.name() == name) {
                line.agent = Some(Told::next(line.agent, poll.verdict, now));
            }
        }
        let told = match poll.via {
            Via::Http => &mut poller.http,
            Via::Agent => &mut poller.agent,
        };
        *told = Some(Told::next(*told, poll.verdict, now));
        first
    }

    /// How many pollers were heard from in the last [`GONE_AFTER`].
    pub fn count(&self, now: Instant) -> usize {
        (self.lock().pollers.iter())
            .filter(|p| now.saturating_duration_since(p.last) < GONE_AFTER)
            .count()
    }

    /// The pollers heard from in the last [`GONE_AFTER`], the first to poll first.
    pub fn list(&self, now: Instant) -> Vec<Poller> {
        let mut list: Vec<Poller> = (self.lock().pollers.iter())
            .filter(|p| now.saturating_duration_since(p.last) < GONE_AFTER)
            .copied()
            .collect();
        list.sort_by_key(|p| p.first);
        list
    }

    /// Polls no entry could hold, if there were any.
    pub fn unrecorded(&self, now: Instant) -> Option<UnrecordedAnswer> {
        self.lock()
            .unrecorded
            .map(|(polls, last)| UnrecordedAnswer {
                polls,
                last_ms_ago: ms(now.saturating_duration_since(last)),
            })
    }
}

/// Of `lines`, what the most careful says: a held one first, then one not answered DRAINED.
fn careful<'a, I: Iterator<Item = &'a ServerLine>>(
    held: impl Fn(&ServerLine) -> Option<Held>,
    lines: impl Fn() -> I,
) -> Option<Followed> {
    let line = (lines().find(|l| held(l).is_some()))
        .or_else(|| lines().find(|l| l.told != Verdict::Drained))
        .or_else(|| lines().next())?;
    let held = held(line);
    Some(Followed {
        // Held lately and DRAINED since: followed as the held check it was.
        told: match (held, line.told) {
            (Some(_), Verdict::Drained) => Verdict::Ok,
            (_, told) => told,
        },
        held,
        placed: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::lb_state::LbState;
    use crate::protocol::PollerAnswer;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    fn record(pollers: &Pollers, address: IpAddr, via: Via, verdict: Verdict, now: Instant) {
        let poll = Poll {
            address,
            via,
            verdict,
            state: None,
            held: None,
            line: None,
            client: None,
            proof: Proof::Key,
            key_line: Some(1),
        };
        pollers.record(poll, now);
    }

    #[test]
    fn counts_each_kind_in_a_row_and_restarts_on_a_new_verdict() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        for i in 0..3 {
            record(&pollers, ip(5), Via::Http, Verdict::Ok, at(i));
        }
        record(&pollers, ip(5), Via::Agent, Verdict::Drained, at(3));
        record(&pollers, ip(5), Via::Http, Verdict::Drained, at(4));
        let list = pollers.list(at(5));
        assert_eq!(list.len(), 1);
        let p = list[0];
        assert_eq!((p.polls, p.steady), (5, 5));
        assert_eq!(p.first, t0);
        assert_eq!(p.last, at(4));
        let http = p.http.unwrap();
        assert_eq!(
            (http.verdict, http.times, http.since),
            (Verdict::Drained, 1, at(4))
        );
        let agent = p.agent.unwrap();
        assert_eq!((agent.verdict, agent.times), (Verdict::Drained, 1));
        record(&pollers, ip(5), Via::Http, Verdict::Drained, at(6));
        let http = pollers.list(t0)[0].http.unwrap();
        assert_eq!((http.times, http.since), (2, at(4)));
    }

    #[test]
    fn agent_checks_silent_for_three_of_their_intervals_while_http_goes_on_have_stopped() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        for s in 0..=4 {
            record(&pollers, ip(5), Via::Http, Verdict::Ok, at(s));
            record(&pollers, ip(5), Via::Agent, Verdict::Ok, at(s));
        }
        let stopped = |now| pollers.answer(now)[0].agent_stopped_ms_ago;
        assert_eq!(stopped(at(9)), None, "five seconds: the least silence");
        assert_eq!(
            stopped(at(10)),
            None,
            "both silent: the poller is, not its agent"
        );
        assert!(!pollers.answer(at(10))[0].polling);
        for s in 5..=10 {
            record(&pollers, ip(5), Via::Http, Verdict::Ok, at(s));
        }
        assert_eq!(stopped(at(10)), Some(6_000));
        assert!(pollers.answer(at(10))[0].polling);
        record(&pollers, ip(5), Via::Agent, Verdict::Drained, at(11));
        assert_eq!(stopped(at(11)), None, "back");
    }

    #[test]
    fn ipv4_mapped_addresses_are_the_same_poller() {
        let pollers = Pollers::default();
        let now = Instant::now();
        record(&pollers, ip(7), Via::Http, Verdict::Ok, now);
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 7).to_ipv6_mapped());
        record(&pollers, mapped, Via::Http, Verdict::Ok, now);
        let list = pollers.list(now);
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].http.unwrap().times, 2);
    }

    #[test]
    fn regular_after_three_polls_in_a_row_and_not_after_a_long_gap() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        record(&pollers, ip(1), Via::Http, Verdict::Ok, at(0));
        record(&pollers, ip(1), Via::Agent, Verdict::Ok, at(2));
        assert!(!pollers.list(at(2))[0].regular(at(2)));
        record(&pollers, ip(1), Via::Http, Verdict::Ok, at(4));
        assert!(pollers.list(at(4))[0].regular(at(4)));
        assert!(
            !pollers.list(at(70))[0].regular(at(70)),
            "silent for a minute"
        );
        record(&pollers, ip(1), Via::Http, Verdict::Ok, at(70));
        let p = pollers.list(at(70))[0];
        assert_eq!(p.steady, 1, "the rhythm starts again");
        assert!(!p.regular(at(70)));
    }

    #[test]
    fn a_flood_of_addresses_never_pushes_out_a_regular_poller_nor_grows_the_table() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        // The load balancer polls every second, then a flood of other addresses comes and goes.
        for s in 0..3 {
            record(
                &pollers,
                ip(1),
                Via::Http,
                Verdict::Ok,
                t0 + Duration::from_secs(s),
            );
        }
        for i in 0..(8 * CAPACITY as u64) {
            let now = t0 + Duration::from_millis(3000 + 10 * i);
            if i % 100 == 0 {
                record(&pollers, ip(1), Via::Agent, Verdict::Ok, now);
            }
            let flood = IpAddr::V4(Ipv4Addr::from(0x0a01_0000 + i as u32));
            record(&pollers, flood, Via::Agent, Verdict::Drained, now);
            let table = pollers.lock();
            assert!(table.pollers.len() <= CAPACITY);
            assert_eq!(table.pollers.capacity(), CAPACITY, "the table reallocated");
        }
        let now = t0 + Duration::from_secs(9);
        let list = pollers.list(now);
        assert_eq!(list.len(), CAPACITY);
        let lb = list.iter().find(|p| p.address == ip(1)).expect("the LB");
        assert_eq!(lb.first, t0, "the load balancer was never forgotten");
        assert!(lb.regular(now));
        assert_eq!(list.iter().filter(|p| p.regular(now)).count(), 1);
        assert_eq!(pollers.unrecorded(now), None);
    }

    #[test]
    fn when_every_place_is_regular_a_new_address_is_counted_as_unrecorded() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        for round in 0..3 {
            for i in 0..CAPACITY {
                let now = t0 + Duration::from_secs(round);
                record(
                    &pollers,
                    IpAddr::V4(Ipv4Addr::from(0x0a02_0000 + i as u32)),
                    Via::Http,
                    Verdict::Ok,
                    now,
                );
            }
        }
        let now = t0 + Duration::from_secs(3);
        record(&pollers, ip(9), Via::Http, Verdict::Ok, now);
        assert!(pollers.list(now).iter().all(|p| p.address != ip(9)));
        assert_eq!(
            pollers.unrecorded(now + Duration::from_secs(1)),
            Some(UnrecordedAnswer {
                polls: 1,
                last_ms_ago: 1000
            })
        );
        // A minute of silence and they are no longer protected: the newcomer gets a place.
        let later = now + MAX_GAP + Duration::from_secs(1);
        record(&pollers, ip(9), Via::Http, Verdict::Ok, later);
        assert!(pollers.list(later).iter().any(|p| p.address == ip(9)));
    }

    #[test]
    fn the_latest_state_header_of_each_server_line_is_kept_and_read_for_the_operator() {
        let pollers = Pollers::default();
        let now = Instant::now();
        let at = |ms: u64| now + Duration::from_millis(ms);
        fn poll(state: Option<&[u8]>) -> Poll<'_> {
            Poll {
                address: ip(3),
                via: Via::Http,
                verdict: Verdict::Drained,
                state,
                held: None,
                line: None,
                client: None,
                proof: Proof::Key,
                key_line: Some(1),
            }
        }
        let m1 = b"NOLB; name=bk/m1; node=lb1; weight=100/100; scur=2/5; qcur=0";
        pollers.record(poll(Some(m1)), now);
        let answer = pollers.answer(now);
        let seen = answer[0].states[0].seen.as_ref().expect("read");
        assert_eq!((seen.server.as_str(), seen.scur), ("m1", 2));
        // The same node in a second backend of that load balancer: kept beside the first.
        let ca = b"UP; name=ca/m1; node=lb1; weight=1/1; scur=0/0; qcur=0";
        pollers.record(poll(Some(ca)), at(100));
        let m1_later = b"NOLB; name=bk/m1; node=lb1; weight=100/100; scur=0/5; qcur=0";
        pollers.record(poll(Some(m1_later)), at(200));
        let answer = pollers.answer(at(200));
        let seen: Vec<(String, u32, u64)> = answer[0]
            .states
            .iter()
            .map(|s| {
                let lb = s.seen.as_ref().unwrap();
                (
                    format!("{}/{}", lb.backend, lb.server),
                    lb.scur,
                    s.last_ms_ago,
                )
            })
            .collect();
        assert_eq!(seen, [("bk/m1".into(), 0, 0), ("ca/m1".into(), 0, 100)]);
        // Each server line keeps since when it has been answered the same, in a row: the
        // header of bk/m1's second DRAINED check shows HAProxy after the first.
        let m1 = &answer[0].states[0];
        assert_eq!((m1.told, m1.since_ms_ago), (Verdict::Drained, 200));
        let ok = Poll {
            verdict: Verdict::Ok,
            ..poll(Some(m1_later))
        };
        pollers.record(ok, at(250));
        let m1 = &pollers.answer(at(250))[0].states[0];
        assert_eq!(
            (m1.told, m1.since_ms_ago, m1.last_ms_ago),
            (Verdict::Ok, 0, 0)
        );
        // Past STATES server lines the oldest goes.
        for i in 0..STATES as u64 {
            let other = format!("UP; name=b{i}/m1; weight=1/1; scur=0/0; qcur=0");
            pollers.record(poll(Some(other.as_bytes())), at(300 + i));
        }
        assert_eq!(
            pollers.list(at(400))[0].lines.iter().flatten().count(),
            STATES
        );
        assert!(
            pollers.answer(at(400))[0]
                .states
                .iter()
                .all(|s| s.last_ms_ago <= 100)
        );
        // A malformed header never takes a good one's place, not even its server line's...
        let before = pollers.answer(at(400));
        pollers.record(poll(Some(&[b'x'; 600])), at(500));
        let lying = b"UP; name=b0/m1; weight=1/1; scur=0/0"; // no qcur
        pollers.record(poll(Some(lying)), at(510));
        let states = |answer: &[PollerAnswer]| -> Vec<Option<LbState>> {
            answer[0].states.iter().map(|s| s.seen.clone()).collect()
        };
        assert_eq!(states(&pollers.answer(at(510))), states(&before));
        // ...and is kept as such where there is room.
        let fresh = Pollers::default();
        fresh.record(poll(Some(&[b'x'; 600])), at(500));
        let answer = fresh.answer(at(500));
        let bad = answer[0]
            .states
            .iter()
            .find(|s| s.seen.is_none())
            .expect("kept");
        assert_eq!(bad.malformed.as_deref(), Some("longer than 384 bytes"));
        // An agent check carries no header, nor does an operator's curl from the load
        // balancer's host: neither removes one. The header's age says how stale it is.
        pollers.record(
            Poll {
                via: Via::Agent,
                ..poll(None)
            },
            at(600),
        );
        let curl = Poll {
            client: Some(b"curl/8.1.2"),
            ..poll(None)
        };
        pollers.record(curl, at(700));
        assert_eq!(pollers.answer(at(700))[0].states.len(), STATES);
        assert_eq!(pollers.answer(at(700))[0].states_stopped_ms_ago, None);
        // The load balancer's own check without one: another backend of it may send no state,
        // so that alone stops no server line...
        pollers.record(poll(None), at(800));
        let answer = pollers.answer(at(900));
        assert_eq!(answer[0].states.len(), STATES, "{answer:?}");
        // ...but once the lines fall silent too, its `http-check send-state` is gone, and the
        // headers before are no longer its view.
        let answer = pollers.answer(at(6000));
        assert!(answer[0].states.is_empty(), "{answer:?}");
        // Stopped since the newest line's header (the last of the STATES above).
        let newest = 300 + STATES as u64 - 1;
        assert_eq!(
            answer[0].states_stopped_ms_ago,
            Some(6000 - newest),
            "{answer:?}"
        );
        // Sent again: that server line is its view again.
        pollers.record(poll(Some(m1_later)), at(6100));
        let answer = pollers.answer(at(6100));
        assert_eq!(answer[0].states.len(), 1, "{answer:?}");
        assert_eq!(
            answer[0].states_stopped_ms_ago,
            Some(6100 - newest),
            "the other lines stay stopped"
        );
    }

    #[test]
    fn an_unproven_poll_never_changes_what_a_proven_one_said_from_the_same_address() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let up = b"UP; name=bk/m1; node=lb1; weight=100/200; scur=2/5; qcur=0";
        let forged = b"NOLB; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0";
        let poll = |state: &'static [u8], proof| Poll {
            address: ip(3),
            via: Via::Http,
            verdict: Verdict::Drained,
            state: Some(state),
            held: None,
            line: None,
            client: None,
            proof,
            key_line: proof.proven().then_some(1),
        };
        for i in 0..3 {
            pollers.record(poll(up, Proof::Key), at(i * 2000));
            pollers.record(poll(forged, Proof::NoKey), at(i * 2000 + 100));
            pollers.record(poll(forged, Proof::WrongKey), at(i * 2000 + 200));
        }
        let answer = pollers.answer(at(4300));
        assert_eq!(answer.len(), 2, "{answer:?}");
        let proven = answer.iter().find(|p| p.proof == Proof::Key).unwrap();
        let seen = proven.states[0].seen.as_ref().unwrap();
        assert_eq!((seen.scur, seen.total_weight), (2, 200));
        assert_eq!((proven.polls, proven.http.unwrap().times), (3, 3));
        let other = answer.iter().find(|p| p.proof != Proof::Key).unwrap();
        assert_eq!((other.proof, other.polls), (Proof::WrongKey, 6));
    }

    /// An HTTP check of `line` (this node, `bk/m1` or `other/m1`) with `header`, from 10.0.0.1
    /// with key line `key` (`None`: unproven), answered `verdict`, held or not.
    fn check(
        pollers: &Pollers,
        key: Option<usize>,
        header: &'static str,
        verdict: Verdict,
        held: Option<Held>,
        now: Instant,
    ) {
        let poll = Poll {
            address: ip(1),
            via: Via::Http,
            verdict,
            state: Some(header.as_bytes()),
            held,
            line: None,
            client: None,
            proof: if key.is_some() {
                Proof::Key
            } else {
                Proof::NoKey
            },
            key_line: key,
        };
        pollers.record(poll, now);
    }

    /// The audit at 4743d29: two HAProxy at one address shared one view. With a key each they
    /// are two pollers, each with its own lines; with one key and a `node` each, two lines.
    #[test]
    fn two_load_balancers_at_one_address_are_two_views_by_key_or_node() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let alone = "UP; name=bk/m1; node=lb; weight=100/100; scur=0/0; qcur=0";
        let beside = "UP; name=bk/m1; node=lb; weight=100/200; scur=0/0; qcur=0";
        for i in 0..4 {
            let held = Some(Held::LastServer);
            check(&pollers, Some(1), alone, Verdict::Ok, held, at(i * 2000));
            check(
                &pollers,
                Some(3),
                beside,
                Verdict::Drained,
                None,
                at(i * 2000 + 900),
            );
            // Key 1's agent check is heard on its held line.
            let poll = Poll {
                address: ip(1),
                via: Via::Agent,
                verdict: Verdict::Ok,
                state: None,
                held: None,
                line: Some(b"bk/m1"),
                client: None,
                proof: Proof::Key,
                key_line: Some(1),
            };
            pollers.record(poll, at(i * 2000 + 100));
        }
        let answer = pollers.answer(at(7000));
        assert_eq!(answer.len(), 2, "{answer:?}");
        for (key, total) in [(1, 100), (3, 200)] {
            let p = answer.iter().find(|p| p.key_line == Some(key)).unwrap();
            let [state] = &p.states[..] else {
                panic!("{p:?}")
            };
            assert_eq!(state.seen.as_ref().unwrap().total_weight, total);
            assert_ne!(state.holds, Some(Held::TwoViews), "{state:?}");
        }
        // Their agent checks name the same line: each follows its own load balancer's.
        let follows =
            |key| pollers.followed(ip(1), Some(Some(key)), Some(b"bk/m1"), true, at(7000));
        assert_eq!(follows(1).unwrap().held, Some(Held::LastServer));
        assert_eq!(follows(3).unwrap().told, Verdict::Drained);

        // One key, a `node` each: two lines of one poller, and an agent check (which names no
        // node) follows the more careful.
        let pollers = Pollers::default();
        let lb1 = "UP; name=bk/m1; node=lb1; weight=100/100; scur=0/0; qcur=0";
        let lb2 = "UP; name=bk/m1; node=lb2; weight=100/200; scur=0/0; qcur=0";
        for i in 0..4 {
            check(
                &pollers,
                Some(1),
                lb1,
                Verdict::Ok,
                Some(Held::LastServer),
                at(i * 2000),
            );
            check(
                &pollers,
                Some(1),
                lb2,
                Verdict::Drained,
                None,
                at(i * 2000 + 900),
            );
        }
        let answer = pollers.answer(at(7000));
        assert_eq!((answer.len(), answer[0].states.len()), (1, 2), "{answer:?}");
        assert!(
            answer[0]
                .states
                .iter()
                .all(|s| s.holds != Some(Held::TwoViews))
        );
        let followed = pollers.followed(ip(1), Some(Some(1)), Some(b"bk/m1"), true, at(7000));
        assert_eq!(followed.unwrap().held, Some(Held::LastServer));
    }

    /// One key and one node, two HAProxy: the line's headers flip between two views of the
    /// backend at every check. The line then holds whatever its header says; one HAProxy whose
    /// backend changes once (a server going down) does not.
    #[test]
    fn headers_that_flip_between_two_views_hold_the_line() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let alone = "UP; name=bk/m1; node=lb; weight=100/100; scur=0/0; qcur=0";
        let beside = "UP; name=bk/m1; node=lb; weight=100/200; scur=3/4; qcur=0";
        let beside_busier = "UP; name=bk/m1; node=lb; weight=100/200; scur=9/12; qcur=0";
        let holds = |now| {
            let answer = pollers.answer(now);
            answer[0].states[0].holds
        };
        check(&pollers, Some(1), beside, Verdict::Drained, None, at(0));
        check(
            &pollers,
            Some(1),
            beside_busier,
            Verdict::Drained,
            None,
            at(1000),
        );
        check(&pollers, Some(1), alone, Verdict::Ok, None, at(2000));
        check(&pollers, Some(1), alone, Verdict::Ok, None, at(3000));
        assert_eq!(
            holds(at(3000)),
            Some(Held::LastServer),
            "one change is a server leaving"
        );
        check(&pollers, Some(1), beside, Verdict::Drained, None, at(4000));
        assert_eq!(holds(at(4000)), None);
        check(&pollers, Some(1), alone, Verdict::Ok, None, at(4500));
        check(&pollers, Some(1), beside, Verdict::Drained, None, at(5000));
        assert_eq!(holds(at(5000)), Some(Held::TwoViews), "A, B, A: two views");
        check(
            &pollers,
            Some(1),
            beside,
            Verdict::Drained,
            None,
            at(60_000),
        );
        assert_eq!(holds(at(60_000)), Some(Held::TwoViews), "remembered");
        let facts = pollers.line_facts(ip(1), Some(1), beside.as_bytes(), at(60_000));
        let lb = lb_state::parse(beside.as_bytes()).unwrap();
        assert_eq!(
            crate::responder::server_line::held_at(
                facts.as_ref(),
                &lb,
                at(60_000),
                None,
                std::time::SystemTime::now()
            ),
            Some(Held::TwoViews)
        );
        assert_eq!(
            holds(at(5000) + crate::responder::server_line::TWO_VIEWS_FOR),
            None,
            "forgotten once they agreed for as long as a poller is remembered"
        );
    }

    /// One HAProxy, an operator undraining this node and draining it again as fast as the
    /// checks go (A, B, A: CI's Debian 13 run of test_load_balancer_state held that drain as
    /// two views on HAProxy 3.0, 3.2 and 3.4): not two views. Back and forth once more is.
    #[test]
    fn one_load_balancer_undrained_and_drained_again_at_once_is_one_view() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let out = "NOLB; name=bk/m1; node=lb; weight=100/0; scur=0/0; qcur=0";
        let back = "UP; name=bk/m1; node=lb; weight=100/100; scur=0/0; qcur=0";
        let holds = |now| pollers.answer(now)[0].states[0].holds;
        check(&pollers, Some(1), out, Verdict::Ok, None, at(0));
        check(&pollers, Some(1), out, Verdict::Ok, None, at(2000));
        check(&pollers, Some(1), back, Verdict::Drained, None, at(4000));
        check(&pollers, Some(1), out, Verdict::Drained, None, at(6000));
        check(&pollers, Some(1), out, Verdict::Drained, None, at(8000));
        assert_ne!(holds(at(8000)), Some(Held::TwoViews));
        check(&pollers, Some(1), back, Verdict::Ok, None, at(10_000));
        check(&pollers, Some(1), out, Verdict::Ok, None, at(12_000));
        check(&pollers, Some(1), back, Verdict::Ok, None, at(14_000));
        assert_eq!(holds(at(14_000)), Some(Held::TwoViews), "A, B, A, B");
    }

    /// One key, one node, two HAProxy: the one whose backend has only this node comes back
    /// while a drain is in force. Until their headers have flipped back and forth, its check is
    /// held and the other's, right after, is answered DRAINED: an agent check following the
    /// latest alone would say `drain` to it. A check held lately is followed as held (a drain
    /// that may be held only).
    #[test]
    fn an_agent_check_follows_a_check_held_lately_as_held() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let alone = "UP; name=bk/m1; node=lb; weight=100/100; scur=0/0; qcur=0";
        let beside = "UP; name=bk/m1; node=lb; weight=100/200; scur=3/4; qcur=0";
        check(&pollers, Some(1), beside, Verdict::Drained, None, at(0));
        check(&pollers, Some(1), beside, Verdict::Drained, None, at(2000));
        let held = Some(Held::LastServer);
        check(&pollers, Some(1), alone, Verdict::Ok, held, at(2500));
        check(&pollers, Some(1), beside, Verdict::Drained, None, at(3000));
        let follows = |holdable, now| {
            (pollers.followed(ip(1), Some(Some(1)), Some(b"bk/m1"), holdable, now)).unwrap()
        };
        let lately = follows(true, at(3100));
        assert_eq!((lately.told, lately.held), (Verdict::Ok, held));
        assert_eq!(
            follows(false, at(3100)).told,
            Verdict::Drained,
            "a forced drain"
        );
        check(&pollers, Some(1), beside, Verdict::Drained, None, at(9000));
        assert_eq!(
            follows(true, at(9000)).told,
            Verdict::Drained,
            "no longer lately"
        );
    }

    /// The other masters' agent weights move with their load, so one HAProxy's header of a
    /// line changes the backend's total from check to check: not two views, as long as whether
    /// this node is the last server stays the same.
    #[test]
    fn weights_that_move_with_load_are_one_view() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        let beside = "UP; name=bk/m1; node=lb; weight=100/200; scur=3/4; qcur=0";
        let lighter = "UP; name=bk/m1; node=lb; weight=100/180; scur=3/4; qcur=0";
        for i in 0..8 {
            let header = if i % 2 == 0 { beside } else { lighter };
            let now = t0 + Duration::from_millis(i * 500);
            check(&pollers, Some(1), header, Verdict::Drained, None, now);
        }
        let answer = pollers.answer(t0 + Duration::from_secs(4));
        assert_eq!(answer[0].states[0].holds, None, "{answer:?}");
    }

    /// The audit: an agent check that sent no `agent-send` (no key), and one whose
    /// `agent-send` was copied from another backend's line, were told `drain` while the HTTP
    /// check's drain was held: the backend emptied. Neither follows anything but the most
    /// careful line now.
    #[test]
    fn an_agent_check_that_cannot_be_placed_follows_a_held_line_at_its_address() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let last = "UP; name=bk/m1; node=lb; weight=100/100; scur=0/0; qcur=0";
        let other = "UP; name=other/m1; node=lb; weight=100/200; scur=0/0; qcur=0";
        let agent = |line: &'static [u8], now| {
            let poll = Poll {
                address: ip(1),
                via: Via::Agent,
                verdict: Verdict::Drained,
                state: None,
                held: None,
                line: Some(line),
                client: None,
                proof: Proof::Key,
                key_line: Some(1),
            };
            pollers.record(poll, now);
        };
        for i in 0..3 {
            check(
                &pollers,
                Some(1),
                last,
                Verdict::Ok,
                Some(Held::LastServer),
                at(i * 2000),
            );
            check(
                &pollers,
                Some(1),
                other,
                Verdict::Drained,
                None,
                at(i * 2000 + 500),
            );
            // Both backends' agent checks name other/m1: bk's was copied.
            agent(b"other/m1", at(i * 2000 + 600));
            agent(b"other/m1", at(i * 2000 + 700));
        }
        let now = at(5000);
        let held = Some(Held::LastServer);
        assert_eq!(
            pollers
                .followed(ip(1), Some(Some(1)), Some(b"other/m1"), true, now)
                .unwrap()
                .held,
            held
        );
        assert_eq!(
            pollers
                .followed(ip(1), Some(Some(1)), None, true, now)
                .unwrap()
                .held,
            held
        );
        assert_eq!(
            pollers
                .followed(ip(1), Some(Some(1)), Some(b"gone/m1"), true, now)
                .unwrap()
                .held,
            held
        );
        assert_eq!(
            pollers.followed(ip(1), None, None, true, now).unwrap().held,
            held,
            "unproven"
        );
        assert_eq!(
            pollers
                .followed(ip(1), Some(Some(2)), None, true, now)
                .unwrap()
                .held,
            held,
            "another key"
        );
        assert_eq!(
            pollers.followed(ip(2), None, None, true, now),
            None,
            "another address"
        );
        // bk's agent check is heard naming its own line: other's agent follows its own.
        agent(b"bk/m1", at(5100));
        let followed = pollers.followed(ip(1), Some(Some(1)), Some(b"other/m1"), true, at(5200));
        assert_eq!(followed.unwrap().told, Verdict::Drained);
    }

    /// Two HAProxy at one address with a key each; the second's `agent-send` carries the
    /// first's key (copied), so the agent check of its held line is heard by the first's view.
    #[test]
    fn an_agent_check_with_another_load_balancers_key_never_drains_a_line_held_beside_it() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let spare = "UP; name=bk/m1; node=lb; weight=100/200; scur=0/0; qcur=0";
        let last = "UP; name=bk/m1; node=lb; weight=100/100; scur=0/0; qcur=0";
        for i in 0..3 {
            check(
                &pollers,
                Some(1),
                spare,
                Verdict::Drained,
                None,
                at(i * 2000),
            );
            let held = Some(Held::LastServer);
            check(
                &pollers,
                Some(3),
                last,
                Verdict::Ok,
                held,
                at(i * 2000 + 500),
            );
            let poll = Poll {
                address: ip(1),
                via: Via::Agent,
                verdict: Verdict::Drained,
                state: None,
                held: None,
                line: Some(b"bk/m1"),
                client: None,
                proof: Proof::Key,
                key_line: Some(1),
            };
            pollers.record(poll, at(i * 2000 + 600));
        }
        // Key 1's agent check names its own line, not held; key 3's held line hears no agent
        // check of its own: one of key 1's may be key 3's HAProxy.
        let followed = pollers.followed(ip(1), Some(Some(1)), Some(b"bk/m1"), true, at(5000));
        assert_eq!(followed.unwrap().held, Some(Held::LastServer));
        let alone = pollers.followed(ip(2), Some(Some(1)), Some(b"bk/m1"), true, at(5000));
        assert_eq!(alone, None, "another address");
    }

    #[test]
    fn a_flood_of_unproven_pollers_never_leaves_a_proven_poll_unrecorded() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        let poll = |address, proof| Poll {
            address,
            via: Via::Http,
            verdict: Verdict::Ok,
            state: None,
            held: None,
            line: None,
            client: None,
            proof,
            key_line: proof.proven().then_some(1),
        };
        // The table full of regular unproven pollers.
        for round in 0..3 {
            for i in 0..CAPACITY as u32 {
                let address = IpAddr::V4(Ipv4Addr::from(0x0a03_0000 + i));
                pollers.record(
                    poll(address, Proof::Unlisted),
                    t0 + Duration::from_secs(round),
                );
            }
        }
        let now = t0 + Duration::from_secs(3);
        // Another unproven one finds no place and is not counted as a load balancer's.
        pollers.record(poll(ip(8), Proof::Unlisted), now);
        assert_eq!(pollers.unrecorded(now), None);
        assert!(pollers.list(now).iter().all(|p| p.address != ip(8)));
        // A proven one takes a place.
        pollers.record(poll(ip(9), Proof::Key), now);
        let list = pollers.list(now);
        assert_eq!(list.len(), CAPACITY);
        assert!(
            list.iter()
                .any(|p| p.address == ip(9) && p.proof == Proof::Key)
        );
        assert_eq!(pollers.unrecorded(now), None);
    }

    #[test]
    fn silent_pollers_are_gone_after_ten_minutes() {
        let pollers = Pollers::default();
        let t0 = Instant::now();
        record(&pollers, ip(1), Via::Agent, Verdict::Ok, t0);
        record(
            &pollers,
            ip(2),
            Via::Agent,
            Verdict::Ok,
            t0 + Duration::from_secs(60),
        );
        let later = t0 + GONE_AFTER + Duration::from_secs(1);
        let list = pollers.list(later);
        assert_eq!(list.iter().map(|p| p.address).collect::<Vec<_>>(), [ip(2)]);
        let answer = pollers.answer(later);
        assert_eq!(
            answer[0].last_ms_ago,
            (GONE_AFTER.as_millis() - 59_000) as u64
        );
        // A new poller takes the place of the gone one.
        record(&pollers, ip(3), Via::Http, Verdict::Ok, later);
        assert_eq!(pollers.lock().pollers.len(), 2);
    }

    #[test]
    fn a_client_is_named_by_its_user_agent_product_without_allocating() {
        assert_eq!(
            ClientName::of(b"curl/8.1.2").map(|c| c.as_str().to_owned()),
            Some("curl".into())
        );
        assert_eq!(
            ClientName::of(b"pmcheck/0.1.0 (status)").map(|c| c.as_str().to_owned()),
            Some("pmcheck".into())
        );
        assert_eq!(
            ClientName::of(b"Mozilla-with-a-very-long-name/5.0").map(|c| c.as_str().to_owned()),
            Some("Mozilla-with-a-".into()),
            "at most 15 bytes"
        );
        assert_eq!(ClientName::of(b""), None);
        assert_eq!(ClientName::of(b"/1.0"), None);
        let pollers = Pollers::default();
        let now = Instant::now();
        let poll = |client: Option<&'static [u8]>| Poll {
            address: ip(9),
            via: Via::Http,
            verdict: Verdict::Ok,
            state: None,
            held: None,
            line: None,
            client,
            proof: Proof::Key,
            key_line: Some(1),
        };
        pollers.record(poll(Some(b"curl/8.1.2")), now);
        assert_eq!(pollers.answer(now)[0].client.as_deref(), Some("curl"));
        pollers.record(poll(None), now);
        assert_eq!(
            pollers.answer(now)[0].client,
            None,
            "the latest poll decides"
        );
    }
}
