//! `GET /metrics`: what pmcheck knows, for Prometheus.
//!
//! Open source Puppet Server has no Prometheus endpoint, and pmcheck reads its JRuby pool on
//! every probe anyway, so the last probe's pool is re-exported here beside pmcheck's own series.
//! A scrape decides the verdict exactly as a poll does, from the latest state, and never causes
//! a probe. Every label comes from a fixed list in this file: no peer addresses, no reasons.
//!
//! Prometheus asks for OpenMetrics and gets it. Anyone else (curl, `promtool check metrics`)
//! gets the classic text format 0.0.4; both are written by `responder/exposition.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::drain::audit::EventCounts;
use crate::drain::record::DrainState;
use crate::health::decision::Decision;
use crate::health::verdict::Verdict;
use crate::puppet::code::{Deployment, Found, Record};
use crate::puppet::expiry::Expiries;
use crate::puppet::pool::Pool;
use crate::puppet::probe_error::ProbeError;
use crate::puppet::readings::Readings;
use crate::puppet::report::{ProbeOutcome, ProbeReport};
use crate::responder::exposition::{Exposition, Histogram, Kind};
use crate::responder::pollers::Via;

/// The `Content-Type` of an OpenMetrics scrape.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The `Content-Type` of the classic text format.
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Probe durations, in seconds: from a warm local Puppet Server (milliseconds) to the longest
/// `--timeout` an operator would set.
const PROBE_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The `cause` labels of `pmcheck_probe_failures_total`, each exported from the start.
const CAUSES: [&str; 9] = [
    "refused",
    "connect",
    "tls",
    "timeout",
    "http_status",
    "not_running",
    "unreadable",
    "exchange",
    "cannot_probe",
];

/// Why `outcome` is a failure (its label in [`CAUSES`]), if it is one. A Puppet Server that
/// answers "not ready" (starting, pool locked) is not a failure: the verdict says NOTREADY.
fn cause(outcome: &ProbeOutcome) -> Option<&'static str> {
    Some(match outcome {
        ProbeOutcome::Healthy(_) | ProbeOutcome::NotReady(_) => return None,
        // No probe could be made: this host's certificate, key, CA or settings.
        ProbeOutcome::CannotTell(_) => "cannot_probe",
        ProbeOutcome::Unhealthy(e) => match e {
            ProbeError::Refused { .. } => "refused",
            ProbeError::Connect { .. } => "connect",
            ProbeError::Tls { .. } => "tls",
            ProbeError::Timeout { .. } => "timeout",
            ProbeError::Status { .. } => "http_status",
            ProbeError::NotRunning(_) => "not_running",
            ProbeError::Unreadable { .. } => "unreadable",
            // The HTTP exchange broke after connecting.
            ProbeError::Http { .. } => "exchange",
        },
    })
}

/// The daemon's counters: polls and probes, counted as they happen.
#[derive(Debug)]
pub struct Metrics {
    /// Polls answered, by how they came and by verdict: `[via][verdict]`.
    polls: [[AtomicU64; Verdict::ALL.len()]; 2],
    /// Failed probes, by cause.
    failures: [AtomicU64; CAUSES.len()],
    /// How long each probe that reached the network took.
    probe_seconds: Histogram,
    /// Drain events read from the event log, by action (counted by the log's reader).
    pub drain_events: Arc<EventCounts>,
}

impl Default for Metrics {
    /// Every counter at zero.
    fn default() -> Self {
        Self {
            polls: Default::default(),
            failures: Default::default(),
            probe_seconds: Histogram::new(&PROBE_BUCKETS),
            drain_events: Arc::default(),
        }
    }
}

