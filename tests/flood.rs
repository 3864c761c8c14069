//! A connection flood, sized to run in seconds: pmcheck under a descriptor limit of 256 (so
//! a few hundred hostile sockets would exhaust it), attacked from 127.0.0.1 by idle,
//! byte-a-second and never-reading pipelining clients that reconnect as they are closed, while
//! a load balancer polls from 127.0.0.2. `benches/flood.rs` is the 5,000-connection version.

mod common;

use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::flood::{self, Attack, Until};
use common::*;

/// How long a measuring poller waits for an answer before it counts the check lost; one that
/// pmcheck closes unanswered is lost at once. HAProxy's `timeout check` is 2 s, which most
/// answers meet (the median is asserted below it), but on a machine at load 12 (2 cores) a debug
/// build under these floods answers some checks later than that, for want of CPU, not because
/// it shed them (the `poll from ... lost` lines say which).
const LOST_AFTER: Duration = Duration::from_secs(5);

/// HAProxy's `timeout check`: the median answer meets it, on a loaded machine too.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// `pmcheck serve --interval 100ms --timeout 5s ARGS` under a descriptor limit of `fds`,
/// answering OK; this process may open as many descriptors as its hard limit allows.
fn limited_daemon(s: &Setup, fds: u32, args: &[&str]) -> Daemon {
    flood::raise_fd_limit();
    let mut limited = Command::new("sh");
    limited
        .args(["-c", &format!("ulimit -n {fds} && exec \"$0\" \"$@\"")])
        .arg(bin())
        .env_clear()
        .envs(no_puppet_env())
        .env("RUST_LOG", "info");
    // A timeout that a loaded machine's probe of the stub makes: the floods are the test.
    let mut all = vec!["--interval", "100ms", "--timeout", "5s"];
    all.extend_from_slice(args);
    let d = Daemon::start_with(limited, &s.args(&all));
    d.wait_for(Duration::from_secs(10), "OK", |a| a.status == 200);
    d
}

