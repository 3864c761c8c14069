//! What one poll costs inside pmcheck: the latest drain state and probe report (both kept by
//! background tasks), the verdict and the rendered answer (text, JSON, agent-check line), and
//! what a Prometheus scrape costs. Run with `cargo bench --bench poll`.
//!
//! Polls over the network (accept, parse, write) are measured by `scripts/bench` with wrk.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::PermissionsExt as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::Request;
use pmcheck::drain::file::DrainFile;
use pmcheck::drain::holders::Holder;
use pmcheck::drain::record::{DrainRecord, DrainState};
use pmcheck::health::answer::Answer;
use pmcheck::health::decision::Rules;
use pmcheck::health::verdict::Verdict;
use pmcheck::health::weight::Rejoin;
use pmcheck::puppet::pool::{Load, Pool};
use pmcheck::puppet::report::{ProbeOutcome, ProbeReport};
use pmcheck::responder::agent::Sent;
use pmcheck::responder::http::Rendered;
use pmcheck::responder::node::{Feeds, Node};
use pmcheck::settings::lb_proof::LbProof;
use tokio::sync::watch;

/// The load balancer polling: not loopback, so every answer is the one HAProxy gets.
const LB: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5));
/// Its key.
const KEY: &str = "7f3c2a9e4b1d8f60c5a7e2d94b3f1a6c";

type Senders = (
    watch::Sender<Option<Arc<ProbeReport>>>,
    watch::Sender<Arc<DrainState>>,
    watch::Sender<Rejoin>,
);

/// A daemon's view with a fresh, healthy probe report; keep the senders alive while polling.
fn health(proof: LbProof) -> (Node, Senders) {
    // A warm pool of four, one compile running: what a compile master reports most of the day.
    let pool = Pool {
        size: 4,
        free: 3,
        borrowed: 1,
        waiting: 0,
        average_free: 3.2,
        average_wait_ms: 1,
        average_borrow_ms: 4200,
        queue_limit_hits: 0,
        borrow_timeouts: 0,
        borrows: 0,
        lock: "not-in-use".into(),
        lock_since: None,
        multithreaded: false,
    };
    let report = ProbeReport::with_pool(
        ProbeOutcome::Healthy(Some(Load::Warm)),
        Some(pool),
        Duration::from_millis(12),
        Some("https://puppet01.example.com:8140/status/v1/services/jruby-metrics".into()),
    );
    let (publish, latest) = watch::channel(Some(Arc::new(report)));
    let (publish_drain, drain) = watch::channel(Arc::new(DrainState::NotDrained));
    let (publish_rejoin, rejoin) = watch::channel(Rejoin::Steady);
    let health = Node::new(
        Feeds {
            drain,
            latest,
            rejoin,
        },
        Rules {
            stale_after: Duration::from_secs(3600),
            drained_status: 503,
            slow_start: Duration::from_secs(60),
            agent_check: true,
        },
        proof,
        &DrainFile::new(std::path::Path::new("/var/lib/pmcheck")),
        None,
        true,
    );
    (health, (publish, publish_drain, publish_rejoin))
}

/// The verdict a poll gets, read back through the public answer type, so that a bench never
/// times an answer other than the one it names.
fn verdict_of(health: &Node) -> Verdict {
    use http_body_util::BodyExt;
    let request = Request::get("/")
        .header("accept", "application/json")
        .body(())
        .expect("request");
    let body = health
        .answer(&request, LB, &mut Rendered::default())
        .into_body();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let bytes = match rt.block_on(body.collect()) {
        Ok(collected) => collected.to_bytes(),
        Err(never) => match never {},
    };
    let text = String::from_utf8_lossy(&bytes);
    Answer::from_json(&text).expect("a JSON answer").verdict
}

/// One agent check as the listener makes it: what HAProxy sent (its server line and key), the
/// line, then noting it.
fn agent_check(health: &Node, sent: &Sent) -> String {
    let (line, told) = health.agent_line(LB, sent);
    health.agent_told(told);
    line
}

/// Each poll on a connection of its own, as HAProxy's checks come.
fn measure(name: &str, health: &Node, request: &Request<()>) {
    time(name, || {
        black_box(health.answer(black_box(request), LB, &mut Rendered::default()));
    });
}

