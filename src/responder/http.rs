//! The HTTP responder: turns a poll into an answer from the latest verdict.
//!
//! Written for HAProxy's checks as they really arrive: `OPTIONS / HTTP/1.0` with no headers,
//! lower-case header names, a `Content-Length: 0` on a GET, and a RST right after the status line.

use std::net::IpAddr;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use hyper::ext::ReasonPhrase;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use crate::drain::record::DrainState;
use crate::health::answer::{CertificatesAnswer, CodeAnswer};
use crate::health::decision::Decision;
use crate::health::verdict::Verdict;
use crate::health::{hold, lb_state};
use crate::puppet::expiry;
use crate::responder::metrics::{self, Now};
use crate::responder::node::{Asker, Node};
use crate::responder::pollers::{Poll, Via};
use crate::settings::lb_proof::{self, Proof};

const ALLOW: HeaderValue = HeaderValue::from_static("GET, HEAD, OPTIONS");
const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");
const TEXT: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
const JSON: HeaderValue = HeaderValue::from_static("application/json");

/// Where Prometheus scrapes.
pub const METRICS_PATH: &str = "/metrics";
/// The operator's JSON (`pmcheck status`, the waits, `cycle`). Every path but this one and
/// [`METRICS_PATH`] is a load balancer's poll: HAProxy's `option httpchk` may name any.
pub const STATUS_PATH: &str = "/status";

/// On the operator's JSON asked for the old way (`Accept: application/json` on a poll's
/// path): it keeps working for one release, and says where it moved (RFC 9745, RFC 8288).
const DEPRECATION: HeaderValue = HeaderValue::from_static("@1795564800");
const SUCCESSOR: HeaderValue = HeaderValue::from_static("</status>; rel=\"successor-version\"");

