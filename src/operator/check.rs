//! `pmcheck check`: one probe and the drain record, as a monitoring plugin's line and exit code.

use crate::cli::CheckArgs;
use crate::console::outln;
use crate::drain::file::DrainFile;
use crate::exit::Exit;
use crate::health::decision::{Decision, Rules};
use crate::health::verdict::Verdict;
use crate::health::weight::Rejoin;
use crate::operator::daemon::Daemon;
use crate::operator::run_single_threaded;
use crate::puppet::client::ProbeTarget;
use crate::puppet::expiry::{self, Expiries, Severity};
use crate::puppet::pool::Load;
use crate::puppet::probe::Prober;
use crate::puppet::report::ProbeOutcome;
use crate::settings::{Given, Host, Settings};

/// A monitoring-plugin line and exit code: 0 OK, 1 WARNING (drained, the JRuby pool paused
/// while Puppet Server is healthy, or a certificate or the CRL due within `warn`), 2 CRITICAL
/// (Puppet unhealthy, or one due within `crit` or past), 3 UNKNOWN (bad settings, unreadable
/// drain state). The worst wins, and the line names each problem, and where the daemon at
/// `--url` answers otherwise, what it answers.
pub fn check(given: &Given, args: &CheckArgs) -> Exit {
    let (warn, crit, url) = (args.warn_expiry, args.crit_expiry, &args.daemon.url);
    let settings = match Settings::resolve(given, &Host::REAL) {
        Ok(s) => s,
        Err(e) => return unknown(&e),
    };
    // One runtime for the probe and the question to the daemon, asked side by side.
    let asked = run_single_threaded(async {
        let probe = async { Prober::once(ProbeTarget::of(&settings)).probe().await };
        let daemon = async { Daemon::new(url).ok()?.ask().await.ok() };
        tokio::join!(probe, daemon)
    });
    let (report, daemon) = match asked {
        Ok(asked) => asked,
        Err(e) => return unknown(&format!("cannot start the probe: {e}")),
    };
    let now = crate::health::Now {
        at: std::time::Instant::now(),
        wall: std::time::SystemTime::now(),
    };
    let drain = DrainFile::new(&settings.given.state_dir).state(now.wall);
    let decision = Decision::decide(&drain, Some(&report), Rejoin::Steady, now, &Rules::ONCE);
    let mut code = match (decision.verdict, &report.outcome) {
        (Verdict::Unknown | Verdict::Starting, _) | (_, ProbeOutcome::CannotTell(_)) => {
            Exit::Unknown
        }
        (_, ProbeOutcome::Unhealthy(_) | ProbeOutcome::NotReady(_)) => Exit::Critical,
        (Verdict::Drained, _) | (_, ProbeOutcome::Healthy(Some(Load::Paused))) => Exit::Warning,
        _ => Exit::Ok,
    };
    let (cert, ca, crl) = (&settings.hostcert, &settings.localcacert, &settings.hostcrl);
    let expiry =
        Expiries::read(&cert.value, &ca.value, &crl.value).judge(expiry::now(), warn, crit);
    code = match (code, expiry.severity) {
        (Exit::Unknown, _) => code,
        (_, Severity::Critical) => Exit::Critical,
        (Exit::Ok, Severity::Warning) => Exit::Warning,
        _ => code,
    };
    let pool = (report.pool.as_ref()).map_or(String::new(), |p| pool_perfdata(p, decision.weight));
    let latency = report.latency.as_secs_f64();
    let perfdata = format!("time={latency:.3}s;;;0{pool}{}", expiry.perfdata);
    let mut text = decision.reason.to_string();
    text.extend(expiry.problems.iter().map(|problem| format!("; {problem}")));
    // Run as root or as a monitoring agent's user, this check may read what the daemon cannot
    // (a key of mode 0600), and HAProxy follows the daemon: what it answers, when otherwise.
    if let Some(theirs) = (daemon.as_ref()).filter(|d| d.answer.verdict != decision.verdict) {
        let (verdict, reason) = (theirs.answer.verdict, &theirs.answer.reason);
        text.push_str(&format!(
            "; but the daemon at {url}, which HAProxy follows, answers {} - {reason} (it may run \
             as a user that cannot read what this check read: `sudo pmcheck config --check` \
             names what the service cannot read)",
            verdict.as_str()
        ));
        code = match verdict {
            Verdict::Down | Verdict::NotReady | Verdict::Unknown => Exit::Critical,
            Verdict::Drained if code == Exit::Ok => Exit::Warning,
            _ => code,
        };
    }
    let label = match code {
        Exit::Ok => "OK",
        Exit::Warning => "WARNING",
        Exit::Critical => "CRITICAL",
        _ => "UNKNOWN",
    };
    outln!("PMCHECK {label} - {text} | {perfdata}");
    code
}

/// `PMCHECK UNKNOWN - why`: the check could not be made.
fn unknown(why: &dyn std::fmt::Display) -> Exit {
    outln!("PMCHECK UNKNOWN - {why}");
    Exit::Unknown
}

/// The pool as monitoring-plugin performance data (after a space): gauges with their bounds,
/// counters as `c`.
fn pool_perfdata(pool: &crate::puppet::pool::Pool, weight: u8) -> String {
    let size = pool.size;
    format!(
        " jrubies_free={};;;0;{size} jrubies_borrowed={};;;0;{size} jrubies_waiting={};;;0 \
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
