//! The node's shared state: one per daemon (or per inetd poll), shared by every listener and
//! connection, read by the HTTP answers ([`crate::responder::http`]) and the agent check.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::watch;

use crate::drain::file::DrainFile;
use crate::drain::record::{Drain, DrainState};
use crate::drain::watch::Drains;
use crate::health::Now;
use crate::health::answer::{CertificatesAnswer, CodeAnswer};
use crate::health::decision::{Decision, Rules};
use crate::health::verdict::Verdict;
use crate::health::weight::Rejoin;
use crate::health::{hold, lb_state};
use crate::puppet::expiry;
use crate::puppet::readings::Readings;
use crate::puppet::report::{Latest, ProbeReport};
use crate::responder::agent;
use crate::responder::agents::Agents;
use crate::responder::http::{
    METRICS_PATH, STATUS_PATH, deprecated, from_pmcheck, method_not_allowed, plain, respond,
    respond_with, wants_json, with_body,
};
use crate::responder::metrics::Metrics;
use crate::responder::metrics::{self, Current};
use crate::responder::pollers::{Poll, Pollers, Via};
use crate::settings::lb_proof::{self, LbProof, Proof};

/// The moment a decision is made at: the one place the responder reads both clocks for one.
pub(crate) fn now() -> Now {
    Now {
        at: Instant::now(),
        wall: SystemTime::now(),
    }
}

/// Who asks for a decision, for the drain's gate ([`crate::health::hold`]).
#[derive(Debug, Clone, Copy)]
pub enum Asker<'a> {
    /// Anybody: the operator, Prometheus, a check that proves nothing.
    Anyone,
    /// A proven load balancer's HTTP check, with its `X-Haproxy-Server-State`.
    Check(&'a [u8]),
    /// An agent check from this address.
    Agent(IpAddr),
}

/// The drain state a held drain is decided with.
static NOT_DRAINED: DrainState = DrainState::NotDrained;

/// What the background tasks publish for the polls to read.
pub struct Feeds {
    /// The drain state, from the drain watcher.
    pub drain: Drains,
    /// The latest probe report, from the prober.
    pub latest: Latest,
    /// Where the node stands on its way back into the pool, from the rejoin tracker.
    pub rejoin: watch::Receiver<Rejoin>,
}

/// The node's shared state, what every poll reads: the latest drain state, probe report and
/// rejoin state, all kept up to date in the background, so a poll does no I/O beyond its
/// socket; and what the polls leave behind (pollers, counters).
pub struct Node {
    /// The drain state, kept current by the drain watcher.
    pub drain: Drains,
    /// The latest probe report, published by the prober.
    pub latest: Latest,
    /// Where the node stands on its way back into the pool, for the weight.
    pub rejoin: watch::Receiver<Rejoin>,
    /// The daemon's settings that shape an answer.
    pub rules: Rules,
    /// Who polls, and what each was told.
    pub pollers: Pollers,
    /// What a poll must show to count as a load balancer's.
    pub proof: LbProof,
    /// The agent connections to Puppet Server, for the operator's view.
    pub agents: Agents,
    /// The daemon's counters for `/metrics`; `None` in inetd mode, whose process lives for
    /// one poll and so has nothing to count.
    pub metrics: Option<Metrics>,
    /// The slow readings, kept by their readers (none in inetd mode either).
    pub readings: Readings,
    /// When the listeners started accepting: the poller table knows nothing from before.
    pub started: Instant,
    /// The drain record watched, for the operator's view
    /// ([`crate::drain::file::DrainFile::resolved`]).
    pub drain_file: String,
}

impl Node {
    /// The shared state of a node whose drain record is `drain_file` and whose Puppet Server
    /// listens on `puppet` (for the agent connections); `metrics` for a daemon, which counts.
    pub fn new(
        feeds: Feeds,
        rules: Rules,
        proof: LbProof,
        drain_file: &DrainFile,
        puppet: Option<SocketAddr>,
        metrics: bool,
    ) -> Self {
        Self {
            drain: feeds.drain,
            latest: feeds.latest,
            rejoin: feeds.rejoin,
            rules,
            pollers: Pollers::new(),
            proof,
            agents: Agents::new(puppet),
            metrics: metrics.then(Metrics::new),
            readings: Readings::default(),
            started: Instant::now(),
            drain_file: drain_file.resolved().display().to_string(),
        }
    }