/// The `User-Agent` of pmcheck's own requests (`status`, `drain --wait`): the operator's
/// tool is not a load balancer, so its polls are not recorded as a poller's.
pub const USER_AGENT: &str = concat!("pmcheck/", env!("CARGO_PKG_VERSION"));

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
                now,
                own,
            );
            if local && wants_json(headers) {
                let mut response = self.operator_json(decision, now, method);
                let h = response.headers_mut();
                h.insert("deprecation", DEPRECATION);
                h.insert(header::LINK, SUCCESSOR);
                return response;
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
            self.count(poll, now, true);
            if peer.to_canonical().is_loopback() {
                self.operator_json(decision, now, method)
            } else {
                respond_with(decision, method, decision.json(), true)
            }
        })
    }

    /// The operator's JSON: the answer, the pollers, the agents and the slow readings.
    fn operator_json(
        &self,
        decision: &Decision<'_>,
        now: Instant,
        method: &Method,
    ) -> Response<Full<Bytes>> {
        let mut answer = decision.answer();
        let pollers = self.pollers.answer(now);
        if let DrainState::Drained(drain) = decision.drain {
            answer.drain_held = hold::held_by(&pollers, drain, SystemTime::now());
        }
        answer.pollers = Some(pollers);
        answer.unrecorded = self.pollers.unrecorded(now);
        answer.listening_ms = Some(
            u64::try_from(now.saturating_duration_since(self.started).as_millis())
                .unwrap_or(u64::MAX),
        );
        answer.traffic = self.agents.latest().map(|t| (*t).clone());
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
                Now {
                    verdict: decision.verdict,
                    weight: decision.weight,
                    drain: decision.drain,
                    pool: decision.probe.and_then(|p| p.pool.as_ref()),
                    paused_since: decision
                        .probe
                        .and_then(|p| p.pause.as_ref())
                        .map(|p| p.since),
                    pollers: self.pollers.count(now),
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

/// The operator's request from this host (`/status`, or JSON the old way), whose answer also
/// lists the agent connections (read before it is answered: [`crate::responder::agents::Agents::refresh`]).
pub fn operator_view<B>(request: &Request<B>, peer: IpAddr) -> bool {
    peer.to_canonical().is_loopback()
        && (request.uri().path() == STATUS_PATH || wants_json(request.headers()))
}

/// The request comes from pmcheck's own tool.
fn from_pmcheck(headers: &HeaderMap) -> bool {
    headers
        .get(header::USER_AGENT)
        .is_some_and(|ua| ua.as_bytes().starts_with(b"pmcheck/"))
}

/// The answer to a GET, HEAD or OPTIONS poll. HEAD gets the same status and headers, no body.
pub fn respond(
    decision: &Decision<'_>,
    method: &Method,
    headers: &HeaderMap,
) -> Response<Full<Bytes>> {
    let json = wants_json(headers);
    let body = if json {
        decision.json()
    } else {
        decision.text()
    };
    respond_with(decision, method, body, json)
}

/// The answer with `body` (JSON or text) rendered already.
fn respond_with(
    decision: &Decision<'_>,
    method: &Method,
    body: String,
    json: bool,
) -> Response<Full<Bytes>> {
    let status = StatusCode::from_u16(decision.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let content_type = if json { JSON } else { TEXT };
    let mut response = with_body(status, content_type, Bytes::from(body), method);
    if decision.verdict != Verdict::Ok {
        response.extensions_mut().insert(reason_phrase(decision));
    }
    if *method == Method::OPTIONS {
        response.headers_mut().insert(header::ALLOW, ALLOW);
    }
    response
}

/// Every answer's status, type, length and `no-store`; HEAD gets the same headers, no body.
fn with_body(
    status: StatusCode,
    content_type: HeaderValue,
    body: Bytes,
    method: &Method,
) -> Response<Full<Bytes>> {
    let length = HeaderValue::from(body.len());
    let body = if *method == Method::HEAD {
        Bytes::new()
    } else {
        body
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, content_type);
    h.insert(header::CONTENT_LENGTH, length);
    h.insert(header::CACHE_CONTROL, NO_STORE);
    response
}

/// The status line's reason phrase: the verdict and the start of its reason, which HAProxy shows
/// as the check's info on its stats page (`last_chk`), so the cause of a 503 is visible there.
fn reason_phrase(decision: &Decision<'_>) -> ReasonPhrase {
    /// Long enough for "Drained: kernel upgrade (by alice since ...)", short enough for a table cell.
    const LIMIT: usize = 100;
    let word = decision.verdict.reason_phrase();
    let mut phrase = String::with_capacity(LIMIT + 3);
    phrase.push_str(word);
    phrase.push_str(": ");
    for c in decision.reason.chars() {
        if phrase.len() >= LIMIT {
            phrase.push_str("...");
            break;
        }
        // RFC 9112 allows HTAB, SP, VCHAR and obs-text; keep to printable ASCII for HAProxy.
        phrase.push(if c.is_ascii_graphic() {
            c
        } else if c.is_ascii() {
            ' '
        } else {
            '?'
        });
    }
    ReasonPhrase::try_from(phrase).unwrap_or_else(|_| ReasonPhrase::from_static(word.as_bytes()))
}

fn method_not_allowed() -> Response<Full<Bytes>> {
    let mut response = plain(
        StatusCode::METHOD_NOT_ALLOWED,
        "405 Method Not Allowed: poll with GET, HEAD or OPTIONS\n",
        &Method::GET,
    );
    response.headers_mut().insert(header::ALLOW, ALLOW);
    response
}

/// A fixed text answer with `status`.
fn plain(status: StatusCode, body: &'static str, method: &Method) -> Response<Full<Bytes>> {
    with_body(status, TEXT, Bytes::from_static(body.as_bytes()), method)
}

/// `Accept: application/json` (anywhere in the list) selects the JSON body.
fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .any(|v| v.to_str().is_ok_and(|s| s.contains("application/json")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::file::DrainFile;
    use crate::drain::record::DrainState;
    use crate::health::decision::Rules;
    use crate::health::weight::Rejoin;
    use crate::responder::node::Feeds;
    use http_body_util::BodyExt;
    use std::sync::Arc;
    use std::time::Instant;
    use tokio::sync::watch;

    fn body(response: Response<Full<Bytes>>) -> (StatusCode, HeaderMap, Bytes) {
        let (parts, body) = response.into_parts();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = match rt.block_on(body.collect()) {
            Ok(collected) => collected.to_bytes(),
            Err(never) => match never {},
        };
        (parts.status, parts.headers, bytes)
    }

    /// Before the first probe: a 503 with a known body.
    fn starting(drain: &DrainState) -> Decision<'_> {
        Decision::decide(
            drain,
            None,
            Rejoin::Steady,
            crate::responder::node::now(),
            &Rules::ONCE,
        )
    }

    #[test]
    fn head_has_the_get_headers_and_no_body() {
        let drain = DrainState::NotDrained;
        let v = starting(&drain);
        let (status, get_headers, get_body) = body(respond(&v, &Method::GET, &HeaderMap::new()));
        let (head_status, head_headers, head_body) =
            body(respond(&v, &Method::HEAD, &HeaderMap::new()));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(head_status, status);
        assert!(head_body.is_empty());
        assert_eq!(
            head_headers[header::CONTENT_LENGTH],
            get_headers[header::CONTENT_LENGTH]
        );
        assert_eq!(
            get_headers[header::CONTENT_LENGTH],
            get_body.len().to_string().as_str()
        );
        assert_eq!(get_headers[header::CACHE_CONTROL], "no-store");
        assert!(get_body.starts_with(b"STARTING - "));
    }

    #[test]
    fn the_reason_phrase_carries_the_cause_in_printable_ascii() {
        let drain = DrainState::NotDrained;
        let mut v = starting(&drain);
        v.reason = format!("r\u{e9}boot\r\nnow {}", "x".repeat(300)).into();
        let response = respond(&v, &Method::GET, &HeaderMap::new());
        let phrase = response
            .extensions()
            .get::<ReasonPhrase>()
            .expect("a reason phrase");
        let text = std::str::from_utf8(phrase.as_bytes()).unwrap();
        assert!(text.starts_with("Starting: r?boot  now xxx"), "{text}");
        assert!(text.ends_with("...") && text.len() <= 103, "{text}");
    }

    #[test]
    fn accept_json_anywhere_in_the_list() {
        let drain = DrainState::NotDrained;
        let v = starting(&drain);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/html, application/json;q=0.9"),
        );
        let (_, h, b) = body(respond(&v, &Method::GET, &headers));
        assert_eq!(h[header::CONTENT_TYPE], "application/json");
        let json: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(json["verdict"], "STARTING");
    }

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
