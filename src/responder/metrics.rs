//! `GET /metrics`: what pmcheck knows, for Prometheus.
//!
//! Open source Puppet Server has no Prometheus endpoint, and pmcheck reads its JRuby pool on
//! every probe anyway, so the last probe's pool is re-exported here beside pmcheck's own series.
//! A scrape decides the verdict exactly as a poll does, from the latest state, and never causes
//! a probe. Every label comes from a fixed list in this file: no peer addresses, no reasons.
//!
//! Prometheus asks for OpenMetrics and gets it. Anyone else (curl, `promtool check metrics`)
//! gets the classic text format 0.0.4, which prometheus-client does not write: [`classic`]
//! rewrites the few lines where the two formats differ.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use crate::drain::audit::EventCounts;
use crate::drain::log::Action;
use crate::drain::record::DrainState;
use crate::health::verdict::Verdict;
use crate::puppet::code::{self, Deployment, Found, Record};
use crate::puppet::expiry::Expiries;
use crate::puppet::pool::Pool;
use crate::puppet::probe_error::ProbeError;
use crate::puppet::readings::Readings;
use crate::puppet::report::{ProbeOutcome, ProbeReport};
use crate::responder::pollers::Via;

/// The `Content-Type` of an OpenMetrics scrape.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The `Content-Type` of the classic text format.
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every series name starts with this.
const PREFIX: &str = "pmcheck";

/// Probe durations, in seconds: from a warm local Puppet Server (milliseconds) to the longest
/// `--timeout` an operator would set.
const PROBE_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Why a probe failed: the `cause` label of `pmcheck_probe_failures_total`. A Puppet Server
/// that answers "not ready" (starting, pool locked) is not a failure: the verdict says NOTREADY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Nothing listens on Puppet Server's port.
    Refused,
    /// The TCP connection failed otherwise.
    Connect,
    /// The TLS handshake failed (either side's certificate).
    Tls,
    /// No answer within `--timeout`.
    Timeout,
    /// An HTTP status pmcheck does not expect.
    HttpStatus,
    /// The status service reports a failed state.
    NotRunning,
    /// The answer is not a service status.
    Unreadable,
    /// The HTTP exchange broke after connecting.
    Exchange,
    /// No probe could be made: this host's certificate, key, CA or settings.
    CannotProbe,
}

impl Cause {
    /// Every cause, in declaration order (a cause's index in it is `cause as usize`).
    pub const ALL: [Cause; 9] = [
        Cause::Refused,
        Cause::Connect,
        Cause::Tls,
        Cause::Timeout,
        Cause::HttpStatus,
        Cause::NotRunning,
        Cause::Unreadable,
        Cause::Exchange,
        Cause::CannotProbe,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Refused => "refused",
            Cause::Connect => "connect",
            Cause::Tls => "tls",
            Cause::Timeout => "timeout",
            Cause::HttpStatus => "http_status",
            Cause::NotRunning => "not_running",
            Cause::Unreadable => "unreadable",
            Cause::Exchange => "exchange",
            Cause::CannotProbe => "cannot_probe",
        }
    }

    /// Why `outcome` is a failure, if it is one.
    pub fn of(outcome: &ProbeOutcome) -> Option<Cause> {
        Some(match outcome {
            ProbeOutcome::Healthy(_) | ProbeOutcome::NotReady(_) => return None,
            ProbeOutcome::CannotTell(_) => Cause::CannotProbe,
            ProbeOutcome::Unhealthy(e) => match e {
                ProbeError::Refused { .. } => Cause::Refused,
                ProbeError::Connect { .. } => Cause::Connect,
                ProbeError::Tls { .. } => Cause::Tls,
                ProbeError::Timeout { .. } => Cause::Timeout,
                ProbeError::Status { .. } => Cause::HttpStatus,
                ProbeError::NotRunning(_) => Cause::NotRunning,
                ProbeError::Unreadable { .. } => Cause::Unreadable,
                ProbeError::Http { .. } => Cause::Exchange,
            },
        })
    }
}

/// The daemon's counters: polls and probes, counted as they happen.
#[derive(Debug)]
pub struct Metrics {
    /// Polls answered, by how they came and by verdict: `[via][verdict]`.
    polls: [[AtomicU64; Verdict::ALL.len()]; 2],
    /// Failed probes, by cause.
    failures: [AtomicU64; Cause::ALL.len()],
    /// How long each probe that reached the network took.
    probe_seconds: Histogram,
    /// Drain events read from the event log, by action (counted by the log's reader).
    pub drain_events: Arc<EventCounts>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every counter at zero.
    pub fn new() -> Self {
        Self {
            polls: Default::default(),
            failures: Default::default(),
            probe_seconds: Histogram::new(PROBE_BUCKETS),
            drain_events: Arc::default(),
        }
    }

