//! The HTTP answers: a verdict made a response (status, reason phrase, text or JSON body, the
//! headers every answer has). Which route a request takes is the node's ([`crate::responder::node::Node::answer`]).
//!
//! Written for HAProxy's checks as they really arrive: `OPTIONS / HTTP/1.0` with no headers,
//! lower-case header names, a `Content-Length: 0` on a GET, and a RST right after the status line.

use std::net::IpAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::ext::ReasonPhrase;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use crate::health::decision::Decision;
use crate::health::verdict::Verdict;

/// The methods a poll may use.
const ALLOW: HeaderValue = HeaderValue::from_static("GET, HEAD, OPTIONS");
const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");
const TEXT: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
const JSON: HeaderValue = HeaderValue::from_static("application/json");

/// Where Prometheus scrapes.
pub const METRICS_PATH: &str = "/metrics";
pub use crate::protocol::{STATUS_PATH, USER_AGENT};

/// The operator's request from this host (`/status`), whose answer also lists the agent
/// connections (read before it is answered: [`crate::responder::agents::Agents::refresh`]).
pub fn operator_view<B>(request: &Request<B>, peer: IpAddr) -> bool {
    peer.to_canonical().is_loopback() && request.uri().path() == STATUS_PATH
}

/// The answer to a GET, HEAD or OPTIONS poll. HEAD gets the same status and headers, no body.
/// A text answer reuses `last`'s bytes when it says the same thing.
pub fn respond(
    decision: &Decision<'_>,
    method: &Method,
    headers: &HeaderMap,
    last: &mut Rendered,
) -> Response<Full<Bytes>> {
    // `Accept: application/json` (anywhere in the list) selects the JSON body.
    let json = (headers.get_all(header::ACCEPT).iter())
        .any(|v| v.to_str().is_ok_and(|s| s.contains("application/json")));
    if json {
        return respond_with(decision, method, decision.json());
    }
    let (body, phrase) = last.text(decision);
    answer(decision, method, body, phrase, TEXT)
}

/// The answer with the JSON `body` rendered already.
pub(crate) fn respond_with(
    decision: &Decision<'_>,
    method: &Method,
    body: String,
) -> Response<Full<Bytes>> {
    let phrase = reason_phrase(decision);
    answer(decision, method, Bytes::from(body), phrase, JSON)
}

