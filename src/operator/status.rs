//! `pmcheck status`: asks the running daemon what it answers HAProxy, for a person, with its
//! slow readings in words: the certificates' and the CRL's ends, and each environment's deploy.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::drain::holders::{Holder, Kind};
use crate::health::answer::Answer;
use crate::health::decision::DRAIN_UNKNOWN;
use crate::health::hold::Held;
use crate::health::lb_state::Health;
use crate::health::verdict::Verdict;
use crate::health::weight::WeightCause;
use crate::operator::daemon::Reply;
use crate::protocol::{
    CertificatesAnswer, CodeAnswer, PollerAnswer, StateAnswer, Status, TrafficAnswer,
};
use crate::puppet::pool::{Load, Pool};
use crate::settings::lb_proof::KeyFileAnswer;
use crate::text::seconds;

/// `ms` milliseconds, as `12.3s`.
fn ms(ms: u64) -> String {
    seconds(Duration::from_millis(ms))
}

/// The host names of `addrs` from reverse DNS, for a person. An address whose lookup fails or
/// takes longer than a second (all run at once) shows without one.
fn names(addrs: impl Iterator<Item = IpAddr>) -> HashMap<IpAddr, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    for ip in addrs {
        let tx = tx.clone();
        std::thread::spawn(move || tx.send((ip, dns_lookup::lookup_addr(&ip).ok()?)).ok());
    }
    drop(tx);
    let deadline = Instant::now() + Duration::from_secs(1);
    let left = || deadline.checked_duration_since(Instant::now());
    std::iter::from_fn(|| rx.recv_timeout(left()?).ok())
        // getnameinfo gives the address back when there is no name.
        .filter(|(ip, name)| *name != ip.to_string())
        .collect()
}

/// The reply for a person: the verdict line, then the drain (with `holders`, the drain
/// record's on this host) and what the load balancers made of it, and the probe.
pub fn describe(reply: &Reply, holders: &[Holder], roll: Option<&str>) -> String {
    let Ok(status) = Status::from_json(&reply.body) else {
        return format!("HTTP {}: {}", reply.status, reply.body.trim());
    };
    let answer = &status.answer;
    let mut rows = vec![("drain", drain_line(answer))];
    if holders.iter().any(|h| h.kind != Kind::Drain) {
        let held: Vec<String> = holders.iter().map(Holder::describe).collect();
        rows.push(("holders", held.join("; ")));
    }
    rows.extend(roll.map(|roll| ("roll", roll.to_owned())));
    let probe = &answer.probe;
    let took = |v: Option<u64>| v.map_or("-".to_owned(), |n| format!("{n} ms"));
    let ok = if probe.healthy() { "ok" } else { "failed" };
    let (latency, age) = (took(probe.latency_ms), took(probe.age_ms));
    let (detail, endpoint) = (&probe.detail, probe.endpoint.as_deref().unwrap_or(""));
    let line = format!("{ok} - {detail} (took {latency}, {age} ago) {endpoint}");
    rows.push(("probe", line));
    rows.extend(answer.pool.as_ref().map(|p| ("pool", pool_line(answer, p))));
    rows.extend(status.held().iter().map(|held| ("held", held.line())));
    // Two load balancers answering as one hold every drain, drained or not: what to change.
    let two = (status.holding().into_iter()).filter(|b| b.held == Held::TwoViews);
    rows.extend(two.map(|b| ("views", format!("{}; {}", b.said(), b.ends()))));
    rows.push(("weight", weight(&status)));
    rows.extend(pollers(&status.pollers));
    rows.extend(status.lb_key_file.as_ref().map(|k| ("keys", key_file(k))));
    rows.extend(status.traffic.as_ref().map(|t| ("agents", traffic(t))));
    rows.extend((status.certificates.as_ref()).map(|c| ("certs", certificates(c))));
    let code = status.code.as_deref().filter(|c| !c.is_empty());
    let code = code.map(|c| c.iter().map(deployment).collect::<Vec<_>>().join("; "));
    rows.extend(code.map(|code| ("code", code)));
    rows.push(("next", next_step(&status)));
    let (verdict, reason) = (answer.verdict.as_str(), &answer.reason);
    let mut out = format!("{verdict} (HTTP {}) - {reason}\n", reply.status);
    for (label, text) in rows {
        let _ = writeln!(out, "{:<8}{text}", format!("{label}: "));
    }
    out
}

