//! The poller table as the operator's `/status` from this host carries it
//! ([`crate::protocol::Status`], made by [`crate::responder::node::Node::answer`]).

use std::time::Instant;

use crate::protocol::{PollerAnswer, StateAnswer};
use crate::responder::pollers::Pollers;
use crate::text::ms;

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
                // Its agent checks fell silent while its HTTP checks go on: `agent-check` is
                // gone from its server line, and the weight the agent check sends is not read.
                agent_stopped_ms_ago: (p.agent)
                    .filter(|a| !a.polling(now) && p.http.is_some_and(|h| h.polling(now)))
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
