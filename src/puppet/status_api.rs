//! Puppet Server's status API as the probe reads it: which paths to try in turn, the
//! `?timeout=` it is given, and how an answer (a service status in JSON, or the `simple`
//! status's one word) is read.

use std::time::Duration;

use crate::puppet::pool::{Pool, ServiceStatus, Unready};
use crate::puppet::probe_error::{ProbeError, shown};
use crate::text;

/// Where a probe goes next when a path answers 404 `not found` / `service-not-found`: from
/// open source Puppet Server's pool service (the default), the pool service under Puppet
/// Enterprise's name, the simple status of Puppet Server >= 6.14, then that of older servers
/// (what the Puppet agent falls back to).
pub const FALLBACKS: [&str; 4] = [
    crate::settings::defaults::STATUS_PATH,
    "/status/v1/services/pe-jruby-metrics",
    "/status/v1/simple/server",
    "/status/v1/simple/master",
];
/// The status service's own status, whose `debug` level says when the JVM started.
pub const JVM_STATUS_PATH: &str = "/status/v1/services/status-service";

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
    let unexpected = || ProbeError::Status {
        status,
        body: shown(text),
    };
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
                None if status == 200 => (service.pool().map(Seen::Running))
                    .map_err(|problem| ProbeError::Unreadable { status, problem }),
                None => Err(unexpected()),
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
        200 | 503 if !text.is_empty() && text.len() < 64 && !text.contains('<') => {
            state(text).unwrap_or_else(|| Err(unexpected()))
        }
        404 if text.starts_with("not found") => Ok(Seen::NotFound),
        404 if text.starts_with('<') => Ok(Seen::Unready(Unready::RoutesMissing)),
        _ => Err(unexpected()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::puppet::pool::Unready;
    use crate::puppet::probe_error::ProbeError;
    use std::time::Duration;

    #[test]
    fn server_timeout_stays_below_the_deadline() {
        assert_eq!(server_timeout(Duration::from_millis(1500)), 1);
        assert_eq!(server_timeout(Duration::from_secs(2)), 1);
        assert_eq!(server_timeout(Duration::from_millis(2500)), 2);
        assert_eq!(server_timeout(Duration::from_secs(30)), 29);
        assert_eq!(
            server_timeout(Duration::from_millis(200)),
            1,
            "Puppet needs at least 1"
        );
    }

    #[test]
    fn service_status_answers_are_read_by_state_and_pool() {
        let captured =
            include_str!("../../tests/fixtures/puppetserver-7.9.5-status-services-debug.json");
        let all: serde_json::Value = serde_json::from_str(captured).unwrap();
        let service = all["jruby-metrics"].to_string();
        match read_answer(200, &service) {
            Ok(Seen::Running(Some(pool))) => assert_eq!((pool.size, pool.free), (1, 1)),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            read_answer(503, r#"{"state":"starting","status":{}}"#).unwrap(),
            Seen::Unready(Unready::State("starting".into()))
        );
        assert_eq!(
            read_answer(503, r#"{"state":"error","status":{}}"#)
                .unwrap_err()
                .to_string(),
            "Puppet Server reports `error`, not `running`"
        );
        assert_eq!(
            read_answer(200, r#"{"state":"running","status":{}}"#).unwrap(),
            Seen::Running(None),
            "no debug details: running, without numbers"
        );
        let not_found = r#"{"kind":"service-not-found","msg":"No status information found for service jruby-metrics"}"#;
        assert_eq!(read_answer(404, not_found).unwrap(), Seen::NotFound);
        assert!(matches!(
            read_answer(200, r#"{"unexpected":true}"#),
            Err(ProbeError::Unreadable { status: 200, .. })
        ));
    }

    #[test]
    fn simple_answers_are_read_by_their_word() {
        assert_eq!(read_answer(200, "running").unwrap(), Seen::Running(None));
        assert_eq!(
            read_answer(503, "stopping").unwrap(),
            Seen::Unready(Unready::State("stopping".into()))
        );
        assert!(matches!(
            read_answer(503, "error"),
            Err(ProbeError::NotRunning(state)) if state == "error"
        ));
        assert!(matches!(
            read_answer(503, "running"),
            Err(ProbeError::Status { status: 503, .. })
        ));
        assert_eq!(
            read_answer(404, "not found: server").unwrap(),
            Seen::NotFound
        );
        assert_eq!(
            read_answer(404, "<html><body>HTTP ERROR 404</body></html>").unwrap(),
            Seen::Unready(Unready::RoutesMissing)
        );
    }

    #[test]
    fn fallbacks_run_in_order_and_stop_at_the_end_or_at_a_path_of_ones_own() {
        assert_eq!(next_path(FALLBACKS[0]), Some(FALLBACKS[1]));
        assert_eq!(
            next_path("/status/v1/simple/server"),
            Some("/status/v1/simple/master")
        );
        assert_eq!(next_path("/status/v1/simple/master"), None);
        assert_eq!(next_path("/behind/a/proxy"), None);
    }
}