    /// Counts one poll: one relaxed atomic add, on the hot path.
    pub fn polled(&self, via: Via, verdict: Verdict) {
        self.polls[via as usize][verdict as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one probe: its duration when it reached the network, its cause when it failed.
    pub fn probed(&self, report: &ProbeReport) {
        if report.endpoint.is_some() {
            self.probe_seconds.observe(report.latency.as_secs_f64());
        }
        if let Some(cause) = Cause::of(&report.outcome) {
            self.failures[cause as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The scrape's body: OpenMetrics, or the classic text format.
    pub fn render(&self, now: Current<'_>, readings: &Readings, openmetrics: bool) -> String {
        let drain = match now.drain {
            DrainState::NotDrained | DrainState::Expired(_) => Some((false, None, None)),
            DrainState::Drained(d) => Some((true, d.since(), d.until())),
            DrainState::Unknown(_) => None,
        };
        let scrape = Scrape {
            verdict: now.verdict,
            weight: now.weight,
            drain: drain.map(|(drained, since, until)| DrainSeries {
                drained,
                since: since.map(epoch_seconds),
                until: until.map(epoch_seconds),
            }),
            pool: now.pool.cloned(),
            paused_since: now.paused_since.map(epoch_seconds),
            pollers: now.pollers,
            polls: self
                .polls
                .each_ref()
                .map(|row| row.each_ref().map(|n| n.load(Ordering::Relaxed))),
            failures: self.failures.each_ref().map(|n| n.load(Ordering::Relaxed)),
            probe_seconds: self.probe_seconds.clone(),
            drain_events: self.drain_events.each(),
            expiries: readings.expiries(),
            code: readings.code(),
        };
        let mut registry = Registry::with_prefix(PREFIX);
        registry.register_collector(Box::new(scrape));
        let mut text = String::with_capacity(8 * 1024);
        // Writing into a String cannot fail, and every value is a number or a fixed label.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        if openmetrics { text } else { classic(&text) }
    }
}

/// What a scrape reports besides the counters, decided at the scrape like a poll.
#[derive(Debug, Clone, Copy)]
pub struct Current<'a> {
    /// The verdict a poll would get now.
    pub verdict: Verdict,
    /// The agent-check weight a poll would get now, in percent.
    pub weight: u8,
    /// The drain state.
    pub drain: &'a DrainState,
    /// The pool from the latest probe, when it read one.
    pub pool: Option<&'a Pool>,
    /// When the pause in force began, while the pool is paused.
    pub paused_since: Option<SystemTime>,
    /// How many pollers were heard from recently.
    pub pollers: usize,
}

/// The drain, as series; absent when pmcheck cannot tell whether the node is drained.
#[derive(Debug)]
struct DrainSeries {
    drained: bool,
    since: Option<f64>,
    until: Option<f64>,
}

/// One scrape's values, encoded by prometheus-client.
#[derive(Debug)]
struct Scrape {
    verdict: Verdict,
    weight: u8,
    drain: Option<DrainSeries>,
    pool: Option<Pool>,
    paused_since: Option<f64>,
    pollers: usize,
    polls: [[u64; Verdict::ALL.len()]; 2],
    failures: [u64; Cause::ALL.len()],
    probe_seconds: Histogram,
    drain_events: [(Action, u64); Action::ALL.len()],
    expiries: Option<Arc<Expiries>>,
    code: Option<Arc<code::Reading>>,
}

impl Collector for Scrape {
    fn encode(&self, mut out: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let version = Info::new([("version", env!("CARGO_PKG_VERSION"))]);
        version.encode(out.encode_descriptor(
            "build",
            "pmcheck's version",
            None,
            MetricType::Info,
        )?)?;

        let mut family = out.encode_descriptor(
            "drain_events",
            "Drain events (drain, undrain, expire, cycle steps, refused drains) the daemon read from the state directory's event log since it started",
            None,
            MetricType::Counter,
        )?;
        for (action, n) in self.drain_events {
            ConstCounter::new(n).encode(family.encode_family(&[("action", action.as_str())])?)?;
        }

        let mut family = out.encode_descriptor(
            "verdict",
            "1 for the verdict a poll gets now (only OK answers 200), 0 for the others",
            None,
            MetricType::Gauge,
        )?;
        for verdict in Verdict::ALL {
            let labels = [("verdict", verdict.as_str())];
            ConstGauge::new(i64::from(verdict == self.verdict))
                .encode(family.encode_family(&labels)?)?;
        }
        gauge(
            &mut out,
            "agent_weight_ratio",
            "The weight the agent check reports now, as a ratio of the configured weight (its floor while not OK)",
            None,
            f64::from(self.weight) / 100.0,
        )?;
        gauge(
            &mut out,
            "paused",
            "1 while Puppet Server's JRuby pool is paused (locked or refilling after being ready): answered OK at the floor weight for at most --pause-grace",
            None,
            i64::from(self.paused_since.is_some()),
        )?;
        if let Some(since) = self.paused_since {
            gauge(
                &mut out,
                "pause_started_timestamp",
                "When the pause in force began",
                Some(&Unit::Seconds),
                since,
            )?;
        }
        if let Some(drain) = &self.drain {
            gauge(
                &mut out,
                "drained",
                "1 while an operator's drain is in force (absent when pmcheck cannot tell)",
                None,
                i64::from(drain.drained),
            )?;
            if let Some(since) = drain.since {
                gauge(
                    &mut out,
                    "drain_started_timestamp",
                    "When the drain in force began",
                    Some(&Unit::Seconds),
                    since,
                )?;
            }
            if let Some(until) = drain.until {
                gauge(
                    &mut out,
                    "drain_expires_timestamp",
                    "When the drain in force lapses by itself (drain --for)",
                    Some(&Unit::Seconds),
                    until,
                )?;
            }
        }
        self.probe_seconds.encode(out.encode_descriptor(
            "probe_duration",
            "How long each probe of Puppet Server's status API took",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?)?;
        let mut family = out.encode_descriptor(
            "probe_failures",
            "Probes of Puppet Server that failed, by cause",
            None,
            MetricType::Counter,
        )?;
        for cause in Cause::ALL {
            let labels = [("cause", cause.as_str())];
            ConstCounter::new(self.failures[cause as usize])
                .encode(family.encode_family(&labels)?)?;
        }
        let mut family = out.encode_descriptor(
            "polls",
            "Polls answered, by kind (http: the HTTP check; agent: HAProxy's agent check) and verdict",
            None,
            MetricType::Counter,
        )?;
        for (via, kind) in [(Via::Http, "http"), (Via::Agent, "agent")] {
            for verdict in Verdict::ALL {
                let labels = [("kind", kind), ("verdict", verdict.as_str())];
                ConstCounter::new(self.polls[via as usize][verdict as usize])
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        gauge(
            &mut out,
            "pollers",
            "Hosts that polled in the last 10 minutes",
            None,
            self.pollers as u64,
        )?;
        if let Some(pool) = &self.pool {
            encode_pool(&mut out, pool)?;
        }
        if let Some(expiries) = &self.expiries {
            encode_expiries(&mut out, expiries)?;
        }
        if let Some(code) = &self.code {
            encode_code(&mut out, &code.deployments)?;
        }
        Ok(())
    }
}

/// The certificates' `notAfter` (the earliest per file and position) and the CRL's dates.
fn encode_expiries(out: &mut DescriptorEncoder, e: &Expiries) -> Result<(), std::fmt::Error> {
    let earliest = e.earliest();
    if !earliest.is_empty() {
        let mut family = out.encode_descriptor(
            "certificate_expiry_timestamp",
            "notAfter of the certificates pmcheck's TLS rests on (file: hostcert, localcacert; position: leaf, intermediate, root; the earliest where a file holds several of one position)",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        for (file, position, end) in earliest {
            let labels = [("file", file.as_str()), ("position", position.as_str())];
            ConstGauge::new(end).encode(family.encode_family(&labels)?)?;
        }
    }
    if let Some(crl) = &e.crl {
        gauge(
            out,
            "crl_this_update_timestamp",
            "thisUpdate of the CRL Puppet Server checks agents against (hostcrl, or webserver.conf's ssl-crl-path)",
            Some(&Unit::Seconds),
            crl.this_update,
        )?;
        if let Some(next) = crl.next_update {
            gauge(
                out,
                "crl_next_update_timestamp",
                "nextUpdate of that CRL: past it, agents' and Puppet's own CRL checks fail",
                Some(&Unit::Seconds),
                next,
            )?;
        }
    }
    Ok(())
}

/// The deploy records read: an environment without a readable record has no series. The
/// `commit` label is the one open-ended label value of pmcheck's metrics: one series per
/// environment at a time, for Prometheus to compare the masters (`PmcheckCodeDiverged`).
fn encode_code(
    out: &mut DescriptorEncoder,
    deployments: &[Deployment],
) -> Result<(), std::fmt::Error> {
    let records: Vec<(&str, &Record)> = deployments
        .iter()
        .filter_map(|d| match &d.found {
            Found::Record { record, .. } => Some((d.environment.as_str(), record)),
            _ => None,
        })
        .collect();
    let series = |pick: fn(&Record) -> Option<i64>| -> Vec<(&str, i64)> {
        records
            .iter()
            .filter_map(|(env, r)| Some((*env, pick(r)?)))
            .collect()
    };
    /// A gauge family of one value per environment.
    struct PerEnvironment<'a> {
        name: &'a str,
        help: &'a str,
        unit: Option<&'a Unit>,
        values: Vec<(&'a str, i64)>,
    }
    let families = [
        PerEnvironment {
            name: "code_deployed_timestamp",
            help: "When the environment's last deploy finished (finished_at of its .r10k-deploy.json)",
            unit: Some(&Unit::Seconds),
            values: series(|r| r.finished_at),
        },
        PerEnvironment {
            name: "code_deploy_success",
            help: "Whether the environment's last deploy succeeded (deploy_success of its .r10k-deploy.json); after a failed one it may hold older or partly deployed modules",
            unit: None,
            values: series(|r| r.success.map(i64::from)),
        },
    ];
    for f in families.into_iter().filter(|f| !f.values.is_empty()) {
        let mut family = out.encode_descriptor(f.name, f.help, f.unit, MetricType::Gauge)?;
        for (environment, value) in f.values {
            ConstGauge::new(value)
                .encode(family.encode_family(&[("environment", environment)])?)?;
        }
    }
    let commits: Vec<(&str, &str)> = records
        .iter()
        .filter_map(|(env, r)| Some((*env, r.commit.as_deref()?)))
        .collect();
    if !commits.is_empty() {
        let mut family = out.encode_descriptor(
            "code",
            "The commit each environment holds (signature of its .r10k-deploy.json)",
            None,
            MetricType::Info,
        )?;
        for (environment, commit) in commits {
            Info::new([("commit", commit)])
                .encode(family.encode_family(&[("environment", environment)])?)?;
        }
    }
    Ok(())
}

/// Puppet Server's JRuby pool from the latest probe, under `pmcheck_puppetserver_jruby_`.
fn encode_pool(out: &mut DescriptorEncoder, pool: &Pool) -> Result<(), std::fmt::Error> {
    let instances = [
        (
            "puppetserver_jruby_pool_size",
            "JRuby instances Puppet Server runs (num-jrubies)",
            pool.size,
        ),
        (
            "puppetserver_jruby_free",
            "JRuby instances idle now (num-free-jrubies)",
            pool.free,
        ),
        (
            "puppetserver_jruby_borrowed",
            "Requests compiling now (borrowed-instances)",
            pool.borrowed,
        ),
        (
            "puppetserver_jruby_requested",
            "Requests waiting for a JRuby instance (requested-instances)",
            pool.waiting,
        ),
    ];
    for (name, help, value) in instances {
        gauge(out, name, help, None, value)?;
    }
    gauge(
        out,
        "puppetserver_jruby_average_free",
        "Free JRuby instances, as Puppet Server averages them (average-free-jrubies)",
        None,
        pool.average_free,
    )?;
    let times = [
        (
            "puppetserver_jruby_average_wait",
            "How long requests waited for a JRuby instance, recent average (average-wait-time)",
            pool.average_wait_ms,
        ),
        (
            "puppetserver_jruby_average_borrow",
            "How long requests held a JRuby instance, recent average (average-borrow-time)",
            pool.average_borrow_ms,
        ),
    ];
    for (name, help, ms) in times {
        gauge(out, name, help, Some(&Unit::Seconds), ms as f64 / 1000.0)?;
    }
    let counts = [
        (
            "puppetserver_jruby_queue_limit_hits",
            "Requests Puppet Server refused because max-queued-requests was reached (queue-limit-hit-count)",
            pool.queue_limit_hits,
        ),
        (
            "puppetserver_jruby_borrow_timeouts",
            "Requests that gave up waiting for a JRuby instance (borrow-timeout-count)",
            pool.borrow_timeouts,
        ),
    ];
    for (name, help, count) in counts {
        ConstCounter::new(count).encode(out.encode_descriptor(
            name,
            help,
            None,
            MetricType::Counter,
        )?)?;
    }
    let mut family = out.encode_descriptor(
        "puppetserver_jruby_pool_lock",
        "1 for the pool lock's state (acquired: being flushed, nothing compiles), 0 for the others",
        None,
        MetricType::Gauge,
    )?;
    for state in ["not-in-use", "requested", "acquired"] {
        let labels = [("state", state)];
        ConstGauge::new(i64::from(pool.lock == state)).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// One unlabelled gauge.
fn gauge<N>(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: N,
) -> Result<(), std::fmt::Error>
where
    ConstGauge<N>: EncodeMetric,
{
    let gauge = ConstGauge::new(value);
    gauge.encode(out.encode_descriptor(name, help, unit, MetricType::Gauge)?)
}

fn epoch_seconds(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// The classic text format (0.0.4) of prometheus-client's OpenMetrics text: a counter family is
/// declared under its samples' `_total` name and an info family as an `_info` gauge; `# UNIT`
/// and `# EOF` go. Samples, labels and their escaping are the same in both formats.
/// prometheus-client writes OpenMetrics only (prometheus/client_rust#51 asks for the classic
/// format); rewriting its output keeps one registry and one set of series.
pub fn classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.rsplit_once(' ').unwrap_or((rest, "untyped"));
            let (suffix, kind) = match kind {
                "counter" => ("_total", "counter"),
                "info" => ("_info", "gauge"),
                "unknown" => ("", "untyped"),
                other => ("", other),
            };
            if let Some(text) = help.take().and_then(|h| h.strip_prefix(name)) {
                let _ = writeln!(out, "# HELP {name}{suffix}{text}");
            }
            let _ = writeln!(out, "# TYPE {name}{suffix} {kind}");
        } else if !(line.starts_with("# UNIT ") || line == "# EOF") {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
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
    use crate::puppet::report::ProbeReport;
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
        let record = DrainRecord::new("kernel".to_owned(), until, SystemTime::now());
        DrainState::Drained(Drain::parse(&serde_json::to_vec(&record).unwrap()))
    }

    fn now<'a>(
        verdict: Verdict,
        drain: &'a DrainState,
        pool: Option<&'a Pool>,
        pollers: usize,
    ) -> Current<'a> {
        Current {
            verdict,
            weight: 0,
            drain,
            pool,
            paused_since: None,
            pollers,
        }
    }

    fn sample<'t>(text: &'t str, series: &str) -> Option<&'t str> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
    }

    #[test]
    fn every_verdict_has_a_series_and_only_the_current_one_is_1() {
        let metrics = Metrics::new();
        let drain = DrainState::NotDrained;
        let text = metrics.render(
            now(Verdict::NotReady, &drain, None, 0),
            &Readings::default(),
            false,
        );
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
        let metrics = Metrics::new();
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
        let text = metrics.render(now, &Readings::default(), false);
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
        let metrics = Metrics::new();
        let drain = drained(Some(Duration::from_secs(3600)));
        let pool = pool();
        let now = now(Verdict::Drained, &drain, Some(&pool), 1);
        let text = metrics.render(now, &Readings::default(), false);
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
        let metrics = Metrics::new();
        let drain = DrainState::Unknown(crate::drain::record::Unreadable::Hung {
            path: "/var/lib/pmcheck/drain".into(),
            after: Duration::from_secs(1),
        });
        let text = metrics.render(
            now(Verdict::Unknown, &drain, None, 0),
            &Readings::default(),
            true,
        );
        assert!(!text.contains("pmcheck_drained"), "{text}");
        assert_eq!(
            sample(&text, r#"pmcheck_verdict{verdict="UNKNOWN"}"#),
            Some("1")
        );
    }

    #[test]
    fn openmetrics_and_classic_differ_only_where_the_formats_do() {
        let metrics = Metrics::new();
        let drain = drained(None);
        let pool = pool();
        let now = now(Verdict::Drained, &drain, Some(&pool), 0);
        let open = metrics.render(now, &Readings::default(), true);
        let text = metrics.render(now, &Readings::default(), false);
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
