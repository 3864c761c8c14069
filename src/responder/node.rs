//! The node's shared state: one per daemon (or per inetd poll), shared by every listener and
//! connection, read by the HTTP answers ([`crate::responder::http`]) and the agent check.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};
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
use crate::health::answer::json_line;
use crate::health::decision::{Decision, NOT_DRAINED, Rules};
use crate::health::hold::{self, Asker, Held};
use crate::health::lb_state;
use crate::health::verdict::Verdict;
use crate::health::weight::Rejoin;
use crate::protocol::progress::Ask;
use crate::protocol::{CertificatesAnswer, CodeAnswer, Status, VERSION};
use crate::puppet::client::Address;
use crate::puppet::expiry;
use crate::puppet::readings::Readings;
use crate::puppet::report::Latest;
use crate::responder::agent::{self, Sent};
use crate::responder::agents::Agents;
use crate::responder::http::{
    METRICS_PATH, Rendered, STATUS_PATH, method_not_allowed, plain, respond, respond_with,
    with_body,
};
use crate::responder::metrics::{self, Metrics};
use crate::responder::pollers::{Poll, Pollers, Via};
use crate::responder::progress::progress;
use crate::responder::server_line;
use crate::settings::lb_proof::{self, LbProof};
use crate::text::ms;

/// The moment a decision is made at: the one place the responder reads both clocks for one.
pub(crate) fn now() -> Now {
    Now {
        at: Instant::now(),
        wall: SystemTime::now(),
    }
}

/// What an agent check was told: its poll, noted once its line is out.
#[derive(Debug, Clone, Copy)]
pub struct AgentTold<'a> {
    poll: Poll<'a>,
    /// A line with no admin word told the load balancer nothing: only counted.
    quiet: bool,
    at: Instant,
}

impl AgentTold<'_> {
    /// The check proved itself a load balancer's.
    pub fn proven(&self) -> bool {
        self.poll.proof.proven()
    }
}