impl Metrics {
    /// Counts one poll: one relaxed atomic add, on the hot path.
    pub fn polled(&self, via: Via, verdict: Verdict) {
        self.polls[via as usize][verdict as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one probe: its duration when it reached the network, its cause when it failed.
    pub fn probed(&self, report: &ProbeReport) {
        if report.endpoint.is_some() {
            self.probe_seconds.observe(report.latency.as_secs_f64());
        }
        let failed = cause(&report.outcome).and_then(|c| CAUSES.iter().position(|l| *l == c));
        if let Some(i) = failed {
            self.failures[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The scrape's body: OpenMetrics, or the classic text format. `decision` is the one a
    /// poll would get now, decided at the scrape; `pollers` were heard from recently.
    pub fn render(
        &self,
        decision: &Decision<'_>,
        pollers: usize,
        readings: &Readings,
        openmetrics: bool,
    ) -> String {
        let mut out = Exposition::new(openmetrics, 8 * 1024);
        out.family("pmcheck_build", "pmcheck's version", Kind::Info, None);
        out.sample("_info", &[("version", env!("CARGO_PKG_VERSION"))], 1u8);
        out.family(
            "pmcheck_drain_events",
            "Drain events (drain, undrain, expire, cycle steps, refused drains) the daemon read from the state directory's event log since it started",
            Kind::Counter,
            None,
        );
        for (action, n) in self.drain_events.each() {
            out.sample("_total", &[("action", action.as_str())], n);
        }
        encode_decision(&mut out, decision);
        out.histogram(
            "pmcheck_probe_duration",
            "How long each probe of Puppet Server's status API took",
            Some("seconds"),
            &self.probe_seconds,
        );
        out.family(
            "pmcheck_probe_failures",
            "Probes of Puppet Server that failed, by cause",
            Kind::Counter,
            None,
        );
        for (cause, n) in CAUSES.iter().zip(&self.failures) {
            out.sample("_total", &[("cause", cause)], n.load(Ordering::Relaxed));
        }
        out.family(
            "pmcheck_polls",
            "Polls answered, by kind (http: the HTTP check; agent: HAProxy's agent check) and verdict",
            Kind::Counter,
            None,
        );
        // `polls` is indexed by `Via` and `Verdict` in declaration order.
        for (kind, polls) in ["http", "agent"].into_iter().zip(&self.polls) {
            for (verdict, n) in Verdict::ALL.iter().zip(polls) {
                let labels = [("kind", kind), ("verdict", verdict.as_str())];
                out.sample("_total", &labels, n.load(Ordering::Relaxed));
            }
        }
        out.gauge(
            "pmcheck_pollers",
            "Hosts that polled in the last 10 minutes",
            None,
            pollers,
        );
        if let Some(pool) = decision.probe.and_then(|p| p.pool.as_ref()) {
            encode_pool(&mut out, pool);
        }
        if let Some(expiries) = readings.expiries() {
            encode_expiries(&mut out, &expiries);
        }
        if let Some(code) = readings.code() {
            encode_code(&mut out, &code.deployments);
        }
        out.finish()
    }
}

/// The verdict, the weight, a pause and the drain of `decision`.
fn encode_decision(out: &mut Exposition, decision: &Decision<'_>) {
    out.family(
        "pmcheck_verdict",
        "1 for the verdict a poll gets now (only OK answers 200), 0 for the others",
        Kind::Gauge,
        None,
    );
    for verdict in Verdict::ALL {
        let now = u8::from(verdict == decision.verdict);
        out.sample("", &[("verdict", verdict.as_str())], now);
    }
    out.gauge(
        "pmcheck_agent_weight_ratio",
        "The weight the agent check reports now, as a ratio of the configured weight (its floor while not OK)",
        None,
        f64::from(decision.weight) / 100.0,
    );
    let paused_since = (decision.probe.and_then(|p| p.pause.as_ref())).map(|p| p.since);
    out.gauge(
        "pmcheck_paused",
        "1 while Puppet Server's JRuby pool is paused (locked or refilling after being ready): answered OK at the floor weight for at most --pause-grace",
        None,
        u8::from(paused_since.is_some()),
    );
    if let Some(since) = paused_since {
        out.gauge(
            "pmcheck_pause_started_timestamp",
            "When the pause in force began",
            Some("seconds"),
            epoch_seconds(since),
        );
    }
    let (drained, since, until) = match decision.drain {
        DrainState::NotDrained | DrainState::Expired(_) => (false, None, None),
        DrainState::Drained(d) => (true, d.since(), d.until()),
        // Absent: pmcheck cannot tell.
        DrainState::Unknown(_) => return,
    };
    out.gauge(
        "pmcheck_drained",
        "1 while an operator's drain is in force (absent when pmcheck cannot tell)",
        None,
        u8::from(drained),
    );
    if let Some(since) = since {
        out.gauge(
            "pmcheck_drain_started_timestamp",
            "When the drain in force began",
            Some("seconds"),
            epoch_seconds(since),
        );
    }
    if let Some(until) = until {
        out.gauge(
            "pmcheck_drain_expires_timestamp",
            "When the drain in force lapses by itself (drain --for)",
            Some("seconds"),
            epoch_seconds(until),
        );
    }
}

/// The certificates' `notAfter` (the earliest per file and position) and the CRL's dates.
fn encode_expiries(out: &mut Exposition, e: &Expiries) {
    let earliest = e.earliest();
    if !earliest.is_empty() {
        out.family(
            "pmcheck_certificate_expiry_timestamp",
            "notAfter of the certificates pmcheck's TLS rests on (file: hostcert, localcacert; position: leaf, intermediate, root; the earliest where a file holds several of one position)",
            Kind::Gauge,
            Some("seconds"),
        );
        for (file, position, end) in earliest {
            out.sample(
                "",
                &[("file", file.as_str()), ("position", position.as_str())],
                end,
            );
        }
    }
    if let Some(crl) = &e.crl {
        out.gauge(
            "pmcheck_crl_this_update_timestamp",
            "thisUpdate of the CRL Puppet Server checks agents against (hostcrl, or webserver.conf's ssl-crl-path)",
            Some("seconds"),
            crl.this_update,
        );
        if let Some(next) = crl.next_update {
            out.gauge(
                "pmcheck_crl_next_update_timestamp",
                "nextUpdate of that CRL: past it, agents' and Puppet's own CRL checks fail",
                Some("seconds"),
                next,
            );
        }
    }
}

/// The deploy records read: an environment without a readable record has no series. The
/// `commit` label is the one open-ended label value of pmcheck's metrics: one series per
/// environment at a time, for Prometheus to compare the masters (`PmcheckCodeDiverged`).
fn encode_code(out: &mut Exposition, deployments: &[Deployment]) {
    let records: Vec<(&str, &Record)> = deployments
        .iter()
        .filter_map(|d| match &d.found {
            Found::Record { record, .. } => Some((d.environment.as_str(), record)),
            _ => None,
        })
        .collect();
    /// A family of one value per environment: name, help, unit, and the record's value.
    type PerEnvironment = (
        &'static str,
        &'static str,
        Option<&'static str>,
        fn(&Record) -> Option<i64>,
    );
    let families: [PerEnvironment; 2] = [
        (
            "pmcheck_code_deployed_timestamp",
            "When the environment's last deploy finished (finished_at of its .r10k-deploy.json)",
            Some("seconds"),
            |r| r.finished_at,
        ),
        (
            "pmcheck_code_deploy_success",
            "Whether the environment's last deploy succeeded (deploy_success of its .r10k-deploy.json); after a failed one it may hold older or partly deployed modules",
            None,
            |r| r.success.map(i64::from),
        ),
    ];
    for (name, help, unit, pick) in families {
        let values: Vec<(&str, i64)> = (records.iter())
            .filter_map(|(env, r)| Some((*env, pick(r)?)))
            .collect();
        if values.is_empty() {
            continue;
        }
        out.family(name, help, Kind::Gauge, unit);
        for (environment, value) in values {
            out.sample("", &[("environment", environment)], value);
        }
    }
    let commits: Vec<(&str, &str)> = (records.iter())
        .filter_map(|(env, r)| Some((*env, r.commit.as_deref()?)))
        .collect();
    if !commits.is_empty() {
        out.family(
            "pmcheck_code",
            "The commit each environment holds (signature of its .r10k-deploy.json)",
            Kind::Info,
            None,
        );
        for (environment, commit) in commits {
            let labels = [("commit", commit), ("environment", environment)];
            out.sample("_info", &labels, 1u8);
        }
    }
}

/// Puppet Server's JRuby pool from the latest probe, under `pmcheck_puppetserver_jruby_`.
fn encode_pool(out: &mut Exposition, pool: &Pool) {
    let instances = [
        (
            "pmcheck_puppetserver_jruby_pool_size",
            "JRuby instances Puppet Server runs (num-jrubies)",
            pool.size,
        ),
        (
            "pmcheck_puppetserver_jruby_free",
            "JRuby instances idle now (num-free-jrubies)",
            pool.free,
        ),
        (
            "pmcheck_puppetserver_jruby_borrowed",
            "Requests compiling now (borrowed-instances)",
            pool.borrowed,
        ),
        (
            "pmcheck_puppetserver_jruby_requested",
            "Requests waiting for a JRuby instance (requested-instances)",
            pool.waiting,
        ),
    ];
    for (name, help, value) in instances {
        out.gauge(name, help, None, value);
    }
    out.gauge(
        "pmcheck_puppetserver_jruby_average_free",
        "Free JRuby instances, as Puppet Server averages them (average-free-jrubies)",
        None,
        pool.average_free,
    );
    let times = [
        (
            "pmcheck_puppetserver_jruby_average_wait",
            "How long requests waited for a JRuby instance, recent average (average-wait-time)",
            pool.average_wait_ms,
        ),
        (
            "pmcheck_puppetserver_jruby_average_borrow",
            "How long requests held a JRuby instance, recent average (average-borrow-time)",
            pool.average_borrow_ms,
        ),
    ];
    for (name, help, ms) in times {
        out.gauge(name, help, Some("seconds"), ms as f64 / 1000.0);
    }
    let counts = [
        (
            "pmcheck_puppetserver_jruby_queue_limit_hits",
            "Requests Puppet Server refused because max-queued-requests was reached (queue-limit-hit-count)",
            pool.queue_limit_hits,
        ),
        (
            "pmcheck_puppetserver_jruby_borrow_timeouts",
            "Requests that gave up waiting for a JRuby instance (borrow-timeout-count)",
            pool.borrow_timeouts,
        ),
    ];
    for (name, help, count) in counts {
        out.family(name, help, Kind::Counter, None);
        out.sample("_total", &[], count);
    }
    out.family(
        "pmcheck_puppetserver_jruby_pool_lock",
        "1 for the pool lock's state (acquired: being flushed, nothing compiles), 0 for the others",
        Kind::Gauge,
        None,
    );
    for state in ["not-in-use", "requested", "acquired"] {
        out.sample("", &[("state", state)], u8::from(pool.lock == state));
    }
}

fn epoch_seconds(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// Whether the scraper asked for OpenMetrics (Prometheus does, in its `Accept`).
pub fn wants_openmetrics(accept: impl Iterator<Item = impl AsRef<[u8]>>) -> bool {
    const TYPE: &[u8] = b"application/openmetrics-text";
    accept.into_iter().any(|v| {
        v.as_ref()
            .windows(TYPE.len())
            .any(|w| w.eq_ignore_ascii_case(TYPE))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::record::{Drain, DrainRecord};
    use crate::health::weight::WeightCause;
    use std::time::Duration;

    fn pool() -> Pool {
        Pool {
            size: 4,
            free: 1,
            borrowed: 3,
            waiting: 2,
            average_free: 1.5,
            average_wait_ms: 250,
            average_borrow_ms: 1500,
            queue_limit_hits: 7,
            borrow_timeouts: 3,
            borrows: 0,
            lock: "not-in-use".to_owned(),
            lock_since: None,
            multithreaded: false,
        }
    }

    fn drained(until: Option<Duration>) -> DrainState {
        let record = DrainRecord::held_by(vec![crate::drain::holders::Holder::drain(
            "kernel".to_owned(),
            until,
            SystemTime::now(),
        )])
        .unwrap();
        DrainState::Drained(Drain::parse(&serde_json::to_vec(&record).unwrap()))
    }

    type Now<'a> = (Verdict, &'a DrainState, Option<&'a Pool>, usize);

    fn now<'a>(
        verdict: Verdict,
        drain: &'a DrainState,
        pool: Option<&'a Pool>,
        pollers: usize,
    ) -> Now<'a> {
        (verdict, drain, pool, pollers)
    }

    fn render(metrics: &Metrics, (verdict, drain, pool, pollers): Now<'_>, open: bool) -> String {
        let probe = pool.map(|pool| {
            let healthy = ProbeOutcome::Healthy(None);
            ProbeReport::with_pool(healthy, Some(pool.clone()), Duration::ZERO, None)
        });
        let decision = Decision {
            verdict,
            status: verdict.status(),
            weight: 0,
            weight_cause: WeightCause::NotOk,
            reason: "".into(),
            drain,
            probe: probe.as_ref(),
            age: None,
        };
        metrics.render(&decision, pollers, &Readings::default(), open)
    }

    fn sample<'t>(text: &'t str, series: &str) -> Option<&'t str> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
    }

    #[test]
    fn every_verdict_has_a_series_and_only_the_current_one_is_1() {
        let metrics = Metrics::default();
        let drain = DrainState::NotDrained;
        let text = render(&metrics, now(Verdict::NotReady, &drain, None, 0), false);
        for verdict in Verdict::ALL {
            let want = if verdict == Verdict::NotReady {
                "1"
            } else {
                "0"
            };
            let series = format!("pmcheck_verdict{{verdict=\"{}\"}}", verdict.as_str());
            assert_eq!(sample(&text, &series), Some(want), "{series} in\n{text}");
        }
        assert_eq!(sample(&text, "pmcheck_drained"), Some("0"), "{text}");
        assert!(
            !text.contains("puppetserver"),
            "no pool, no pool series: {text}"
        );
    }

    #[test]
    fn polls_and_failures_count_by_fixed_labels() {
        let metrics = Metrics::default();
        metrics.polled(Via::Http, Verdict::Ok);
        metrics.polled(Via::Http, Verdict::Ok);
        metrics.polled(Via::Agent, Verdict::Drained);
        let refused = ProbeReport::new(
            ProbeOutcome::Unhealthy(ProbeError::Refused {
                addr: "127.0.0.1:8140".parse().unwrap(),
            }),
            Duration::from_millis(3),
            Some("https://x/".to_owned()),
        );
        metrics.probed(&refused);
        metrics.probed(&ProbeReport::new(
            ProbeOutcome::Healthy(None),
            Duration::from_millis(20),
            Some("https://x/".to_owned()),
        ));
        let drain = DrainState::NotDrained;
        let now = now(Verdict::Down, &drain, None, 2);
        let text = render(&metrics, now, false);
        let get = |s: &str| sample(&text, s).unwrap_or_else(|| panic!("no {s} in\n{text}"));
        assert_eq!(get(r#"pmcheck_polls_total{kind="http",verdict="OK"}"#), "2");
        assert_eq!(
            get(r#"pmcheck_polls_total{kind="agent",verdict="DRAINED"}"#),
            "1"
        );
        assert_eq!(
            get(r#"pmcheck_polls_total{kind="agent",verdict="OK"}"#),
            "0"
        );
        assert_eq!(get(r#"pmcheck_probe_failures_total{cause="refused"}"#), "1");
        assert_eq!(get(r#"pmcheck_probe_failures_total{cause="tls"}"#), "0");
        assert_eq!(get("pmcheck_probe_duration_seconds_count"), "2");
        assert_eq!(
            get(r#"pmcheck_probe_duration_seconds_bucket{le="0.005"}"#),
            "1"
        );
        assert_eq!(
            get(r#"pmcheck_probe_duration_seconds_bucket{le="0.025"}"#),
            "2"
        );
        assert_eq!(get("pmcheck_pollers"), "2");
        let labels: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| Some(l.split_once('{')?.1.split_once('}')?.0))
            .collect();
        for set in labels {
            for pair in set.split(',') {
                let key = pair.split_once('=').map_or(pair, |(k, _)| k);
                assert!(
                    [
                        "verdict", "kind", "cause", "le", "state", "version", "action"
                    ]
                    .contains(&key),
                    "a label outside the fixed set: {pair}"
                );
            }
        }
    }

    #[test]
    fn the_pool_and_the_drain_are_exported_in_base_units() {
        let metrics = Metrics::default();
        let drain = drained(Some(Duration::from_secs(3600)));
        let pool = pool();
        let now = now(Verdict::Drained, &drain, Some(&pool), 1);
        let text = render(&metrics, now, false);
        let get = |s: &str| sample(&text, s).unwrap_or_else(|| panic!("no {s} in\n{text}"));
        assert_eq!(get("pmcheck_puppetserver_jruby_pool_size"), "4");
        assert_eq!(get("pmcheck_puppetserver_jruby_free"), "1");
        assert_eq!(get("pmcheck_puppetserver_jruby_borrowed"), "3");
        assert_eq!(get("pmcheck_puppetserver_jruby_requested"), "2");
        assert_eq!(get("pmcheck_puppetserver_jruby_average_free"), "1.5");
        assert_eq!(
            get("pmcheck_puppetserver_jruby_average_wait_seconds"),
            "0.25"
        );
        assert_eq!(
            get("pmcheck_puppetserver_jruby_average_borrow_seconds"),
            "1.5"
        );
        assert_eq!(
            get("pmcheck_puppetserver_jruby_queue_limit_hits_total"),
            "7"
        );
        assert_eq!(get("pmcheck_puppetserver_jruby_borrow_timeouts_total"), "3");
        assert_eq!(
            get(r#"pmcheck_puppetserver_jruby_pool_lock{state="not-in-use"}"#),
            "1"
        );
        assert_eq!(
            get(r#"pmcheck_puppetserver_jruby_pool_lock{state="acquired"}"#),
            "0"
        );
        assert_eq!(get("pmcheck_drained"), "1");
        let now_s = epoch_seconds(SystemTime::now());
        let since: f64 = get("pmcheck_drain_started_timestamp_seconds")
            .parse()
            .unwrap();
        let until: f64 = get("pmcheck_drain_expires_timestamp_seconds")
            .parse()
            .unwrap();
        // The record keeps whole seconds.
        assert!((now_s - since).abs() < 5.0, "{since} vs {now_s}");
        assert!((until - since - 3600.0).abs() < 1.5, "{until} - {since}");
    }

    #[test]
    fn an_unreadable_drain_state_has_no_drain_series() {
        let metrics = Metrics::default();
        let drain = DrainState::Unknown(crate::drain::record::Unreadable::Hung {
            path: "/var/lib/pmcheck/drain".into(),
            after: Duration::from_secs(1),
        });
        let text = render(&metrics, now(Verdict::Unknown, &drain, None, 0), true);
        assert!(!text.contains("pmcheck_drained"), "{text}");
        assert_eq!(
            sample(&text, r#"pmcheck_verdict{verdict="UNKNOWN"}"#),
            Some("1")
        );
    }

    #[test]
    fn openmetrics_and_classic_differ_only_where_the_formats_do() {
        let metrics = Metrics::default();
        let drain = drained(None);
        let pool = pool();
        let now = now(Verdict::Drained, &drain, Some(&pool), 0);
        let open = render(&metrics, now, true);
        let text = render(&metrics, now, false);
        assert!(open.ends_with("# EOF\n"), "{open}");
        assert!(open.contains("# TYPE pmcheck_polls counter\n"), "{open}");
        assert!(open.contains("# TYPE pmcheck_build info\n"), "{open}");
        assert!(open.contains("# UNIT pmcheck_probe_duration_seconds seconds\n"));
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE pmcheck_polls_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP pmcheck_polls_total Polls answered"),
            "{text}"
        );
        assert!(text.contains("# TYPE pmcheck_build_info gauge\n"), "{text}");
        let version = format!(
            "pmcheck_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&version), "{text}");
        let samples = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(samples(&open), samples(&text));
        // Every family is declared once, right before its samples.
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let helps = text.lines().filter(|l| l.starts_with("# HELP ")).count();
        assert_eq!(types.len(), helps, "{text}");
    }

    #[test]
    fn openmetrics_is_what_the_accept_header_names() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics([prometheus].iter()));
        assert!(wants_openmetrics(
            ["text/plain", "Application/OpenMetrics-Text"].iter()
        ));
        assert!(!wants_openmetrics(["text/plain;version=0.0.4"].iter()));
        assert!(!wants_openmetrics(std::iter::empty::<&str>()));
    }
}
