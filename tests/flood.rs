//! A connection flood, sized to run in seconds: pmcheck under a descriptor limit of 256 (so
//! a few hundred hostile sockets would exhaust it), attacked from 127.0.0.1 by idle,
//! byte-a-second and never-reading pipelining clients that reconnect as they are closed, while
//! a load balancer polls from 127.0.0.2. `benches/flood.rs` is the 5,000-connection version.

mod common;

use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::flood::{self, Attack};
use common::*;

#[test]
fn a_flood_from_one_address_never_starves_a_load_balancer() {
    flood::raise_fd_limit();
    let s = Setup::new(Behavior::Running);
    let mut limited = Command::new("sh");
    limited
        .args(["-c", "ulimit -n 256 && exec \"$0\" \"$@\""])
        .arg(bin())
        .env_clear()
        .env("RUST_LOG", "info");
    let d = Daemon::start_with(
        limited,
        &s.args(&["--interval", "100ms", "--timeout", "1s"]),
    );
    d.wait_for(Duration::from_secs(10), "OK", |a| a.status == 200);

    let lb: IpAddr = "127.0.0.2".parse().unwrap();
    let until = Instant::now() + Duration::from_secs(4);
    let attack = Attack {
        target: d.addr,
        source: "127.0.0.1".parse().unwrap(),
        idle: 150,
        slowloris: 50,
        pipeline: 50,
    };
    let attacking = attack.spawn(until);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (polls, (rss, fds)) = runtime.block_on(async {
        tokio::join!(
            flood::poll_like_haproxy(
                d.addr,
                lb,
                Duration::from_millis(20),
                Duration::from_secs(2),
                until
            ),
            flood::sample_process(d.pid(), until),
        )
    });
    let counts = attacking.join().expect("the attack");
    let connected = counts.connected.load(std::sync::atomic::Ordering::Relaxed);
    let shed = counts
        .closed_by_server
        .load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "{} polls, {} lost, p50 {:?}, p99 {:?}, max {:?}; {connected} hostile connections, \
         {shed} closed by pmcheck; pmcheck at most {rss} KiB and {fds} descriptors",
        polls.latencies.len(),
        polls.lost,
        polls.quantile(0.5),
        polls.quantile(0.99),
        polls.quantile(1.0)
    );
    assert_eq!(
        polls.lost, 0,
        "every poll of the load balancer was answered"
    );
    assert!(connected > 250, "the attack ran: {connected} connections");
    assert!(shed > 0, "pmcheck closed hostile connections to make room");
    assert_eq!(
        polls.lost, 0,
        "every poll of the load balancer was answered"
    );
    assert!(polls.latencies.len() > 20, "the poller kept polling");
    assert!(
        polls.statuses.iter().all(|&s| s == 200),
        "{:?}",
        polls.statuses
    );
    assert!(fds <= 256, "within the descriptor limit: {fds}");
    assert!(rss < 64 * 1024, "{rss} KiB resident");
    assert!(
        d.logged("connection limit reached") <= 2,
        "said a few times, not thousands: {}",
        d.logged("connection limit reached")
    );
    // Shed sockets close a moment after the connections replacing them are accepted, so at
    // 3,000 connections a second under 256 descriptors `accept` may briefly run out: it
    // retries within a millisecond, and says so once per 10 s.
    assert!(
        d.logged("accept failed") <= 1,
        "{:?}",
        d.log.lock().unwrap()
    );
}