/// The `lb:` lines and the `others:` line: people and scripts are listed apart. An address
/// goes by the name a proven load balancer's own view gives it (HAProxy's `node`), as the
/// waits name it, wherever it shows (its curl too: one address, one name); else by reverse DNS.
fn pollers(pollers: &[PollerAnswer]) -> Vec<(&'static str, String)> {
    let nodes: HashMap<IpAddr, String> = (pollers.iter())
        .filter_map(|p| Some((p.address, p.node()?.to_owned())))
        .collect();
    let names = names((pollers.iter().map(|p| p.address)).filter(|a| !nodes.contains_key(a)));
    let named =
        |p: &PollerAnswer| named(p, pollers, nodes.get(&p.address).or(names.get(&p.address)));
    let mut rows: Vec<_> = (pollers.iter())
        .filter(|p| p.is_load_balancer() && listed(p))
        .map(|p| ("lb", format!("{}: {}", named(p), load_balancer(p))))
        .collect();
    let others: Vec<String> = (pollers.iter())
        .filter(|p| !p.is_load_balancer())
        .map(|p| {
            let client = (p.client.as_deref()).map_or(String::new(), |c| format!("{c}, "));
            format!("{} ({client}{})", named(p), p.describe_told(true))
        })
        .collect();
    if !others.is_empty() {
        let others = others.join("; ");
        rows.push(("others", format!("{others} (people and scripts)")));
    }
    rows
}

fn drain_line(answer: &Answer<'_>) -> String {
    let Some(drain) = &answer.drain else {
        // An unreadable record is not "not drained": the node answers UNKNOWN (fail closed).
        return match answer.reason.strip_prefix(DRAIN_UNKNOWN) {
            Some(why) => format!("cannot tell, so UNKNOWN (503): {why}"),
            None => "not drained".to_owned(),
        };
    };
    let mut line = (drain.reason.as_deref().unwrap_or("(no valid record)")).to_owned();
    let values = [&drain.by, &drain.since, &drain.until];
    for (label, value) in ["by", "since", "until"].into_iter().zip(values) {
        line.extend(value.as_ref().map(|value| format!(", {label} {value}")));
    }
    if drain.expired {
        line.push_str(" - EXPIRED, no longer counts; `pmcheck undrain` removes it");
    }
    line.extend((drain.problem.as_ref()).map(|problem| format!(" ({problem})")));
    line
}

/// The pool as Puppet Server last reported it.
fn pool_line(answer: &Answer<'_>, pool: &Pool) -> String {
    let load = answer.load.map_or("cannot compile", |l| match l {
        Load::Warm => "warm",
        Load::Warming => "warming",
        Load::Busy => "busy",
        Load::Paused => "paused (answered OK at the floor weight, for at most --pause-grace)",
    });
    let units = match pool.multithreaded {
        true => "borrow slots of one multithreaded JRuby",
        false => "JRubies",
    };
    format!(
        "{load}: {} of {} {units} free, {} compiling, {} waiting; average wait {} ms, \
         borrow {} ms; {} refused at the queue limit, {} borrow timeouts; lock {}",
        pool.free,
        pool.size,
        pool.borrowed,
        pool.waiting,
        pool.average_wait_ms,
        pool.average_borrow_ms,
        pool.queue_limit_hits,
        pool.borrow_timeouts,
        pool.lock,
    )
}

/// The agent connections to Puppet Server, or why they cannot be told.
fn traffic(t: &TrafficAnswer) -> String {
    if let Some(problem) = &t.problem {
        return format!("cannot tell: {problem}");
    }
    let n = t.total;
    if n == 0 {
        return format!("no connection to {}", t.listener);
    }
    let shown = t.connections.len();
    let mut from: Vec<String> = t.connections.iter().map(ToString::to_string).collect();
    from.extend((n > shown).then(|| format!("and {} more", n - shown)));
    let from = from.join(", ");
    format!("{n} connection(s) to {} from {from}", t.listener)
}