/// A drained node answered otherwise to one asker, and why.
pub(crate) struct Kept {
    /// The drain rule held the drain there; `None` when an agent check waits for its line's
    /// HTTP check to take the node out first.
    pub(crate) held: Option<Held>,
    /// An agent check with nothing to follow yet is told no admin word at all: HAProxy keeps
    /// the server as it was, neither taking the node out nor putting it back.
    pub(crate) quiet: bool,
    /// Why, for the reason.
    pub(crate) why: String,
}

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
    /// The drain state, the latest probe report and the rejoin state, kept current.
    pub feeds: Feeds,
    /// The daemon's settings that shape an answer.
    pub rules: Rules,
    /// Who polls, and what each was told.
    pub pollers: Pollers,
    /// What a poll must show to count as a load balancer's: the key file as last read.
    proof: RwLock<LbProof>,
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
    /// What a poll must show now.
    pub fn proof(&self) -> RwLockReadGuard<'_, LbProof> {
        self.proof.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key file as a reload read it.
    pub fn set_proof(&self, proof: LbProof) {
        *self.proof.write().unwrap_or_else(PoisonError::into_inner) = proof;
    }

    /// The shared state of a node whose drain record is `drain_file` and whose Puppet Server
    /// listens on `puppet` (for the agent connections); `metrics` for a daemon, which counts.
    pub fn new(
        feeds: Feeds,
        rules: Rules,
        proof: LbProof,
        drain_file: &DrainFile,
        puppet: Option<Address>,
        metrics: bool,
    ) -> Self {
        Self {
            feeds,
            rules,
            pollers: Pollers::default(),
            proof: RwLock::new(proof),
            agents: Agents::new(puppet),
            metrics: metrics.then(Metrics::default),
            readings: Readings::default(),
            started: Instant::now(),
            drain_file: drain_file.resolved().display().to_string(),
        }
    }

    /// The agent check's line for `peer`, which sent `sent` (HAProxy's `agent-send`: the
    /// server line and the load balancers' key), with what it tells, to note once the line is
    /// out ([`Node::agent_told`]).
    pub fn agent_line<'a>(&self, peer: IpAddr, sent: &'a Sent) -> (String, AgentTold<'a>) {
        let (key, line) = sent.parts();
        let whose = self.proof().judge(peer, key);
        let asker = Asker::Agent {
            peer,
            key_line: whose.proof.proven().then_some(whose.key_line),
            line,
        };
        self.decide(asker, |decision, now, kept| {
            let poll = Poll {
                address: peer,
                via: Via::Agent,
                verdict: decision.verdict,
                state: None,
                held: kept.and_then(|k| k.held),
                line,
                client: None,
                proof: whose.proof,
                key_line: whose.key_line,
            };
            let quiet = kept.is_some_and(|k| k.quiet);
            let told = AgentTold {
                poll,
                quiet,
                at: now.at,
            };
            (agent::line(decision, quiet), told)
        })
    }

    /// Notes that an agent check was told `told`.
    pub fn agent_told(&self, told: AgentTold<'_>) {
        self.count(told.poll, told.at, told.quiet);
    }

    /// Decides from the latest drain state, probe report and rejoin state, as of now, for
    /// `asker` (anyone: [`Asker::Anyone`]): a drain is answered as not drained where the drain
    /// rule holds it ([`crate::health::hold`]), and to an agent check until its server line's
    /// HTTP check has taken the node out. `then` also gets how the answer was kept from the
    /// drain, if it was.
    pub(crate) fn decide<R>(
        &self,
        asker: Asker<'_>,
        then: impl FnOnce(&Decision<'_>, Now, Option<&Kept>) -> R,
    ) -> R {
        let now = now();
        let published = Arc::clone(&self.feeds.drain.borrow());
        // A `--for` that ran out before the watcher published it expired is expired now (a
        // copy, for those few moments only): the answer says so, not a bare OK.
        let aged = published.at(now.wall);
        let drain = aged.as_ref().unwrap_or(&published);
        let probe = self.feeds.latest.borrow().clone();
        let rejoin = *self.feeds.rejoin.borrow();
        let decision = Decision::decide(drain, probe.as_deref(), rejoin, now, &self.rules);
        let kept = match (decision.verdict, drain) {
            (Verdict::Drained, DrainState::Drained(d)) => self.kept(d, &decision, asker, now),
            _ => None,
        };
        let Some(kept) = kept else {
            return then(&decision, now, None);
        };
        let mut decision = if kept.quiet {
            decision
        } else {
            Decision::decide(&NOT_DRAINED, probe.as_deref(), rejoin, now, &self.rules)
        };
        decision.reason = Cow::Owned(format!("{}; {}", kept.why, decision.reason));
        then(&decision, now, Some(&kept))
    }

    /// Whether `drain` is answered as not drained to `asker`, and why.
    fn kept(
        &self,
        drain: &Drain,
        decision: &Decision<'_>,
        asker: Asker<'_>,
        now: Now,
    ) -> Option<Kept> {
        match asker {
            Asker::Anyone => None,
            Asker::Check {
                peer,
                key_line,
                header,
            } => {
                let mut lb = None;
                let held = hold::held(decision.holders(drain, now.wall), || {
                    let lb = lb.insert(lb_state::parse(header).ok()?);
                    let line = (self.pollers).line_facts(peer, key_line, header, now.at);
                    let drained_at = (decision.holders(drain, now.wall))
                        .filter_map(|h| h.tenure.since.time())
                        .min();
                    server_line::held_at(line.as_ref(), lb, now.at, drained_at, now.wall)
                })?;
                let lb = lb?;
                Some(Kept {
                    held: Some(held),
                    quiet: false,
                    why: held.describe(&lb),
                })
            }
            Asker::Agent {
                peer,
                key_line,
                line,
            } => {
                let may_hold = hold::may_hold(decision.holders(drain, now.wall));
                self.agent_kept(peer, key_line, line, may_hold, now.at)
            }
        }
    }

    /// HAProxy applies an agent line as it reads it, with no header to decide by: the
    /// agent check follows what its server line's HTTP check was answered last, so it
    /// never takes the node out before that check did. With nothing to follow yet (the
    /// daemon just started, or the line's HTTP check has not come since), a drain the
    /// rule may hold is neither put in force nor lifted: no admin word.
    pub(crate) fn agent_kept(
        &self,
        peer: IpAddr,
        key_line: Option<Option<usize>>,
        line: Option<&[u8]>,
        may_hold: bool,
        now: Instant,
    ) -> Option<Kept> {
        let name = line.map_or_else(
            || "the server lines it checks".to_owned(),
            |l| String::from_utf8_lossy(l).into_owned(),
        );
        let who = peer.to_canonical();
        let Some(followed) = self.pollers.followed(peer, key_line, line, may_hold, now) else {
            // Unproven, and nothing held at its address: it proves nothing. Where load
            // balancers prove themselves (a key file) it never says `drain`: HAProxy's DRAIN
            // leaves the header's word UP and only the total drops, so the line would read as
            // the backend's last server; the HTTP check takes the node out. Elsewhere it is
            // answered as anyone is.
            let why = if key_line.is_none() && self.proof().wants_key() {
                format!(
                    "this agent check sent no key and cannot be told to its server line: it leaves the server as it is, and the HTTP check of {name} takes the node out"
                )
            } else {
                key_line.filter(|_| may_hold)?;
                format!(
                    "no HTTP check of {name} by load balancer {who} seen yet: the agent check leaves the server as it is until it follows one"
                )
            };
            return Some(Kept {
                held: None,
                quiet: true,
                why,
            });
        };
        if followed.told == Verdict::Drained {
            return None;
        }
        let why = match followed.held {
            Some(_) if !followed.placed => format!(
                "drain held at load balancer {who}, and this agent check cannot be told from that line's (it sent no key, names no line or one checked elsewhere, or a held line's own agent check is not heard): it keeps the node in; send `agent-send \"BACKEND/SERVER KEY\"` on every server line"
            ),
            Some(Held::LastServer) => format!(
                "drain held: load balancer {who} says this node is the only server taking new agents for {name}"
            ),
            Some(Held::EmptyBackend) => format!(
                "drain held: load balancer {who} says no server takes new agents for {name}"
            ),
            Some(Held::TwoViews) => format!(
                "drain held: two load balancers at {who} answer as one for {name}: give each its own key"
            ),
            None => format!(
                "drain not yet taken out by load balancer {who}'s HTTP check of {name} (answered {} last): the agent check follows it",
                followed.told.as_str()
            ),
        };
        Some(Kept {
            held: followed.held,
            quiet: false,
            why,
        })
    }

    /// Counts a poll, and notes its poller unless it is pmcheck's own tool (`own`).
    pub(crate) fn count(&self, poll: Poll<'_>, now: Instant, own: bool) {
        if let Some(metrics) = &self.metrics {
            metrics.polled(poll.via, poll.verdict);
        }
        if own {
            return;
        }
        if let Some(lack) = self.pollers.record(poll, now) {
            let via = match poll.via {
                Via::Http => "http",
                Via::Agent => "agent",
            };
            tracing::warn!(
                peer = %poll.address,
                via,
                problem = %lack.describe(),
                "a load balancer's check proves nothing, so the waits go by HAProxy's timing and the last-server guard cannot use its word; send the key of the key file from there (`http-check send hdr X-Pmcheck-Key`, `agent-send`), and bind it to that address (said once per address and kind)"
            );
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
    /// `last` is what this connection was answered last ([`Rendered`]).
    pub fn answer<B>(
        &self,
        request: &Request<B>,
        peer: IpAddr,
        last: &mut Rendered,
    ) -> Response<Full<Bytes>> {
        // Only a poll proves itself: a request of any other kind keeps nobody's room.
        last.proven = false;
        let method = request.method();
        if !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
            return method_not_allowed();
        }
        let headers = request.headers();
        match request.uri().path() {
            METRICS_PATH => return self.scrape(method, headers),
            STATUS_PATH => return self.status(method, peer, request.uri().query()),
            _ => {}
        }
        let client = headers.get(header::USER_AGENT).map(HeaderValue::as_bytes);
        // pmcheck's own tool runs on this host: the header is only looked at from here.
        let local = peer.to_canonical().is_loopback();
        let own = local && client.is_some_and(|c| c.starts_with(b"pmcheck/"));
        let state = headers.get(lb_state::HEADER).map(HeaderValue::as_bytes);
        let key = headers.get(lb_proof::HEADER).map(HeaderValue::as_bytes);
        let whose = self.proof().judge(peer, key);
        last.proven = whose.proof.proven();
        let asker = match state {
            Some(header) if whose.proof.proven() => Asker::Check {
                peer,
                key_line: whose.key_line,
                header,
            },
            _ => Asker::Anyone,
        };
        self.decide(asker, |decision, now, kept| {
            self.count(
                Poll {
                    address: peer,
                    via: Via::Http,
                    verdict: decision.verdict,
                    state,
                    held: kept.and_then(|k| k.held),
                    line: None,
                    client,
                    proof: whose.proof,
                    key_line: whose.key_line,
                },
                now.at,
                own,
            );
            respond(decision, method, headers, last)
        })
    }

    /// `/status`: the verdict in JSON with its HTTP status, whatever the `Accept`; from this
    /// host with the pollers, the agents and the readings. Not a poll: no poller is recorded.
    fn status(&self, method: &Method, peer: IpAddr, query: Option<&str>) -> Response<Full<Bytes>> {
        self.decide(Asker::Anyone, |decision, now, _| {
            if let Some(metrics) = &self.metrics {
                metrics.polled(Via::Http, decision.verdict);
            }
            if !peer.to_canonical().is_loopback() {
                return respond_with(decision, method, decision.json());
            }
            let ask = match Ask::from_query(query) {
                Ok(ask) => ask,
                Err(e) => {
                    return with_body(
                        StatusCode::BAD_REQUEST,
                        HeaderValue::from_static("text/plain; charset=utf-8"),
                        Bytes::from(format!("400 Bad Request: {e}\n")),
                        method,
                    );
                }
            };
            // The operator's JSON: the answer, the pollers, the agents and the slow readings,
            // all as of the moment the decision was made.
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
            status.progress = Some(progress(&status, &ask));
            respond_with(decision, method, json_line(&status))
        })
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
        let body = self.decide(Asker::Anyone, |decision, now, _| {
            let pollers = self.pollers.count(now.at);
            metrics.render(decision, pollers, &self.readings, openmetrics)
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
            crate::settings::lb_proof::LbProof::default(),
            &DrainFile::new(std::path::Path::new("/var/lib/pmcheck")),
            puppet.map(crate::puppet::client::fixed),
            true,
        );
        (responder, (p, d, r))
    }

    fn json_from(responder: &Node, path: &str, peer: &str, user_agent: &str) -> serde_json::Value {
        let request = Request::get(path)
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, user_agent)
            .body(())
            .unwrap();
        let (_, _, bytes) =
            body(responder.answer(&request, peer.parse().unwrap(), &mut Rendered::default()));
        serde_json::from_slice(&bytes).unwrap()
    }

    /// A connection's room follows its latest request: a poll proves (or not), anything else
    /// (`/status`, `/metrics`, another method) keeps nobody's room.
    #[test]
    fn only_a_proven_poll_leaves_its_connection_proven() {
        let (responder, _keep) = responder(None);
        let lb = "10.0.0.5".parse().unwrap();
        let net = crate::settings::allow::parse_network("10.0.0.5").unwrap();
        responder.set_proof(crate::settings::lb_proof::LbProof::load(None, vec![net]).unwrap());
        let mut last = Rendered::default();
        let mut ask = |request: Request<()>| {
            responder.answer(&request, lb, &mut last);
            last.proven
        };
        assert!(ask(Request::get("/").body(()).unwrap()));
        assert!(!ask(Request::get(STATUS_PATH).body(()).unwrap()));
        assert!(ask(Request::get("/").body(()).unwrap()));
        assert!(!ask(Request::get(METRICS_PATH).body(()).unwrap()));
        assert!(ask(Request::get("/").body(()).unwrap()));
        assert!(!ask(Request::post("/").body(()).unwrap()));
    }

    #[test]
    fn only_this_host_sees_the_pollers_and_the_traffic() {
        let (responder, _keep) = responder(Some("127.0.0.1:8140".parse().unwrap()));
        let rt = tokio::runtime::Builder::new_current_thread().build();
        rt.unwrap().block_on(responder.agents.refresh());
        let remote = json_from(&responder, "/", "10.0.0.5", "HAProxy");
        assert!(remote.get("pollers").is_none() && remote.get("traffic").is_none());
        let remote = json_from(&responder, STATUS_PATH, "10.0.0.5", "curl/8");
        assert!(remote.get("pollers").is_none() && remote.get("traffic").is_none());
        let local = json_from(&responder, "/", "127.0.0.1", "pmcheck/0.1.0");
        assert!(
            local.get("pollers").is_none(),
            "a poll's path answers a poll, whoever asks: {local}"
        );
        for local in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            let json = json_from(&responder, STATUS_PATH, local, "pmcheck/0.1.0");
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
        let (status, headers, bytes) = body(responder.answer(
            &request,
            "10.0.0.7".parse().unwrap(),
            &mut Rendered::default(),
        ));
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
        let (line, told) = responder.agent_line("10.0.0.6".parse().unwrap(), &Sent::NONE);
        responder.agent_told(told);
        let pollers = responder.pollers.list(Instant::now());
        assert!(line.starts_with("#STARTING"), "{line}");
        assert_eq!(
            pollers[0].agent.map(|t| (t.verdict, t.times)),
            Some((Verdict::Starting, 1))
        );
        assert_eq!(pollers[0].http, None);
    }
}
