//! `pmcheck check`: one probe and the drain record, as a monitoring plugin's line and exit code.

use std::time::Duration;

use crate::console::outln;
use crate::drain::file::DrainFile;
use crate::exit::Exit;
use crate::health::decision::{Decision, Rules};
use crate::health::verdict::Verdict;
use crate::health::weight::Rejoin;
use crate::operator::daemon::Daemon;
use crate::operator::run_single_threaded;
use crate::operator::view::View;
use crate::puppet::expiry::{self, Expiries, Severity};
use crate::puppet::pool::Load;
use crate::puppet::probe::{ProbeTarget, Prober};
use crate::puppet::report::ProbeOutcome;
use crate::settings::{Given, Host, Settings};

/// A monitoring-plugin line and exit code: 0 OK, 1 WARNING (drained, the JRuby pool paused
/// while Puppet Server is healthy, or a certificate or the CRL due within `warn`), 2 CRITICAL
/// (Puppet unhealthy, or one due within `crit` or past), 3 UNKNOWN (bad settings, unreadable
/// drain state). The worst wins, and the line names each problem, and where the daemon at
/// `url` answers otherwise, what it answers.
pub fn check(given: &Given, warn: Duration, crit: Duration, url: &str) -> Exit {
    let settings = match Settings::resolve(given, &Host::REAL) {
        Ok(s) => s,
        Err(e) => {
            outln!("PMCHECK UNKNOWN - {e}");
            return Exit::Unknown;
        }
    };
    // One runtime for the probe and the question to the daemon, asked side by side.
    let asked = run_single_threaded(async {
        let probe = async { Prober::once(ProbeTarget::of(&settings)).probe().await };
        let daemon = async {
            match Daemon::new(url) {
                Ok(daemon) => daemon.ask().await.ok(),
                Err(_) => None,
            }
        };
        tokio::join!(probe, daemon)
    });
    let (report, daemon) = match asked {
        Ok(asked) => asked,
        Err(e) => {
            outln!("PMCHECK UNKNOWN - cannot start the probe: {e}");
            return Exit::Unknown;
        }
    };
    let now = crate::health::Now {
        at: std::time::Instant::now(),
        wall: std::time::SystemTime::now(),
    };
    let drain = DrainFile::new(&settings.state_dir.value).state(now.wall);
    let decision = Decision::decide(&drain, Some(&report), Rejoin::Steady, now, &Rules::ONCE);
    let (label, code) = match (decision.verdict, &report.outcome) {
        (Verdict::Unknown | Verdict::Starting, _) | (_, ProbeOutcome::CannotTell(_)) => {
            ("UNKNOWN", Exit::Unknown)
        }
        (_, ProbeOutcome::Unhealthy(_) | ProbeOutcome::NotReady(_)) => ("CRITICAL", Exit::Critical),
        (Verdict::Drained, _) | (_, ProbeOutcome::Healthy(Some(Load::Paused))) => {
            ("WARNING", Exit::Warning)
        }
        _ => ("OK", Exit::Ok),
    };
    let now = expiry::now();
    let expiry = Expiries::read(
        &settings.hostcert.value,
        &settings.localcacert.value,
        &settings.hostcrl.value,
    )
    .judge(now, warn, crit);
    let (label, code) = match (code, expiry.severity) {
        (Exit::Unknown, _) => (label, code),
        (_, Severity::Critical) => ("CRITICAL", Exit::Critical),
        (Exit::Ok, Severity::Warning) => ("WARNING", Exit::Warning),
        _ => (label, code),
    };
    let mut perfdata = format!("time={:.3}s;;;0", report.latency.as_secs_f64());
    if let Some(pool) = &report.pool {
        perfdata.push(' ');
        perfdata.push_str(&pool_perfdata(pool, decision.weight));
    }
    perfdata.push_str(&expiry.perfdata);
    let mut text = decision.reason.to_string();
    for problem in &expiry.problems {
        text.push_str("; ");
        text.push_str(problem);
    }
    let (label, code) = match daemon_differs(daemon.as_ref(), url, decision.verdict) {
        Some((verdict, said)) => {
            text.push_str("; ");
            text.push_str(&said);
            match verdict {
                Verdict::Down | Verdict::NotReady | Verdict::Unknown => {
                    ("CRITICAL", Exit::Critical)
                }
                Verdict::Drained if code == Exit::Ok => ("WARNING", Exit::Warning),
                _ => (label, code),
            }
        }
        None => (label, code),
    };
    outln!("PMCHECK {label} - {text} | {perfdata}");
    code
}

/// What the daemon at `url` answers HAProxy, when one answers there and its verdict is not
/// `mine`: run as root or as a monitoring agent's user, this check may read what the daemon
/// cannot (a key of mode 0600), and HAProxy follows the daemon.
fn daemon_differs(daemon: Option<&View>, url: &str, mine: Verdict) -> Option<(Verdict, String)> {
    let answer = &daemon?.answer;
    (answer.verdict != mine).then(|| {
        let said = format!(
            "but the daemon at {url}, which HAProxy follows, answers {} - {} (it may run as \
             a user that cannot read what this check read: `sudo pmcheck config --check` names \
             what the service cannot read)",
            answer.verdict.as_str(),
            answer.reason
        );
        (answer.verdict, said)
    })
}

/// The pool as monitoring-plugin performance data: gauges with their bounds, counters as `c`.
fn pool_perfdata(pool: &crate::puppet::pool::Pool, weight: u8) -> String {
    let size = pool.size;
    format!(
        "jrubies_free={};;;0;{size} jrubies_borrowed={};;;0;{size} jrubies_waiting={};;;0 \
         average_wait={}ms;;;0 average_borrow={}ms;;;0 queue_limit_hits={}c borrow_timeouts={}c \
         weight={weight}%;;;0;100",
        pool.free,
        pool.borrowed,
        pool.waiting,
        pool.average_wait_ms,
        pool.average_borrow_ms,
        pool.queue_limit_hits,
        pool.borrow_timeouts,
    )
}
