//! `pmcheck status`: asks the running daemon what it answers HAProxy, for a person.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::Request;
use hyper::header;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use thiserror::Error;

const DEADLINE: Duration = Duration::from_secs(5);
/// The largest answer read: pmcheck's JSON is well under 4 KiB.
const BODY_LIMIT: usize = 64 * 1024;

#[derive(Debug, Error)]
pub enum StatusError {
    #[error("--url {url}: {detail}; write it as http://HOST:PORT/")]
    Url { url: String, detail: String },
    #[error("cannot reach pmcheck at {url}: {detail} (is `pmcheck serve` running there?)")]
    Unreachable { url: String, detail: String },
}

/// The daemon's answer: its HTTP status and JSON body.
pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// GETs `url` with `Accept: application/json`.
pub async fn ask(url: &str) -> Result<Answer, StatusError> {
    let bad = |detail: &str| StatusError::Url {
        url: url.to_owned(),
        detail: detail.to_owned(),
    };
    let uri: hyper::Uri = url.parse().map_err(|_| bad("not a URL"))?;
    if uri.scheme_str() != Some("http") {
        return Err(bad("only http:// is supported (pmcheck serves plain HTTP)"));
    }
    let host = uri
        .host()
        .ok_or_else(|| bad("no host"))?
        .trim_matches(['[', ']'])
        .to_owned();
    let port = uri.port_u16().unwrap_or(80);
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_default();
    let unreachable = |detail: String| StatusError::Unreachable {
        url: url.to_owned(),
        detail,
    };
    let exchange = async {
        let stream = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        tokio::spawn(connection);
        let request = Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
            .header(header::HOST, authority)
            .header(header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())
            .map_err(|e| unreachable(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), BODY_LIMIT)
            .collect()
            .await
            .map_err(|e| {
                unreachable(if e.is::<http_body_util::LengthLimitError>() {
                    format!(
                        "the answer is larger than {} KiB, which pmcheck never sends: is this pmcheck?",
                        BODY_LIMIT / 1024
                    )
                } else {
                    e.to_string()
                })
            })?
            .to_bytes();
        Ok(Answer {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    tokio::time::timeout(DEADLINE, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(unreachable(format!(
                "no answer within {}",
                crate::cli::format_duration(DEADLINE)
            )))
        })
}

/// The answer for a person: the verdict line, then the drain and the probe.
pub fn describe(answer: &Answer) -> String {
    let Ok(json) = serde_json::from_str::<Value>(&answer.body) else {
        return format!("HTTP {}: {}", answer.status, answer.body.trim());
    };
    let text = |v: &Value| {
        v.as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| v.to_string())
    };
    let mut out = format!(
        "{} (HTTP {}) - {}\n",
        text(&json["verdict"]),
        answer.status,
        text(&json["reason"])
    );
    let drain = &json["drain"];
    if drain.is_null() {
        out.push_str("drain:  not drained\n");
    } else {
        let reason = drain["reason"].as_str().unwrap_or("(no valid record)");
        let mut line = format!("drain:  {reason}");
        if let Some(by) = drain["by"].as_str() {
            line.push_str(&format!(", by {by}"));
        }
        if let Some(since) = drain["since"].as_str() {
            line.push_str(&format!(", since {since}"));
        }
        if let Some(until) = drain["until"].as_str() {
            line.push_str(&format!(", until {until}"));
        }
        if drain["expired"].as_bool() == Some(true) {
            line.push_str(" - EXPIRED, no longer counts; `pmcheck undrain` removes it");
        }
        if let Some(problem) = drain["problem"].as_str() {
            line.push_str(&format!(" ({problem})"));
        }
        out.push_str(&line);
        out.push('\n');
    }
    let probe = &json["probe"];
    let ms = |v: &Value| v.as_u64().map_or("-".to_owned(), |n| format!("{n} ms"));
    out.push_str(&format!(
        "probe:  {} - {} (took {}, {} ago) {}\n",
        if probe["ok"].as_bool() == Some(true) {
            "ok"
        } else {
            "failed"
        },
        text(&probe["detail"]),
        ms(&probe["latency_ms"]),
        ms(&probe["age_ms"]),
        probe["endpoint"].as_str().unwrap_or("")
    ));
    out
}
