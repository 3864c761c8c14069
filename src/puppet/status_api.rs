//! Puppet Server's status API as the probe reads it: which paths to try in turn, the
//! `?timeout=` it is given, and how an answer (a service status in JSON, or the `simple`
//! status's one word) is read.

use std::time::Duration;

use crate::puppet::pool::{Pool, ServiceStatus, Unready};
use crate::puppet::probe_error::{ProbeError, shown};
use crate::text;

/// The pool's status service of open source Puppet Server.
pub const DEFAULT_STATUS_PATH: &str = crate::settings::defaults::STATUS_PATH;
/// Where a probe goes next when a path answers 404 `not found` / `service-not-found`: the
/// pool service under Puppet Enterprise's name, the simple status of Puppet Server >= 6.14,
/// then that of older servers (what the Puppet agent falls back to).
pub const FALLBACKS: [&str; 4] = [
    DEFAULT_STATUS_PATH,
    "/status/v1/services/pe-jruby-metrics",
    "/status/v1/simple/server",
    "/status/v1/simple/master",
];
/// The status service's own status, whose `debug` level says when the JVM started.
pub const JVM_STATUS_PATH: &str = "/status/v1/services/status-service";

/// `status.experimental.jvm-metrics.start-time-ms` of a status-service answer.
pub(crate) fn jvm_start_time(body: &[u8]) -> Option<u64> {
    let answer: serde_json::Value = serde_json::from_slice(body).ok()?;
    answer
        .pointer("/status/experimental/jvm-metrics/start-time-ms")?
        .as_u64()
}

/// Puppet Server's own `?timeout=` (whole seconds, at least 1), kept below our deadline so the
/// server gives up before we do and answers instead of leaving the request hanging.
pub fn server_timeout(deadline: Duration) -> u64 {
    (deadline.as_secs_f64().ceil() as u64)
        .saturating_sub(1)
        .max(1)
}

/// The path after `path` in [`FALLBACKS`]; none for a path of the operator's own.
pub(crate) fn next_path(path: &str) -> Option<&'static str> {
    let at = FALLBACKS.iter().position(|p| *p == path)?;
    FALLBACKS.get(at + 1).copied()
}

/// What one status answer said.
#[derive(Debug, PartialEq)]
pub(crate) enum Seen {
    /// `running`, with the pool when the answer carried it.
    Running(Option<Pool>),
    /// Up, but not able to compile yet.
    Unready(Unready),
    /// The status service's own 404 for this path: try the next one.
    NotFound,
}

/// Reads a status answer: a service status in JSON (the pool service), or the `simple`
/// status's one word, whichever Puppet Server sent.
pub(crate) fn read_answer(status: u16, text: &str) -> Result<Seen, ProbeError> {
    let state = |state: &str| match state {
        "running" => None,
        "starting" | "stopping" => Some(Ok(Seen::Unready(Unready::State(state.to_owned())))),
        other => Some(Err(ProbeError::NotRunning(
            text::one_line(other, 64).into_owned(),
        ))),
    };
    if text.starts_with('{') {
        if status == 404 && text.contains("service-not-found") {
            return Ok(Seen::NotFound);
        }
        return match serde_json::from_str::<ServiceStatus>(text) {
            Ok(service) => match state(&service.state) {
                None if status == 200 => match service.pool() {
                    Ok(pool) => Ok(Seen::Running(pool)),
                    Err(problem) => Err(ProbeError::Unreadable { status, problem }),
                },
                None => Err(ProbeError::Status {
                    status,
                    body: shown(text),
                }),
                Some(seen) => seen,
            },
            Err(e) => Err(ProbeError::Unreadable {
                status,
                problem: text::one_line(&e.to_string(), 120).into_owned(),
            }),
        };
    }
    match status {
        200 if text == "running" => Ok(Seen::Running(None)),
        200 | 503 if !text.is_empty() && text.len() < 64 && !text.contains('<') => state(text)
            .unwrap_or_else(|| {
                Err(ProbeError::Status {
                    status,
                    body: shown(text),
                })
            }),
        404 if text.starts_with("not found") => Ok(Seen::NotFound),
        404 if text.starts_with('<') => Ok(Seen::Unready(Unready::RoutesMissing)),
        _ => Err(ProbeError::Status {
            status,
            body: shown(text),
        }),
    }
}
