//! The operator's `/status` from this host ([`crate::protocol::Status`]): the answer, the
//! poller table, the agents, the slow readings and the progress, all as of one decision.

use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response};

use crate::health::Now;
use crate::health::answer::json_line;
use crate::health::decision::Decision;
use crate::protocol::progress::Ask;
use crate::protocol::{CertificatesAnswer, CodeAnswer, PollerAnswer, StateAnswer, Status, VERSION};
use crate::puppet::expiry;
use crate::responder::http::respond_with;
use crate::responder::node::Node;
use crate::responder::pollers::Pollers;
use crate::responder::progress::progress;
use crate::text::ms;

impl Node {
    /// The operator's JSON: the answer, the pollers, the agents and the slow readings, all as
    /// of the moment the decision was made.
    pub(crate) fn operator_json(
        &self,
        decision: &Decision<'_>,
        now: Now,
        method: &Method,
        ask: &Ask,
    ) -> Response<Full<Bytes>> {
        let mut status = Status {
            version: VERSION.to_owned(),
            answer: decision.answer(),
            agent_check: self.rules.agent_check,
            pollers: self.pollers.answer(now.at),
            traffic: self.agents.latest(now.at),
            listening_ms: ms(now.at.saturating_duration_since(self.started)),
            drain_file: self.drain_file.clone(),
            unrecorded: self.pollers.unrecorded(now.at),
            // The slow readings as last read (none in inetd mode).
            certificates: (self.readings.expiries())
                .map(|l| CertificatesAnswer::of(&l, expiry::now())),
            code: (self.readings.code()).map(|l| CodeAnswer::of(&l, expiry::now())),
            lb_key_file: self.proof().answer(),
            probe_stale_ms: ms(self.rules.stale_after),
            progress: None,
        };
        status.progress = Some(progress(&status, ask));
        respond_with(decision, method, json_line(&status))
    }
}

impl Pollers {
    /// The poller table as the operator's JSON carries it.
    pub fn answer(&self, now: Instant) -> Vec<PollerAnswer> {
        let ago = |t: Instant| ms(now.saturating_duration_since(t));
        self.list(now)
            .into_iter()
            .map(|p| PollerAnswer {
                address: p.address,
                proof: p.proof,
                key_line: p.key_line,
                first_ms_ago: ago(p.first),
                last_ms_ago: ago(p.last),
                polls: p.polls,
                http: p.http.map(|t| t.answer(now)),
                agent: p.agent.map(|t| t.answer(now)),
                regular: p.regular(now),
                polling: p.polling(now),
                client: p.client.map(|c| c.as_str().to_owned()),
                agent_stopped_ms_ago: (p.agent)
                    .filter(|_| p.agent_stopped(now))
                    .map(|t| ago(t.last)),
                states_stopped_ms_ago: (p.lines.iter().flatten())
                    .filter(|l| p.stopped(l, now))
                    .map(|l| ago(l.at))
                    .min(),
                states: (p.lines.iter().flatten())
                    .filter(|l| !p.stopped(l, now))
                    .map(|l| {
                        let (seen, malformed) = match l.read() {
                            Ok(state) => (Some(state), None),
                            Err(e) => (None, Some(e.to_string())),
                        };
                        StateAnswer {
                            last_ms_ago: ago(l.at),
                            told: l.told,
                            since_ms_ago: ago(l.since),
                            polling: l.polling(now),
                            held: l.held,
                            holds: seen.as_ref().and_then(|lb| l.holds(lb, l.at, now)),
                            agent: l.agent.map(|t| t.answer(now)),
                            seen,
                            malformed,
                        }
                    })
                    .collect(),
            })
            .collect()
    }
}