fn answer(
    decision: &Decision<'_>,
    method: &Method,
    body: Bytes,
    phrase: Option<ReasonPhrase>,
    content_type: HeaderValue,
) -> Response<Full<Bytes>> {
    let status = StatusCode::from_u16(decision.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let mut response = with_body(status, content_type, body, method);
    if let Some(phrase) = phrase {
        response.extensions_mut().insert(phrase);
    }
    if *method == Method::OPTIONS {
        response.headers_mut().insert(header::ALLOW, ALLOW);
    }
    response
}

/// The text answer a connection sent last. A kept-alive client (a monitor, a curl loop, wrk)
/// asks the same question again and again while the answer changes far less often: the same
/// words get the same bytes back, shared, instead of being formatted and checked again.
#[derive(Default)]
pub struct Rendered {
    /// The body (`VERDICT - reason`) and the status line's reason phrase that go with it.
    last: Option<(Bytes, Option<ReasonPhrase>)>,
    /// The latest request proved itself a load balancer's: the connection table keeps room
    /// only for those (`crate::responder::connections`).
    pub proven: bool,
}

impl Rendered {
    /// The body and reason phrase of `decision`, from the last answer when it says the same.
    fn text(&mut self, decision: &Decision<'_>) -> (Bytes, Option<ReasonPhrase>) {
        if let Some((body, phrase)) = &self.last
            && decision.is_text(body)
        {
            return (body.clone(), phrase.clone());
        }
        let body = Bytes::from(decision.text());
        let phrase = reason_phrase(decision);
        self.last = Some((body.clone(), phrase.clone()));
        (body, phrase)
    }
}

/// Every answer's status, type, length and `no-store`; HEAD gets the same headers, no body.
pub(crate) fn with_body(
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
/// OK keeps the standard phrase: none.
fn reason_phrase(decision: &Decision<'_>) -> Option<ReasonPhrase> {
    if decision.verdict == Verdict::Ok {
        return None;
    }
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
    Some(
        ReasonPhrase::try_from(phrase)
            .unwrap_or_else(|_| ReasonPhrase::from_static(word.as_bytes())),
    )
}

/// The answer to a method no poll uses: which ones it may.
pub(crate) fn method_not_allowed() -> Response<Full<Bytes>> {
    let mut response = plain(
        StatusCode::METHOD_NOT_ALLOWED,
        "405 Method Not Allowed: poll with GET, HEAD or OPTIONS\n",
        &Method::GET,
    );
    response.headers_mut().insert(header::ALLOW, ALLOW);
    response
}

/// A fixed text answer with `status`.
pub(crate) fn plain(
    status: StatusCode,
    body: &'static str,
    method: &Method,
) -> Response<Full<Bytes>> {
    with_body(status, TEXT, Bytes::from_static(body.as_bytes()), method)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::drain::record::DrainState;
    use crate::health::decision::Rules;
    use crate::health::weight::Rejoin;
    use http_body_util::BodyExt;

    pub(crate) fn body(response: Response<Full<Bytes>>) -> (StatusCode, HeaderMap, Bytes) {
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
        let (status, get_headers, get_body) = body(respond(
            &v,
            &Method::GET,
            &HeaderMap::new(),
            &mut Rendered::default(),
        ));
        let (head_status, head_headers, head_body) = body(respond(
            &v,
            &Method::HEAD,
            &HeaderMap::new(),
            &mut Rendered::default(),
        ));
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
        let response = respond(
            &v,
            &Method::GET,
            &HeaderMap::new(),
            &mut Rendered::default(),
        );
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
        let (_, h, b) = body(respond(
            &v,
            &Method::GET,
            &headers,
            &mut Rendered::default(),
        ));
        assert_eq!(h[header::CONTENT_TYPE], "application/json");
        let json: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(json["verdict"], "STARTING");
    }

    fn phrase(response: &Response<Full<Bytes>>) -> Option<&[u8]> {
        response
            .extensions()
            .get::<ReasonPhrase>()
            .map(ReasonPhrase::as_bytes)
    }

    #[test]
    fn a_kept_alive_connection_gets_the_same_bytes_until_the_answer_changes() {
        let drain = DrainState::NotDrained;
        let mut v = starting(&drain);
        let mut last = Rendered::default();
        let get = |v: &Decision<'_>, last: &mut Rendered| {
            let response = respond(v, &Method::GET, &HeaderMap::new(), last);
            let phrase = phrase(&response).map(<[u8]>::to_vec);
            let (status, _, bytes) = body(response);
            (status, bytes, phrase)
        };
        let (_, first, first_phrase) = get(&v, &mut last);
        let (_, again, again_phrase) = get(&v, &mut last);
        assert_eq!(first, v.text().as_bytes());
        // Shared, not copied: the same allocation answers both.
        assert_eq!(first.as_ptr(), again.as_ptr());
        assert_eq!(first_phrase, again_phrase);
        assert!(first_phrase.is_some_and(|p| p.starts_with(b"Starting: ")));

        // Other words: new bytes, and a phrase that says them.
        v.reason = "Puppet Server is not ready: starting".into();
        let (_, changed, changed_phrase) = get(&v, &mut last);
        assert_eq!(changed, v.text().as_bytes());
        assert_eq!(
            changed_phrase.as_deref(),
            Some(&b"Starting: Puppet Server is not ready: starting"[..])
        );

        // The same words under another verdict are another answer; OK has no phrase.
        v.verdict = Verdict::Ok;
        v.status = 200;
        let (status, ok, ok_phrase) = get(&v, &mut last);
        assert_eq!(status, StatusCode::OK);
        assert_eq!(ok, v.text().as_bytes());
        assert_eq!(ok_phrase, None);

        // A reason that only differs in its last byte, or is a prefix, is not the same.
        v.reason = "Puppet Server is not ready: startinG".into();
        assert_eq!(get(&v, &mut last).1, v.text().as_bytes());
        v.reason = "Puppet Server is not ready".into();
        assert_eq!(get(&v, &mut last).1, v.text().as_bytes());
    }

    #[test]
    fn a_json_answer_leaves_the_text_it_keeps_alone() {
        let drain = DrainState::NotDrained;
        let v = starting(&drain);
        let mut last = Rendered::default();
        let text = body(respond(&v, &Method::GET, &HeaderMap::new(), &mut last)).2;
        let mut json = HeaderMap::new();
        json.insert(header::ACCEPT, JSON);
        let (_, h, _) = body(respond(&v, &Method::GET, &json, &mut last));
        assert_eq!(h[header::CONTENT_TYPE], "application/json");
        let again = body(respond(&v, &Method::GET, &HeaderMap::new(), &mut last)).2;
        assert_eq!(text.as_ptr(), again.as_ptr());
    }
}