/// The weight with its cause; when the load balancers that made agent checks all stopped, it
/// is read by none.
fn weight(status: &Status<'_>) -> String {
    let answer = &status.answer;
    if !status.agent_check {
        return "none sent: this daemon has no agent port (--agent-listen), so HAProxy uses its \
                own weight"
            .to_owned();
    }
    let w = answer.weight;
    let sent = match answer.weight_cause {
        _ if answer.verdict == Verdict::Drained => {
            "none sent while drained: the agent line says `drain` and carries no weight".to_owned()
        }
        WeightCause::NotOk => format!("{w}%, the floor: {} is not OK", answer.verdict.as_str()),
        WeightCause::Ramp { full_in_ms } => format!(
            "{w}%, ramping up after coming back (--slow-start): 100% in {}",
            ms(full_in_ms)
        ),
        WeightCause::Pool => format!("{w}%: the share of Puppet Server's JRuby pool that is free"),
        WeightCause::Paused => format!("{w}%, the floor: the JRuby pool is paused"),
        WeightCause::Full => format!("{w}%: all of the configured weight"),
    };
    let agents: Vec<&PollerAnswer> = (status.pollers.iter())
        .filter(|p| p.proof.proven() && p.agent.is_some())
        .collect();
    if agents.is_empty() || agents.iter().any(|p| p.agent_now().is_some()) {
        return sent;
    }
    let stopped: Vec<String> = (agents.iter())
        .filter_map(|p| Some((p.address, p.agent_stopped_ms_ago?)))
        .map(|(address, ago)| format!("{address}'s {} ago", ms(ago)))
        .collect();
    let stopped = stopped.join(", ");
    format!("{sent}, but no load balancer reads it now: their agent checks stopped ({stopped})")
}

/// A load balancer is listed while it checks, and for a minute after its last check (said
/// `stopped checking`): one seen once, or gone, does not stay on top of the list.
fn listed(p: &PollerAnswer) -> bool {
    const STOPPED_FOR: u64 = 60_000;
    p.polling || p.last_ms_ago <= STOPPED_FOR
}

/// A poller by its address and name; by its key's line too where two load balancers at one
/// address are told apart by their keys.
fn named(p: &PollerAnswer, all: &[PollerAnswer], name: Option<&String>) -> String {
    let proven_here = |q: &&PollerAnswer| q.address == p.address && q.proof.proven();
    let key = (p.key_line)
        .filter(|_| all.iter().filter(proven_here).count() > 1)
        .map(|k| format!("key line {k}"));
    let words: Vec<String> = name.cloned().into_iter().chain(key).collect();
    match words[..] {
        [] => p.address.to_string(),
        _ => format!("{} ({})", p.address, words.join(", ")),
    }
}

/// What one load balancer did, from its own view when it sends it (`http-check send-state`).
/// A poller that does not prove it is a load balancer is shown for what it claims, and that
/// nothing acts on it.
fn load_balancer(p: &PollerAnswer) -> String {
    let told = p.describe_told(false);
    let last = ms(p.last_ms_ago);
    let view = match (p.states.is_empty(), p.states_stopped_ms_ago) {
        (true, Some(stopped)) => format!(
            "{told}, last {last} ago (it stopped sending its own view {} ago: its checks since \
             carry no `http-check send-state`; judged by what they were told)",
            ms(stopped)
        ),
        (true, None) => format!(
            "{told}, last {last} ago (it does not send its own view: add `http-check send-state`)"
        ),
        _ => {
            let views: Vec<String> = p.states.iter().map(|st| state_view(p, st)).collect();
            format!("{}; {told}", views.join("; "))
        }
    };
    if p.proof.proven() {
        return view;
    }
    format!(
        "UNVERIFIED, {}: neither the waits nor the last-server guard believe it; it says: {view}",
        p.proof.describe().trim_start_matches("unverified: ")
    )
}