#[test]
fn a_flood_from_one_address_never_starves_a_load_balancer() {
    let s = Setup::new(Behavior::Running);
    let d = limited_daemon(&s, 256, &[]);

    let lb: IpAddr = "127.0.0.2".parse().unwrap();
    let until = Until::new(Duration::from_secs(4), Duration::from_secs(60), 1);
    let started = Instant::now();
    let attack = Attack {
        idle: 150,
        slowloris: 50,
        pipeline: 50,
        ..Attack::from(d.addr, "127.0.0.1".parse().unwrap())
    };
    let attacking = attack.spawn(until.clone());
    let (addr, measuring) = (d.addr, until.clone());
    let polls = flood::measure(async move {
        let every = (Duration::from_millis(20), LOST_AFTER);
        flood::poll_like_haproxy(addr, lb, every, &measuring, Some(100)).await
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (rss, fds) = runtime.block_on(flood::sample_process(d.pid(), &until));
    let polls = polls.join().expect("the poller");
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
    assert!(polls.latencies.len() >= 100, "the poller kept polling");
    assert!(
        polls.quantile(0.5) < CHECK_TIMEOUT,
        "p50 {:?}",
        polls.quantile(0.5)
    );
    assert!(
        polls.statuses.iter().all(|&s| s == 200),
        "{:?}",
        polls.statuses
    );
    assert!(fds <= 256, "within the descriptor limit: {fds}");
    assert!(rss < 64 * 1024, "{rss} KiB resident");
    // Each of the two kinds of shedding is said at most once every 10 s.
    let windows = usize::try_from(started.elapsed().as_secs() / 10 + 1).unwrap_or(usize::MAX);
    assert!(
        d.logged("connection limit reached") <= 2 * windows,
        "said a few times, not thousands: {}",
        d.logged("connection limit reached")
    );
    // Shed sockets close a moment after the connections replacing them are accepted, so at
    // 3,000 connections a second under 256 descriptors `accept` may briefly run out: it
    // retries within a millisecond, and says so once per 10 s.
    assert!(
        d.logged("accept failed in the last 10s") <= windows,
        "{:?}",
        d.log.lock().unwrap()
    );
}

/// A hostile flood spread over 2,000 addresses, one connection each, on the HTTP port and the
/// agent port at once: shedding by address count would pick among equals (or the monitor, which
/// holds two). A monitor with two kept-alive connections (unproven, opened and asked on before
/// the flood, as a monitor's are) and a proven load balancer's single-shot polls lose nothing:
/// the flood's connections never ask, never read, or write garbage, which no load balancer
/// does. An unproven newcomer opened during the flood's first burst may be shed before its
/// request is read, like the flood's own: nothing tells them apart yet. (c8a278e passes this
/// one too: its losses came from a polite spread, the next test but one.) Lost means closed
/// under it, or not answered within 5 s.
#[test]
fn a_flood_spread_over_many_addresses_never_sheds_a_monitor_or_a_load_balancer() {
    let s = Setup::new(Behavior::Running);
    let (d, runtime) = keyed_daemon(
        &s,
        &["--agent-listen", "127.0.0.1:0", "--max-connections", "400"],
    );
    prove(&d, &runtime, "127.0.0.2".parse().unwrap());
    let monitor = runtime
        .block_on(flood::Monitor::open(
            d.addr,
            "127.0.0.4".parse().unwrap(),
            2,
            Duration::from_secs(2),
        ))
        .expect("the monitor's two connections, before the flood");
    let until = Until::new(Duration::from_secs(5), Duration::from_secs(60), 2);
    let attack = Attack {
        sources: 2000,
        agent: Some(d.agent_addr()),
        idle: 1200,
        slowloris: 600,
        pipeline: 20,
        garbage: 180,
        // 2,000 connections at most 2,000 times a second: enough to keep the table full.
        pause: Duration::from_millis(1000),
        ..Attack::from(d.addr, "127.1.0.1".parse().unwrap())
    };
    let attacking = attack.spawn(until.clone());
    let (addr, measuring) = (d.addr, until.clone());
    let (monitor, lb) = flood::measure(async move {
        let every = (Duration::from_millis(50), LOST_AFTER);
        tokio::join!(
            monitor.poll(every.0, every.1, &measuring, Some(20)),
            flood::poll_with_key(
                addr,
                "127.0.0.2".parse().unwrap(),
                common::lb::LB_KEY,
                every,
                &measuring,
                Some(10)
            ),
        )
    })
    .join()
    .expect("the pollers");
    let counts = attacking.join().expect("the attack");
    let connected = counts.connected.load(std::sync::atomic::Ordering::Relaxed);
    let shed = counts
        .closed_by_server
        .load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "monitor: {} asked, {} lost, p99 {:?}; load balancer: {} polls, {} lost, p99 {:?}; \
         {connected} hostile connections, {shed} closed by pmcheck",
        monitor.latencies.len(),
        monitor.lost,
        monitor.quantile(0.99),
        lb.latencies.len(),
        lb.lost,
        lb.quantile(0.99),
    );
    assert!(connected > 2000, "the attack ran: {connected} connections");
    assert!(shed > 0, "pmcheck closed hostile connections to make room");
    // How fast is the flood bench's business (`cargo bench --bench flood`, phase `spread`): a
    // debug build under this flood on two cores answers in hundreds of milliseconds, and a new
    // connection waits behind the flood's in the kernel's accept queue.
    assert!(monitor.latencies.len() >= 20 && lb.latencies.len() >= 10);
    assert_eq!(
        monitor.lost, 0,
        "the monitor's kept-alive requests were all answered"
    );
    assert_eq!(lb.lost, 0, "every poll of the load balancer was answered");
    assert!(
        monitor
            .statuses
            .iter()
            .chain(&lb.statuses)
            .all(|&s| s == 200),
        "{:?} {:?}",
        monitor.statuses,
        lb.statuses
    );
}

/// [`limited_daemon`] under 1,024 descriptors with the kit's load balancers' key, and a
/// runtime of two workers for the clients.
fn keyed_daemon(s: &Setup, args: &[&str]) -> (Daemon, tokio::runtime::Runtime) {
    let key = common::lb::lb_key_file();
    let mut all = vec!["--lb-key-file", key.to_str().unwrap()];
    all.extend_from_slice(args);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    (limited_daemon(s, 1024, &all), runtime)
}

/// The load balancer at `lb` proves itself with its key, as HAProxy has long before a flood.
fn prove(d: &Daemon, runtime: &tokio::runtime::Runtime, lb: IpAddr) {
    let until = Until::new(Duration::ZERO, Duration::from_secs(10), 1);
    let every = (Duration::from_millis(10), Duration::from_secs(2));
    let first = runtime.block_on(flood::poll_with_key(
        d.addr,
        lb,
        common::lb::LB_KEY,
        every,
        &until,
        Some(5),
    ));
    assert_eq!(first.lost, 0);
    let status = request(
        d.addr,
        "GET /status HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
    );
    let status: serde_json::Value = serde_json::from_str(&status.body).unwrap();
    assert!(
        (status["pollers"].as_array().unwrap().iter())
            .any(|p| p["address"] == lb.to_string() && p["proof"] == "key"),
        "{status}"
    );
}

/// The c8a278e audit: a polite flood (many addresses, each keeping seven connections alive and
/// asking every few seconds, as monitors do) filled the table, and every check of a load
/// balancer, even one proven by its key and regular before, was closed between its accept and
/// its request: with `fall 3` every master would go DOWN at once. Room is kept for proven load
/// balancers, and their connections are never closed for anyone else's.
#[test]
fn a_polite_flood_never_takes_a_proven_load_balancers_checks() {
    let s = Setup::new(Behavior::Running);
    let (d, runtime) = keyed_daemon(&s, &["--max-connections", "200"]);
    let lb: IpAddr = "127.0.0.2".parse().unwrap();
    prove(&d, &runtime, lb);

    // 40 addresses x 7 connections (280 > 200), every one asking every second, with
    // newcomers from light addresses that poll like HAProxy without a key.
    let until = Until::new(Duration::from_secs(5), Duration::from_secs(60), 1);
    let (addr, measuring) = (d.addr, until.clone());
    let polls = flood::measure(async move {
        let every = (Duration::from_millis(20), LOST_AFTER);
        flood::poll_with_key(addr, lb, common::lb::LB_KEY, every, &measuring, Some(100)).await
    });
    let (flooded, churn) = runtime.block_on(async {
        tokio::join!(
            flood::polite_flood(
                d.addr,
                "127.3.0.1".parse().unwrap(),
                40,
                7,
                Duration::from_secs(1),
                &until
            ),
            flood::poll_like_haproxy(
                d.addr,
                "127.4.0.1".parse().unwrap(),
                (Duration::from_millis(5), Duration::from_secs(2)),
                &until,
                None
            ),
        )
    });
    let polls = polls.join().expect("the poller");
    eprintln!(
        "proven load balancer: {} checks, {} lost, p99 {:?}; polite flood: {} asked, {} lost; \
         unproven churn: {} polls, {} lost",
        polls.latencies.len(),
        polls.lost,
        polls.quantile(0.99),
        flooded.latencies.len(),
        flooded.lost,
        churn.latencies.len(),
        churn.lost,
    );
    assert!(
        flooded.latencies.len() > 500,
        "the flood asked: {}",
        flooded.latencies.len()
    );
    assert!(
        flooded.lost > 0,
        "the flood filled the table: nothing of it was closed"
    );
    every_check_answered(&polls);
}

/// The audit's spread flood: 2,000 addresses, each keeping one connection alive and asking
/// every second (the table holds 400), and a proven load balancer that opens a new connection
/// per check, as HAProxy does. On c8a278e a check waiting for its request was shed before any
/// connection that had asked, so each newcomer of the flood could close it. Here the load
/// balancer has room kept for it, and a newcomer never displaces a connection that asked.
#[test]
fn a_polite_flood_over_2000_addresses_never_sheds_a_proven_load_balancers_checks() {
    let s = Setup::new(Behavior::Running);
    let (d, runtime) = keyed_daemon(&s, &["--max-connections", "400"]);
    let lb: IpAddr = "127.0.0.2".parse().unwrap();
    prove(&d, &runtime, lb);
    let until = Until::new(Duration::from_secs(5), Duration::from_secs(60), 1);
    let (addr, measuring) = (d.addr, until.clone());
    let polls = flood::measure(async move {
        let every = (Duration::from_millis(20), LOST_AFTER);
        flood::poll_with_key(addr, lb, common::lb::LB_KEY, every, &measuring, Some(50)).await
    });
    let first = "127.5.0.1".parse().unwrap();
    let every = Duration::from_secs(1);
    let flooded = runtime.block_on(flood::polite_flood(d.addr, first, 2000, 1, every, &until));
    let polls = polls.join().expect("the poller");
    eprintln!(
        "proven load balancer: {} checks, {} lost, p99 {:?}; spread flood: {} asked, {} lost",
        polls.latencies.len(),
        polls.lost,
        polls.quantile(0.99),
        flooded.latencies.len(),
        flooded.lost,
    );
    assert!(
        flooded.lost > 1000,
        "the flood overfilled the table: {} of its requests were refused",
        flooded.lost
    );
    every_check_answered(&polls);
}

/// The audit at 4743d29: restarted under a polite spread flood (512 addresses x 2 kept-alive
/// askers), the daemon knew no proven address, so the keyed load balancer's first checks met a
/// table full of connections that had asked, and lost every check for 30 s in 2 of 5 runs. A
/// host the key file binds has its room from the daemon's first second: five restarts, the
/// flood there before the load balancer's first check each time, and no check lost.
#[test]
fn a_daemon_restarted_under_a_flood_keeps_every_check_of_a_load_balancer_its_key_file_binds() {
    let s = Setup::new(Behavior::Running);
    let lb: IpAddr = "127.0.0.2".parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("lb-key");
    std::fs::write(&key, format!("{} {lb}\n", common::lb::LB_KEY)).unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
    let args = [
        "--lb-key-file",
        key.to_str().unwrap(),
        "--max-connections",
        "400",
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for run in 1..=5 {
        let d = limited_daemon(&s, 1024, &args);
        let until = Until::new(Duration::from_secs(5), Duration::from_secs(60), 1);
        let (addr, measuring) = (d.addr, until.clone());
        let polls = flood::measure(async move {
            // HAProxy checks every 2 s: its first check after a restart comes once the
            // flood's clients, reconnecting at once, hold the table.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let every = (Duration::from_millis(20), LOST_AFTER);
            flood::poll_with_key(addr, lb, common::lb::LB_KEY, every, &measuring, Some(50)).await
        });
        let first = "127.6.0.1".parse().unwrap();
        let every = Duration::from_secs(1);
        let flooded = runtime.block_on(flood::polite_flood(d.addr, first, 512, 2, every, &until));
        let polls = polls.join().expect("the poller");
        eprintln!(
            "run {run}: proven load balancer: {} checks, {} lost, p99 {:?}; flood: {} asked, \
             {} lost",
            polls.latencies.len(),
            polls.lost,
            polls.quantile(0.99),
            flooded.latencies.len(),
            flooded.lost,
        );
        assert!(
            flooded.lost > 0,
            "run {run}: the flood overfilled the table: none of its requests was refused"
        );
        every_check_answered(&polls);
        drop(d);
    }
}

/// The proven load balancer kept checking, and every check was answered 200, most within
/// HAProxy's timeout.
fn every_check_answered(polls: &flood::Polls) {
    assert!(
        polls.quantile(0.5) < CHECK_TIMEOUT,
        "p50 {:?}",
        polls.quantile(0.5)
    );
    assert!(
        polls.latencies.len() >= 50,
        "the load balancer kept checking"
    );
    assert_eq!(
        polls.lost, 0,
        "every check of the proven load balancer was answered"
    );
    assert!(
        polls.statuses.iter().all(|&s| s == 200),
        "{:?}",
        polls.statuses
    );
}
