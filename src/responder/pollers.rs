//! Who polls this node, and what each was told: the load balancers `pmcheck drain --wait`
//! waits for.
//!
//! A poller is an address (HAProxy checks from one address, on a new port each time), with
//! what its HTTP checks and its agent checks were last told and how many times in a row: a
//! load balancer acts on a drain after `fall` failed HTTP checks, or at once on one agent
//! `drain`. The table has a fixed size and recording a poll allocates nothing: a flood from
//! many addresses pushes out the one silent longest, never a load balancer polling every
//! couple of seconds.

use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::health::answer::{PollerAnswer, ToldAnswer};
use crate::health::verdict::Verdict;

/// Most pollers remembered: a few load balancers, monitoring and an operator's curl fit.
pub const CAPACITY: usize = 32;
/// A poller silent this long is gone: it is no longer listed, and its place is free.
pub const GONE_AFTER: Duration = Duration::from_secs(600);

/// How a poll came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// An HTTP check (`option httpchk`, curl).
    Http,
    /// HAProxy's agent check.
    Agent,
}

/// What one kind of check was told last, and how many times in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Told {
    /// The verdict of the latest answer.
    pub verdict: Verdict,
    /// How many answers in a row carried it.
    pub times: u32,
    /// When the latest answer was given.
    pub last: Instant,
}

/// One address that polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Poller {
    /// Where the polls come from (IPv4-mapped addresses as IPv4).
    pub address: IpAddr,
    /// The first poll remembered.
    pub first: Instant,
    /// The latest poll of either kind.
    pub last: Instant,
    /// How many polls since `first`, of either kind (saturating).
    pub polls: u32,
    /// Its HTTP checks, if it makes any.
    pub http: Option<Told>,
    /// Its agent checks, if it makes any.
    pub agent: Option<Told>,
}

/// The table of pollers; every poll records itself here.
#[derive(Debug)]
pub struct Pollers {
    table: Mutex<Vec<Poller>>,
}

impl Default for Pollers {
    fn default() -> Self {
        Self::new()
    }
}

impl Pollers {
    /// An empty table, allocated once.
    pub fn new() -> Self {
        Self {
            table: Mutex::new(Vec::with_capacity(CAPACITY)),
        }
    }

    /// Notes that `address` was just told `verdict`.
    pub fn record(&self, address: IpAddr, via: Via, verdict: Verdict, now: Instant) {
        let address = address.to_canonical();
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let index = match table.iter().position(|p| p.address == address) {
            Some(index) => index,
            None => {
                table.retain(|p| now.saturating_duration_since(p.last) < GONE_AFTER);
                if table.len() >= CAPACITY
                    && let Some(oldest) = (0..table.len()).min_by_key(|&i| table[i].last)
                {
                    table.swap_remove(oldest);
                }
                table.push(Poller {
                    address,
                    first: now,
                    last: now,
                    polls: 0,
                    http: None,
                    agent: None,
                });
                table.len() - 1
            }
        };
        let poller = &mut table[index];
        poller.last = poller.last.max(now);
        poller.polls = poller.polls.saturating_add(1);
        let told = match via {
            Via::Http => &mut poller.http,
            Via::Agent => &mut poller.agent,
        };
        *told = Some(match *told {
            Some(t) if t.verdict == verdict => Told {
                times: t.times.saturating_add(1),
                last: now,
                ..t
            },
            _ => Told {
                verdict,
                times: 1,
                last: now,
            },
        });
    }

    /// How many pollers were heard from in the last [`GONE_AFTER`].
    pub fn count(&self, now: Instant) -> usize {
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        table
            .iter()
            .filter(|p| now.saturating_duration_since(p.last) < GONE_AFTER)
            .count()
    }

    /// The pollers heard from in the last [`GONE_AFTER`], the first to poll first.
    pub fn list(&self, now: Instant) -> Vec<Poller> {
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let mut list: Vec<Poller> = table
            .iter()
            .filter(|p| now.saturating_duration_since(p.last) < GONE_AFTER)
            .copied()
            .collect();
        list.sort_by_key(|p| p.first);
        list
    }

