//! `pmcheck status`: asks the running daemon what it answers HAProxy, for a person.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::health::answer::Answer;
use crate::operator::daemon::Reply;
use crate::puppet::pool::Load;

/// The host names of `addrs` from reverse DNS, for a person. An address whose lookup fails or
/// takes longer than a second (all run at once) shows without one.
fn names(addrs: impl Iterator<Item = IpAddr>) -> HashMap<IpAddr, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    for ip in addrs {
        let tx = tx.clone();
        std::thread::spawn(move || {
            if let Ok(name) = dns_lookup::lookup_addr(&ip) {
                let _ = tx.send((ip, name));
            }
        });
    }
    drop(tx);
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut names = HashMap::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            // getnameinfo gives the address back when there is no name.
            Ok((ip, name)) if name != ip.to_string() => {
                names.insert(ip, name);
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    names
}

/// The reply for a person: the verdict line, then the drain and the probe.
pub fn describe(reply: &Reply) -> String {
    let Ok(answer) = Answer::from_json(&reply.body) else {
        return format!("HTTP {}: {}", reply.status, reply.body.trim());
    };
    let mut out = format!(
        "{} (HTTP {}) - {}\n",
        answer.verdict.as_str(),
        reply.status,
        answer.reason
    );
    match &answer.drain {
        None => out.push_str("drain:  not drained\n"),
        Some(drain) => {
            let mut line = format!(
                "drain:  {}",
                drain.reason.as_deref().unwrap_or("(no valid record)")
            );
            for (label, value) in [
                ("by", &drain.by),
                ("since", &drain.since),
                ("until", &drain.until),
            ] {
                if let Some(value) = value {
                    let _ = write!(line, ", {label} {value}");
                }
            }
            if drain.expired {
                line.push_str(" - EXPIRED, no longer counts; `pmcheck undrain` removes it");
            }
            if let Some(problem) = &drain.problem {
                let _ = write!(line, " ({problem})");
            }
            out.push_str(&line);
            out.push('\n');
        }
    }
    let probe = &answer.probe;
    let ms = |v: Option<u64>| v.map_or("-".to_owned(), |n| format!("{n} ms"));
    let _ = writeln!(
        out,
        "probe:  {} - {} (took {}, {} ago) {}",
        if probe.healthy() { "ok" } else { "failed" },
        probe.detail,
        ms(probe.latency_ms),
        ms(probe.age_ms),
        probe.endpoint.as_deref().unwrap_or("")
    );
    if let Some(pool) = &answer.pool {
        let load = answer.load.map_or("cannot compile", |l| match l {
            Load::Warm => "warm",
            Load::Warming => "warming",
            Load::Busy => "busy",
            Load::Paused => "paused (answered OK at the floor weight, for at most --pause-grace)",
        });
        let units = if pool.multithreaded {
            "borrow slots of one multithreaded JRuby"
        } else {
            "JRubies"
        };
        let _ = writeln!(
            out,
            "pool:   {load}: {} of {} {units} free, {} compiling, {} waiting; average wait {} ms, \
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
        );
    }
    let _ = writeln!(out, "weight: {}% (HAProxy agent check)", answer.weight);
    let pollers = answer.pollers.as_deref().unwrap_or_default();
    let names = names(pollers.iter().map(|p| p.address));
    for p in pollers {
        let name = names
            .get(&p.address)
            .map(|n| format!("{n} "))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "poller: {name}{}: {}",
            p.address,
            crate::operator::assessment::describe_told(p, true)
        );
    }
    if let Some(t) = &answer.traffic {
        let line = match (&t.problem, t.count()) {
            (Some(problem), _) => format!("cannot tell: {problem}"),
            (None, 0) => format!("no connection to {}", t.listener),
            (None, n) => {
                let mut from: Vec<String> = t.connections.iter().map(ToString::to_string).collect();
                if n > t.connections.len() {
                    from.push(format!("and {} more", n - t.connections.len()));
                }
                format!(
                    "{n} connection(s) to {} from {}",
                    t.listener,
                    from.join(", ")
                )
            }
        };
        let _ = writeln!(out, "agents: {line}");
    }
    out
}