/// Every poll on one kept-alive connection, as a monitor's or `wrk`'s come.
fn measure_kept_alive(name: &str, health: &Node, request: &Request<()>) {
    let mut last = Rendered::default();
    time(name, || {
        black_box(health.answer(black_box(request), LB, &mut last));
    });
}

fn time(name: &str, poll: impl FnMut()) {
    time_rounds(name, 100_000, poll);
}

fn time_rounds(name: &str, per_round: u32, mut poll: impl FnMut()) {
    const ROUNDS: u32 = 5;
    let mut best = Duration::MAX;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        for _ in 0..per_round {
            poll();
        }
        best = best.min(started.elapsed() / per_round);
    }
    println!(
        "{name:<40} {:>8.0} ns/poll (best of {ROUNDS} x {per_round})",
        best.as_nanos() as f64
    );
}

fn main() {
    let dir = tempfile::tempdir().expect("temporary directory");
    // The load balancer proves itself with a key, as the packaged configuration does.
    let key_file = dir.path().join("lb-key");
    std::fs::write(&key_file, format!("{KEY}\n")).expect("key file");
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).expect("mode");
    let proof = LbProof::load(Some(&key_file), Vec::new()).expect("key file");
    let (health, senders) = health(proof);
    let options = Request::options("/").body(()).expect("request");
    let haproxy = Request::options("/")
        .header("x-pmcheck-key", KEY)
        .header(
            "x-haproxy-server-state",
            "UP; name=puppet/m1; node=lb1; weight=100/200; scur=3/7; qcur=0",
        )
        .body(())
        .expect("request");
    let json = Request::get("/")
        .header("accept", "application/json")
        .body(())
        .expect("request");
    assert_eq!(verdict_of(&health), Verdict::Ok);
    measure("OK, text (HAProxy's OPTIONS /)", &health, &options);
    measure_kept_alive("OK, text, kept alive", &health, &options);
    measure("OK, text, HAProxy's state and key", &health, &haproxy);
    measure("OK, JSON", &health, &json);
    // Prometheus's scrape: not a poll, but it must stay cheap and never wait for Puppet Server.
    let scrape = Request::get("/metrics").body(()).expect("request");
    time_rounds("Prometheus scrape (classic text)", 10_000, || {
        black_box(health.answer(black_box(&scrape), LB, &mut Rendered::default()));
    });
    let sent = Sent::of(format!("puppet/m1 {KEY}\n").as_bytes());
    assert!(
        health
            .agent_line(LB, &sent)
            .0
            .starts_with("up ready 75% #OK - ")
    );
    time("OK, agent-check line", || {
        black_box(agent_check(&health, &sent));
    });
    // Back from a restart: the weight is the lower of pool and ramp.
    senders
        .2
        .send_replace(Rejoin::Since(Instant::now() - Duration::from_secs(3)));
    assert!(
        health
            .agent_line(LB, &sent)
            .0
            .starts_with("up ready 14% #OK - ")
    );
    time("OK ramping, agent-check line", || {
        black_box(agent_check(&health, &sent));
    });
    let file = DrainFile::new(dir.path());
    let now = std::time::SystemTime::now();
    file.write(&DrainRecord::held_by(vec![Holder::drain("upgrade".into(), None, now)]).unwrap())
        .expect("drain");
    senders.1.send_replace(Arc::new(file.state(now)));
    assert_eq!(verdict_of(&health), Verdict::Drained);
    measure("DRAINED, text", &health, &options);
    measure_kept_alive("DRAINED, text, kept alive", &health, &options);
    // The drain rule's path: the check's header read, its server line looked up, the holders
    // weighed (this drain is unchecked: it takes effect).
    measure("DRAINED, text, HAProxy's state and key", &health, &haproxy);
    assert!(
        health
            .agent_line(LB, &sent)
            .0
            .starts_with("up drain #DRAINED")
    );
    time("DRAINED, agent-check line", || {
        black_box(agent_check(&health, &sent));
    });
    // What `pmcheck drain` writes: checked by the guard, so each check's header is read to
    // see whether this line holds it (it does not: the other servers take agents).
    let mut checked = Holder::drain("upgrade".into(), None, now);
    checked.checked = true;
    let record = DrainRecord::held_by(vec![checked]).expect("one holder");
    file.write(&record).expect("drain");
    senders.1.send_replace(Arc::new(file.state(now)));
    assert_eq!(verdict_of(&health), Verdict::Drained);
    measure("DRAINED (checked), text, state and key", &health, &haproxy);
}
