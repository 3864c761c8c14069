//! Pollers that prove nothing ([`crate::settings::lb_proof`]), as the daemon's progress
//! ([`crate::responder::progress`]) waits for them: by time, as long as HAProxy's checks take,
//! until every load balancer of the key file proves itself; then one that sends no key from
//! elsewhere is none of them.

use std::net::IpAddr;
use std::time::Duration;

use crate::health::verdict::Verdict;
use crate::protocol::progress::{Ask, Stage};
use crate::protocol::{PollerAnswer, Status};
use crate::text::{ms, seconds};

/// A poller that does not prove it is a load balancer ([`crate::settings::lb_proof`]) may be
/// one whose configuration lacks the key: it has acted once the daemon has told it `verdict`
/// for as long as HAProxy's `fall` (or `rise`) checks take, `--polls` x `--lb-interval`. What
/// it claims cannot end the wait earlier nor hold it longer.
pub(crate) fn by_time(
    a: &mut Stage,
    p: &PollerAnswer,
    verdict: Verdict,
    ask: &Ask,
    bound: Option<&Bound>,
) {
    let needed = ask.lb_interval * ask.polls;
    let told = (p.http.iter().chain(&p.agent_now()))
        .filter(|t| t.told == verdict)
        .map(|t| Duration::from_millis(t.since_ms_ago))
        .max();
    let what = format!("{} ({})", p.address, p.proof.describe());
    match told {
        Some(since) if since >= needed => {
            a.met.push(format!(
                "{what} told {} for {}: as long as {} checks {} apart take",
                verdict.as_str(),
                seconds(since),
                ask.polls,
                seconds(ask.lb_interval)
            ));
            // It may have acted as late as when that long was up.
            a.acted_by(p.address, ms(since.saturating_sub(needed)));
        }
        told => a.pend_of(Some(p.address), told.map(ms), format!(
            "{what} told {} for {} of the {} that {} checks {} apart take (its own word is not believed){}",
            verdict.as_str(),
            seconds(told.unwrap_or_default()),
            seconds(needed),
            ask.polls,
            seconds(ask.lb_interval),
            p.client.as_deref().map(|c| person(c, bound)).unwrap_or_default()
        )),
    }
}

/// What the wait says of an unproven poller that names its client (HAProxy's checks name
/// none), a person's or a script's most likely: what leaves it out of the waits.
fn person(client: &str, bound: Option<&Bound>) -> String {
    let until = match bound {
        None => " until every load balancer proves itself with a key (--lb-key-file)".to_owned(),
        Some(b) if !b.missing.is_empty() => format!(
            " until every address the key file binds proves itself (not yet: {})",
            b.missing.join("; ")
        ),
        Some(_) => ": this one polls from an address the key file binds, or sends a key not in it"
            .to_owned(),
    };
    format!(
        "; it names itself {client}: a poller that proves nothing is waited for as a load \
         balancer would be{until}"
    )
}

/// The load balancers of the key file: the host addresses its lines bind.
pub(crate) struct Bound {
    /// Every host address a line binds.
    pub(crate) hosts: Vec<IpAddr>,
    /// What keeps the file from naming every load balancer that checks: a line that binds no
    /// address or a network (anything there may be one), or a host that does not prove itself
    /// now.
    pub(crate) missing: Vec<String>,
}

/// The key file's load balancers, `None` without a usable key file. Once every one proves
/// itself, a poller that sends no key from elsewhere is none of them.
pub(crate) fn bound(status: &Status<'_>) -> Option<Bound> {
    let keys =
        (status.lb_key_file.as_ref()).filter(|k| k.problem.is_none() && !k.keys.is_empty())?;
    let proving = |ip: IpAddr| {
        (status.pollers.iter()).any(|p| p.polling && p.proof.proven() && p.address == ip)
    };
    let (mut hosts, mut missing) = (Vec::new(), Vec::new());
    for key in &keys.keys {
        if key.from.is_empty() {
            missing.push(format!("line {} binds no address", key.line));
        }
        for net in &key.from {
            match net.parse::<ipnet::IpNet>() {
                Ok(n) if n.prefix_len() == n.max_prefix_len() => {
                    if !proving(n.addr()) {
                        missing.push(format!("{} (line {})", n.addr(), key.line));
                    }
                    hosts.push(n.addr());
                }
                _ => missing.push(format!("line {} binds the network {net}", key.line)),
            }
        }
    }
    Some(Bound { hosts, missing })
}