/// What one load balancer did with one server line, as its header says.
fn state_view(p: &PollerAnswer, st: &StateAnswer) -> String {
    let Some(seen) = &st.seen else {
        let why = st.malformed.as_deref().unwrap_or("malformed");
        return format!("sent a state pmcheck cannot read ({why})");
    };
    // The load balancer is named by its node already; another one's is said.
    let node = (Some(seen.node.as_str()))
        .filter(|node| !node.is_empty() && Some(*node) != p.node())
        .map_or(String::new(), |node| format!(" on {node}"));
    // An agent drain keeps HAProxy's word UP and takes the server out of the backend's
    // weight, which the header's weights show only when the others weigh less: the agent
    // check's own answer tells.
    let agent_drained = p.agent_now().is_some_and(|a| a.told == Verdict::Drained);
    let did = match seen.health {
        Health::Up if agent_drained => {
            "holds it in DRAIN (its agent check said `drain`): no new agents"
        }
        Health::Up if seen.counted() => "sends it agents",
        Health::Up => "keeps it out of the backend's weight (drain)",
        Health::Nolb => "took it out (NOLB): no new agents",
        Health::Down => "took it out (DOWN)",
        Health::NoCheck => "does not check it",
    };
    // `UP 2/3`: failing its checks, DOWN after 2 more; `DOWN 1/3`: passing them, UP after 2
    // more (HAProxy's fall and rise).
    let turning = match (seen.health, seen.transition) {
        (Health::Up, Some((n, _))) => format!(", and it fails its checks: DOWN after {n} more"),
        (Health::Down, Some((n, m))) => {
            let left = m.saturating_sub(n);
            format!(", and it passes its checks: UP after {left} more")
        }
        _ => String::new(),
    };
    let sessions = match seen.scur {
        0 => "no session left".to_owned(),
        n => format!("still {n} session(s)"),
    };
    let (backend, server, told) = (&seen.backend, &seen.server, st.told.as_str());
    let (since, last) = (ms(st.since_ms_ago), ms(st.last_ms_ago));
    format!(
        "{backend}/{server}{node} {did}{turning}, {sessions}; told {told} for {since} (as of \
         {last} ago)"
    )
}

/// What to do next, in one line: the daemon's progress decides "safe"; a daemon of another
/// version sends none, and is named.
fn next_step(status: &Status<'_>) -> String {
    let said = match (status.answer.verdict, &status.progress) {
        (Verdict::Ok, _) => "serving: `pmcheck drain --reason ... --wait` takes it out for work",
        (Verdict::Starting, _) => "wait for the first probe (a second or two)",
        (Verdict::Down | Verdict::NotReady, _) => {
            "Puppet Server cannot take agents: see the probe line; `journalctl -u puppetserver`"
        }
        (Verdict::Unknown, _) => {
            "pmcheck cannot tell: fix what the reason names (`pmcheck config --check`)"
        }
        (Verdict::Drained, None) => {
            let theirs = Some(status.version.as_str()).filter(|v| !v.is_empty());
            return format!(
                "the daemon is {}, this command {}: it sends no progress, so whether it is safe to stop Puppet Server cannot be read; run one version (`systemctl restart pmcheck` after an upgrade)",
                theirs.unwrap_or("an older version"),
                crate::protocol::VERSION
            );
        }
        (Verdict::Drained, Some(p)) if !p.drain.held.is_empty() => {
            "drained, but held where a load balancer says this node is its backend's last server (the held: line): do not stop Puppet Server; the drain takes effect once another server takes agents there, `pmcheck drain --force` takes it out now"
        }
        (Verdict::Drained, Some(p)) if p.safe_to_stop => {
            "drained and every load balancer has acted: safe to stop Puppet Server; \
             `pmcheck undrain` puts it back"
        }
        (Verdict::Drained, Some(p)) => {
            return format!(
                "drained, not yet safe to stop Puppet Server ({}); `pmcheck drain --wait` \
                 returns when it is; `pmcheck undrain` puts it back",
                p.drain.missing()
            );
        }
    };
    said.to_owned()
}

/// The daemon's load balancer key file: UNUSABLE and why, or each key's addresses, and what
/// is weak about it.
fn key_file(k: &KeyFileAnswer) -> String {
    if let Some(problem) = &k.problem {
        return format!(
            "UNUSABLE: {problem}; no load balancer proves its word meanwhile: drain and cycle refuse without --force"
        );
    }
    let keys: Vec<String> = (k.keys.iter())
        .map(|key| format!("line {}: {}", key.line, key.addresses()))
        .collect();
    let mut line = keys.join("; ");
    line.extend((k.rejected.as_ref()).map(|rejected| {
        format!("\n        REJECTED at the latest reload, the keys above kept: {rejected}")
    }));
    line.extend(k.warnings.iter().map(|w| format!("\n        warning: {w}")));
    line
}