    /// The latest probe report, without waiting for Puppet Server.
    pub fn latest(&self) -> Option<Arc<ProbeReport>> {
        self.latest.borrow().clone()
    }

    /// The agent check's line for `peer`, with what it tells (to note once the client has said
    /// what it sends, [`Node::agent_told`]).
    pub fn agent_line(&self, peer: IpAddr) -> (String, Verdict, Instant) {
        self.decide_for(Asker::Agent(peer), |decision, now| {
            (agent::line(decision), decision.verdict, now.at)
        })
    }

    /// Notes that the agent check from `peer`, which sent `sent` (HAProxy's `agent-send`), was
    /// told `verdict` at `at`.
    pub fn agent_told(&self, peer: IpAddr, sent: &[u8], verdict: Verdict, at: Instant) {
        let poll = Poll {
            address: peer,
            via: Via::Agent,
            verdict,
            state: None,
            client: None,
            proof: self.proof.judge(peer, Some(sent)),
        };
        self.count(poll, at, false);
    }

    /// Decides from the latest drain state, probe report and rejoin state, as of now.
    pub(crate) fn decide<R>(&self, then: impl FnOnce(&Decision<'_>, Now) -> R) -> R {
        self.decide_for(Asker::Anyone, then)
    }

    /// [`Node::decide`] for `asker`: a drain is held from a load balancer that says this node
    /// is its backend's last server ([`crate::health::hold`]).
    pub(crate) fn decide_for<R>(
        &self,
        asker: Asker<'_>,
        then: impl FnOnce(&Decision<'_>, Now) -> R,
    ) -> R {
        let now = now();
        let drain = Arc::clone(&self.drain.borrow());
        let probe = self.latest();
        let rejoin = *self.rejoin.borrow();
        let held = match &*drain {
            DrainState::Drained(d) => self.held(d, asker, now),
            _ => None,
        };
        let Some(why) = held else {
            return then(
                &Decision::decide(&drain, probe.as_deref(), rejoin, now, &self.rules),
                now,
            );
        };
        let mut decision =
            Decision::decide(&NOT_DRAINED, probe.as_deref(), rejoin, now, &self.rules);
        decision.reason = Cow::Owned(format!("{why}; {}", decision.reason));
        then(&decision, now)
    }

    /// Why `drain` is held from `asker`, if it is.
    fn held(&self, drain: &Drain, asker: Asker<'_>, now: Now) -> Option<String> {
        match asker {
            Asker::Anyone => None,
            Asker::Check(header) => {
                let lb = lb_state::parse(header).ok()?;
                hold::held(&lb, drain, now.wall).map(|h| h.describe(&lb))
            }
            // HAProxy applies an agent line as it reads it, with no header to decide by: the
            // agent check follows what the same load balancer's HTTP check was last answered.
            Asker::Agent(peer) => match self.pollers.proven_http(peer, now.at) {
                Some(told) if told != Verdict::Drained => Some(format!(
                    "drain held: the HTTP check of load balancer {} was answered {} last",
                    peer.to_canonical(),
                    told.as_str()
                )),
                _ => None,
            },
        }
    }

    /// Counts a poll, and notes its poller unless it is pmcheck's own tool (`own`).
    pub(crate) fn count(&self, poll: Poll<'_>, now: Instant, own: bool) {
        if let Some(metrics) = &self.metrics {
            metrics.polled(poll.via, poll.verdict);
        }
        if !own {
            self.pollers.record(poll, now);
        }
    }
}

/// The routes: `/status` for the operator, `/metrics` for Prometheus, any other path a poll.
impl Node {
    /// Answers one request from `peer`, and notes what it was told.
    ///
    /// `/status` is the operator's: from this host its JSON also lists the pollers and the
    /// agent connections. Those name other hosts and cost a read of the kernel's socket tables,
    /// so nobody else gets them. `/metrics` is Prometheus's; every other path is a poll.
    pub fn answer<B>(&self, request: &Request<B>, peer: IpAddr) -> Response<Full<Bytes>> {
        let method = request.method();
        if !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
            return method_not_allowed();
        }
        let headers = request.headers();
        match request.uri().path() {
            METRICS_PATH => return self.scrape(method, headers),
            STATUS_PATH => return self.status(method, headers, peer),
            _ => {}
        }
        // pmcheck's own tool runs on this host: the header is only looked at from here.
        let local = peer.to_canonical().is_loopback();
        let own = local && from_pmcheck(headers);
        let state = headers.get(lb_state::HEADER).map(HeaderValue::as_bytes);
        let key = headers.get(lb_proof::HEADER).map(HeaderValue::as_bytes);
        let proof = self.proof.judge(peer, key);
        let asker = match state {
            Some(header) if proof.proven() => Asker::Check(header),
            _ => Asker::Anyone,
        };
        self.decide_for(asker, |decision, now| {
            self.count(
                Poll {
                    address: peer,
                    via: Via::Http,
                    verdict: decision.verdict,
                    state,
                    client: headers.get(header::USER_AGENT).map(HeaderValue::as_bytes),
                    proof,
                },
                now.at,
                own,
            );
            if local && wants_json(headers) {
                return deprecated(self.operator_json(decision, now, method));
            }
            respond(decision, method, headers)
        })
    }

    /// `/status`: the verdict in JSON with its HTTP status, whatever the `Accept`; from this
    /// host with the pollers, the agents and the readings. Not a poll: no poller is recorded.
    fn status(&self, method: &Method, headers: &HeaderMap, peer: IpAddr) -> Response<Full<Bytes>> {
        self.decide(|decision, now| {
            let poll = Poll {
                address: peer,
                via: Via::Http,
                verdict: decision.verdict,
                state: None,
                client: headers.get(header::USER_AGENT).map(HeaderValue::as_bytes),
                proof: Proof::Unlisted,
            };
            self.count(poll, now.at, true);
            if peer.to_canonical().is_loopback() {
                self.operator_json(decision, now, method)
            } else {
                respond_with(decision, method, decision.json(), true)
            }
        })
    }

    /// The operator's JSON: the answer, the pollers, the agents and the slow readings, all as
    /// of the moment the decision was made.
    fn operator_json(
        &self,
        decision: &Decision<'_>,
        now: Now,
        method: &Method,
    ) -> Response<Full<Bytes>> {
        let mut answer = decision.answer();
        let pollers = self.pollers.answer(now.at);
        if let DrainState::Drained(drain) = decision.drain {
            answer.drain_held = hold::held_by(&pollers, drain, now.wall);
        }
        answer.pollers = Some(pollers);
        answer.unrecorded = self.pollers.unrecorded(now.at);
        answer.listening_ms = Some(
            u64::try_from(now.at.saturating_duration_since(self.started).as_millis())
                .unwrap_or(u64::MAX),
        );
        answer.traffic = self.agents.latest(now.at);
        answer.drain_file = Some(self.drain_file.clone());
        answer.agent_check = Some(self.rules.agent_check);
        answer.certificates = self.certificates();
        answer.code = self.code();
        respond_with(decision, method, answer.to_json(), true)
    }

    /// Prometheus's scrape: the same decision a poll gets now, and the counters. Neither
    /// counted as a poll nor a cause of a probe.
    fn scrape(&self, method: &Method, headers: &HeaderMap) -> Response<Full<Bytes>> {
        let Some(metrics) = &self.metrics else {
            return plain(
                StatusCode::NOT_FOUND,
                "404 Not Found: metrics are served by the daemon (pmcheck serve), not in inetd mode\n",
                method,
            );
        };
        let openmetrics = metrics::wants_openmetrics(headers.get_all(header::ACCEPT).iter());
        let body = self.decide(|decision, now| {
            metrics.render(
                Current {
                    verdict: decision.verdict,
                    weight: decision.weight,
                    drain: decision.drain,
                    pool: decision.probe.and_then(|p| p.pool.as_ref()),
                    paused_since: decision
                        .probe
                        .and_then(|p| p.pause.as_ref())
                        .map(|p| p.since),
                    pollers: self.pollers.count(now.at),
                },
                &self.readings,
                openmetrics,
            )
        });
        let content_type = if openmetrics {
            metrics::OPENMETRICS
        } else {
            metrics::CLASSIC
        };
        with_body(
            StatusCode::OK,
            HeaderValue::from_static(content_type),
            Bytes::from(body),
            method,
        )
    }

    /// The certificates' dates as last read, for the operator's JSON (none in inetd mode).
    fn certificates(&self) -> Option<CertificatesAnswer> {
        let latest = self.readings.expiries()?;
        Some(CertificatesAnswer::of(&latest, expiry::now()))
    }

    /// The deploy records as last read, for the operator's JSON (none in inetd mode).
    fn code(&self) -> Option<Vec<CodeAnswer>> {
        let latest = self.readings.code()?;
        Some(CodeAnswer::of(&latest, expiry::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::responder::http::operator_view;
    use crate::responder::http::tests::body;

    /// A responder with no probe yet, listening for a Puppet Server on `puppet`.
    fn responder(puppet: Option<std::net::SocketAddr>) -> (Node, impl Sized) {
        let (p, latest) = watch::channel(None);
        let (d, drain) = watch::channel(Arc::new(DrainState::NotDrained));
        let (r, rejoin) = watch::channel(Rejoin::Steady);
        let responder = Node::new(
            Feeds {
                drain,
                latest,
                rejoin,
            },
            Rules::ONCE,
            crate::settings::lb_proof::LbProof::none(),
            &DrainFile::new(std::path::Path::new("/var/lib/pmcheck")),
            puppet,
            true,
        );
        (responder, (p, d, r))
    }

    fn json_from(responder: &Node, peer: &str, user_agent: &str) -> serde_json::Value {
        let request = Request::get("/")
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, user_agent)
            .body(())
            .unwrap();
        let (_, _, bytes) = body(responder.answer(&request, peer.parse().unwrap()));
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn only_this_host_sees_the_pollers_and_the_traffic() {
        let (responder, _keep) = responder(Some("127.0.0.1:8140".parse().unwrap()));
        responder.agents.refresh_here();
        let remote = json_from(&responder, "10.0.0.5", "HAProxy");
        assert!(remote.get("pollers").is_none() && remote.get("traffic").is_none());
        for local in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            let json = json_from(&responder, local, "pmcheck/0.1.0");
            assert_eq!(json["pollers"][0]["address"], "10.0.0.5", "{local}: {json}");
            assert_eq!(
                json["traffic"]["listener"], "127.0.0.1:8140",
                "{local}: {json}"
            );
        }
        let pollers = responder.pollers.list(Instant::now());
        assert_eq!(
            pollers.len(),
            1,
            "pmcheck's own requests are not a poller's"
        );
        assert_eq!(pollers[0].http.map(|t| t.verdict), Some(Verdict::Starting));
    }

    /// From another host `/status` is the verdict in JSON, without the pollers or the
    /// traffic, and it is not recorded as a poll.
    #[test]
    fn status_from_elsewhere_is_the_short_json_and_no_poll() {
        let (responder, _keep) = responder(Some("127.0.0.1:8140".parse().unwrap()));
        let request = Request::get(STATUS_PATH).body(()).unwrap();
        let (status, headers, bytes) =
            body(responder.answer(&request, "10.0.0.7".parse().unwrap()));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(headers[header::CONTENT_TYPE], "application/json");
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(json["verdict"], "STARTING");
        assert!(
            json.get("pollers").is_none() && json.get("traffic").is_none(),
            "{json}"
        );
        assert!(responder.pollers.list(Instant::now()).is_empty());
        assert!(operator_view(&request, "::1".parse().unwrap()));
        assert!(!operator_view(&request, "10.0.0.7".parse().unwrap()));
    }

    #[test]
    fn agent_lines_are_recorded_as_told() {
        let (responder, _keep) = responder(None);
        let (line, verdict, at) = responder.agent_line("10.0.0.6".parse().unwrap());
        responder.agent_told("10.0.0.6".parse().unwrap(), b"", verdict, at);
        let pollers = responder.pollers.list(Instant::now());
        assert!(line.starts_with("#STARTING"), "{line}");
        assert_eq!(
            pollers[0].agent.map(|t| (t.verdict, t.times)),
            Some((Verdict::Starting, 1))
        );
        assert_eq!(pollers[0].http, None);
    }
}
