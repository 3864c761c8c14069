//! The daemon's slow readings in words, for `pmcheck status`: the certificates' and the CRL's
//! ends, and each environment's deploy.

use std::time::Duration;

use crate::protocol::{CertificatesAnswer, CodeAnswer};

/// Each certificate's end and the CRL's nextUpdate, with the days left.
pub fn certificates(c: &CertificatesAnswer) -> String {
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

/// Each environment's deploy: commit, when, and whether it succeeded; or why none is shown.
pub fn deployments(code: &[CodeAnswer]) -> String {
    code.iter().map(deployment).collect::<Vec<_>>().join("; ")
}

/// One environment's deploy, by the state the daemon read (`deployed`, `failed`, ...).
fn deployment(c: &CodeAnswer) -> String {
    let (env, sync) = (&c.environment, file_sync(c));
    let path = c.path.as_deref().unwrap_or("?");
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

/// What Puppet Enterprise's file sync says of the environment, when it says anything.
fn file_sync(c: &CodeAnswer) -> String {
    match (&c.file_sync_status, &c.file_sync_commit) {
        (Some(status), Some(commit)) => format!(", file sync {status} {}", short(commit)),
        (Some(status), None) => format!(", file sync {status}"),
        _ => String::new(),
    }
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
