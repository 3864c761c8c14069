//! What one poll costs inside pmcheck: the drain `stat`, the latest probe report, the verdict and
//! the rendered answer (text and JSON). Run with `cargo bench --bench poll`.
//!
//! Polls over the network (accept, parse, write) are measured by `scripts/bench` with wrk.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::Request;
use pmcheck::drain::{DrainFile, DrainRecord};
use pmcheck::probe::ProbeReport;
use pmcheck::responder::Health;
use tokio::sync::watch;

/// A daemon's view with a fresh, healthy probe report; keep the sender alive while polling.
fn health(state: &std::path::Path) -> (Health, watch::Sender<Option<Arc<ProbeReport>>>) {
    let report = ProbeReport {
        ok: true,
        inconclusive: false,
        detail: "running".into(),
        latency: Duration::from_millis(12),
        finished: Instant::now(),
        endpoint: "https://puppet01.example.com:8140/status/v1/simple/server".into(),
    };
    let (publish, latest) = watch::channel(Some(Arc::new(report)));
    let health = Health {
        drain: DrainFile::new(state),
        latest,
        stale_after: Duration::from_secs(3600),
    };
    (health, publish)
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
    let (health, _publish) = health(dir.path());
    let options = Request::options("/").body(()).expect("request");
    let json = Request::get("/")
        .header("accept", "application/json")
        .body(())
        .expect("request");
    measure("OK, text (HAProxy's OPTIONS /)", &health, &options);
    measure("OK, JSON", &health, &json);
    DrainFile::new(dir.path())
        .write(&DrainRecord::new(
            "upgrade".into(),
            None,
            std::time::SystemTime::now(),
        ))
        .expect("drain");
    measure("DRAINED, text (drain record read)", &health, &options);
}
