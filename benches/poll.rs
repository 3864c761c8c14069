//! What one poll costs inside pmcheck: the latest drain state and probe report (both kept by
//! background tasks), the verdict and the rendered answer (text and JSON). Run with
//! `cargo bench --bench poll`.
//!
//! Polls over the network (accept, parse, write) are measured by `scripts/bench` with wrk.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::Request;
use pmcheck::health::drain::{DrainFile, DrainRecord, DrainState};
use pmcheck::puppet::probe::ProbeReport;
use pmcheck::responder::http::Health;
use tokio::sync::watch;

type Senders = (
    watch::Sender<Option<Arc<ProbeReport>>>,
    watch::Sender<Arc<DrainState>>,
);

/// A daemon's view with a fresh, healthy probe report; keep the senders alive while polling.
fn health() -> (Health, Senders) {
    let report = ProbeReport {
        ok: true,
        inconclusive: false,
        detail: "running".into(),
        latency: Duration::from_millis(12),
        finished: Instant::now(),
        endpoint: "https://puppet01.example.com:8140/status/v1/simple/server".into(),
    };
    let (publish, latest) = watch::channel(Some(Arc::new(report)));
    let (publish_drain, drain) = watch::channel(Arc::new(DrainState::NotDrained));
    let health = Health {
        drain,
        latest,
        stale_after: Duration::from_secs(3600),
    };
    (health, (publish, publish_drain))
}

fn measure(name: &str, health: &Health, request: &Request<()>) {
    const ROUNDS: u32 = 5;
    const PER_ROUND: u32 = 100_000;
    let mut best = Duration::MAX;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        for _ in 0..PER_ROUND {
            black_box(health.answer(black_box(request)));
        }
        best = best.min(started.elapsed() / PER_ROUND);
    }
    println!(
        "{name:<40} {:>8.0} ns/poll (best of {ROUNDS} x {PER_ROUND})",
        best.as_nanos() as f64
    );
}

fn main() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (health, senders) = health();
    let options = Request::options("/").body(()).expect("request");
    let json = Request::get("/")
        .header("accept", "application/json")
        .body(())
        .expect("request");
    measure("OK, text (HAProxy's OPTIONS /)", &health, &options);
    measure("OK, JSON", &health, &json);
    let file = DrainFile::new(dir.path());
    let now = std::time::SystemTime::now();
    file.write(&DrainRecord::new("upgrade".into(), None, now))
        .expect("drain");
    senders.1.send_replace(Arc::new(file.state(now)));
    measure("DRAINED, text", &health, &options);
}