/// Each certificate's end and the CRL's nextUpdate, with the days left.
fn certificates(c: &CertificatesAnswer) -> String {
    let mut parts: Vec<String> = (c.certs.iter())
        .map(|e| {
            let (file, subject, position, end) = (&e.file, &e.subject, &e.position, &e.not_after);
            let left = days_left(e.days_left);
            format!("{file} {subject} ({position}) until {end}, {left}")
        })
        .collect();
    if let Some(crl) = &c.crl {
        let issuer = &crl.issuer;
        parts.push(match (&crl.next_update, crl.days_left) {
            (Some(next), Some(days)) => {
                let left = days_left(days);
                format!("hostcrl of {issuer} due for its nextUpdate {next}, {left}")
            }
            _ => format!("hostcrl of {issuer} (no nextUpdate)"),
        });
    }
    parts.extend(c.unreadable.iter().cloned());
    parts.join("; ")
}

/// One environment's deploy, by the state the daemon read (`deployed`, `failed`, ...), and
/// what Puppet Enterprise's file sync says of the environment, when it says anything.
fn deployment(c: &CodeAnswer) -> String {
    let sync = match (&c.file_sync_status, &c.file_sync_commit) {
        (Some(status), Some(commit)) => format!(", file sync {status} {}", short(commit)),
        (Some(status), None) => format!(", file sync {status}"),
        _ => String::new(),
    };
    let (env, path) = (&c.environment, c.path.as_deref().unwrap_or("?"));
    match c.state.as_str() {
        "deployed" | "failed" => {
            let commit = (c.commit.as_deref()).map_or_else(|| "(no commit)".into(), short);
            let when = match (&c.finished_at, c.age_seconds) {
                (Some(at), Some(age)) => format!(" {at} ({} ago)", age_words(age)),
                _ => String::new(),
            };
            let failed = match c.state.as_str() {
                "failed" => ", FAILED (deploy_success false: older code may be live)",
                _ => "",
            };
            format!("{env} {commit} deployed{when}{failed}{sync}")
        }
        "no_environment" => format!("{env}: no such environment on the environmentpath{sync}"),
        "no_record" => format!("{env}: no deploy record ({path} is absent){sync}"),
        _ => {
            let why = c.why.as_deref().unwrap_or("?");
            format!("{env}: deploy record {path} unreadable: {why}")
        }
    }
}

/// A commit's first 12 characters, as git abbreviates it in words.
fn short(commit: &str) -> String {
    commit.chars().take(12).collect()
}

/// An age in whole seconds, minutes or hours, as far as it matters: `40s`, `11m`, `1day 3h`.
fn age_words(age: i64) -> String {
    let secs = age.max(0).unsigned_abs();
    let unit = match secs {
        0..60 => 1,
        60..86_400 => 60,
        _ => 3_600,
    };
    humantime::format_duration(Duration::from_secs(secs / unit * unit)).to_string()
}

/// `in 3.5 days`, or `PAST by 2.0 days`.
fn days_left(days: f64) -> String {
    match days < 0.0 {
        true => format!("PAST by {:.1} days", -days),
        false => format!("in {days:.1} days"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_balancer_is_listed_until_a_minute_after_its_last_check() {
        let json = r#"{"address":"10.0.0.5","proof":"no-key","first_ms_ago":540000,
            "last_ms_ago":540000,"polls":1,"http":null,"agent":null,"regular":false,"polling":false}"#;
        let mut p: PollerAnswer = serde_json::from_str(json).unwrap();
        assert!(!listed(&p), "seen once, nine minutes ago");
        p.last_ms_ago = 59_000;
        assert!(listed(&p), "stopped checking a moment ago");
        (p.last_ms_ago, p.polling) = (540_000, true);
        assert!(listed(&p), "polling by its own rhythm");
    }
}