    /// The list as the operator's JSON carries it.
    pub fn answer(&self, now: Instant) -> Vec<PollerAnswer> {
        let ago = |t: Instant| now.saturating_duration_since(t).as_millis() as u64;
        let told = |t: Option<Told>| {
            t.map(|t| ToldAnswer {
                told: t.verdict,
                times: t.times,
                last_ms_ago: ago(t.last),
            })
        };
        self.list(now)
            .into_iter()
            .map(|p| PollerAnswer {
                address: p.address,
                first_ms_ago: ago(p.first),
                last_ms_ago: ago(p.last),
                polls: p.polls,
                http: told(p.http),
                agent: told(p.agent),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn counts_each_kind_in_a_row_and_restarts_on_a_new_verdict() {
        let pollers = Pollers::new();
        let t0 = Instant::now();
        for i in 0..3 {
            pollers.record(ip(5), Via::Http, Verdict::Ok, t0 + Duration::from_secs(i));
        }
        pollers.record(
            ip(5),
            Via::Agent,
            Verdict::Drained,
            t0 + Duration::from_secs(3),
        );
        pollers.record(
            ip(5),
            Via::Http,
            Verdict::Drained,
            t0 + Duration::from_secs(4),
        );
        let list = pollers.list(t0 + Duration::from_secs(5));
        assert_eq!(list.len(), 1);
        let p = list[0];
        assert_eq!(p.polls, 5);
        assert_eq!(p.first, t0);
        assert_eq!(p.last, t0 + Duration::from_secs(4));
        let http = p.http.unwrap();
        assert_eq!((http.verdict, http.times), (Verdict::Drained, 1));
        let agent = p.agent.unwrap();
        assert_eq!((agent.verdict, agent.times), (Verdict::Drained, 1));
        pollers.record(
            ip(5),
            Via::Http,
            Verdict::Drained,
            t0 + Duration::from_secs(6),
        );
        assert_eq!(pollers.list(t0).first().unwrap().http.unwrap().times, 2);
    }

    #[test]
    fn ipv4_mapped_addresses_are_the_same_poller() {
        let pollers = Pollers::new();
        let now = Instant::now();
        pollers.record(ip(7), Via::Http, Verdict::Ok, now);
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 7).to_ipv6_mapped());
        pollers.record(mapped, Via::Http, Verdict::Ok, now);
        let list = pollers.list(now);
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].http.unwrap().times, 2);
    }

    #[test]
    fn a_full_table_forgets_the_one_silent_longest_and_never_grows() {
        let pollers = Pollers::new();
        let t0 = Instant::now();
        // The load balancer polls all along; a flood of other addresses comes and goes.
        for i in 0..(4 * CAPACITY as u64) {
            let now = t0 + Duration::from_millis(10 * i);
            if i % 8 == 0 {
                pollers.record(ip(1), Via::Http, Verdict::Ok, now);
            }
            let flood = IpAddr::V4(Ipv4Addr::from(0x0a01_0000 + i as u32));
            pollers.record(flood, Via::Http, Verdict::Ok, now);
            let table = pollers.table.lock().unwrap();
            assert!(table.len() <= CAPACITY);
            assert_eq!(table.capacity(), CAPACITY, "the table reallocated");
        }
        let list = pollers.list(t0 + Duration::from_secs(10));
        assert_eq!(list.len(), CAPACITY);
        let lb = list.iter().find(|p| p.address == ip(1)).expect("the LB");
        assert_eq!(lb.first, t0, "the load balancer was never forgotten");
    }

    #[test]
    fn silent_pollers_are_gone_after_ten_minutes() {
        let pollers = Pollers::new();
        let t0 = Instant::now();
        pollers.record(ip(1), Via::Agent, Verdict::Ok, t0);
        pollers.record(ip(2), Via::Agent, Verdict::Ok, t0 + Duration::from_secs(60));
        let later = t0 + GONE_AFTER + Duration::from_secs(1);
        let list = pollers.list(later);
        assert_eq!(list.iter().map(|p| p.address).collect::<Vec<_>>(), [ip(2)]);
        let answer = pollers.answer(later);
        assert_eq!(
            answer[0].last_ms_ago,
            (GONE_AFTER.as_millis() - 59_000) as u64
        );
        // A new poller takes the place of the gone one.
        pollers.record(ip(3), Via::Http, Verdict::Ok, later);
        assert_eq!(pollers.table.lock().unwrap().len(), 2);
    }
}
