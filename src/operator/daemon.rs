//! The running daemon as the operator's commands reach it: one GET of its JSON answer over
//! plain HTTP on this host, bounded in time and size.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::crypto::ring;
use thiserror::Error;

use crate::health::answer::Answer;
use crate::health::verdict::Verdict;
use crate::operator::goal::Wait;
use crate::settings::duration::format_duration;

const DEADLINE: Duration = Duration::from_secs(5);
/// The largest answer read: pmcheck's JSON is well under 4 KiB.
const BODY_LIMIT: usize = 64 * 1024;

/// Why the daemon could not be asked.
#[derive(Debug, Error)]
pub enum StatusError {
    /// `--url` is not an http:// URL.
    #[error("--url {url}: {problem}; write it as http://HOST:PORT/")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// Nothing answered, or the exchange broke.
    #[error("cannot reach pmcheck at {url}: {}", said(.source))]
    Unreachable {
        /// The URL asked.
        url: String,
        /// What reqwest saw.
        source: reqwest::Error,
    },
    /// An answer larger than pmcheck ever sends.
    #[error(
        "cannot reach pmcheck at {url}: the answer is larger than {} KiB, which pmcheck never \
         sends: is this pmcheck?",
        BODY_LIMIT / 1024
    )]
    TooLarge {
        /// The URL asked.
        url: String,
    },
}

/// The daemon's reply: its HTTP status and body.
pub struct Reply {
    /// The HTTP status: 200 when the daemon answers HAProxy OK.
    pub status: u16,
    /// The JSON body as sent.
    pub body: String,
}

/// GETs `url` (its `/status` when it names no path) with `Accept: application/json`, within
/// five seconds.
pub async fn ask(url: &str) -> Result<Reply, StatusError> {
    let bad = |problem| StatusError::Url {
        url: url.to_owned(),
        problem,
    };
    let mut parsed = reqwest::Url::parse(url).map_err(|_| bad("not a URL"))?;
    if parsed.scheme() != "http" {
        return Err(bad("only http:// is supported (pmcheck serves plain HTTP)"));
    }
    // `--url` names the daemon; its operator's view is `/status` (a daemon before that route
    // answers the same JSON there, for the `Accept` header below).
    if parsed.path() == "/" {
        parsed.set_path(crate::responder::http::STATUS_PATH);
    }
    let unreachable = |source| StatusError::Unreachable {
        url: url.to_owned(),
        source,
    };
    // reqwest needs a TLS setup even for plain HTTP; this one trusts nothing, so it can never
    // be used for anything but http://.
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map(|tls| {
            tls.with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        });
    let mut client = reqwest::Client::builder();
    if let Ok(tls) = tls {
        client = client.tls_backend_preconfigured(tls);
    }
    let client = client
        .no_proxy()
        // Not a load balancer: the daemon does not count this request as a poller's.
        .user_agent(crate::responder::http::USER_AGENT)
        .timeout(DEADLINE)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(unreachable)?;
    let mut response = client
        .get(parsed)
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(unreachable)?;
    let status = response.status().as_u16();
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
        if body.len() + chunk.len() > BODY_LIMIT {
            return Err(StatusError::TooLarge {
                url: url.to_owned(),
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Reply {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// Why the exchange failed, in words: a daemon that accepted the connection and closed it
/// unanswered refused this host (its `--allow`), which a dead daemon never does.
fn said(e: &reqwest::Error) -> String {
    if closed_unanswered(e) {
        return "it closed the connection without answering: refused by its --allow \
                (PMCHECK_ALLOW), which must admit this host (127.0.0.1/32 and ::1/128) for \
                `pmcheck status`, the waits and `cycle`; or shedding connections under load \
                (its log says which)"
            .to_owned();
    }
    format!("{} (is `pmcheck serve` running there?)", cause(e))
}

/// Whether the connection was taken and then closed, or reset, before any answer.
fn closed_unanswered(e: &reqwest::Error) -> bool {
    let mut inner: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = inner {
        if err
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_incomplete_message)
            || err.downcast_ref::<std::io::Error>().is_some_and(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof
                )
            })
        {
            return true;
        }
        inner = err.source();
    }
    false
}

/// The innermost cause reqwest saw, or that it timed out.
fn cause(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return format!("no answer within {}", format_duration(DEADLINE));
    }
    let mut inner: &dyn std::error::Error = e;
    while let Some(next) = inner.source() {
        inner = next;
    }
    inner.to_string()
}

/// The daemon watches another drain record than the command changed.
#[derive(Debug, Error)]
#[error(
    "the daemon at {url} watches the drain record {theirs}, not {ours}: it does not see this drain; pass the daemon's --state-dir, or the --url of the daemon that watches {ours}"
)]
pub struct OtherFile {
    /// The daemon asked.
    pub url: String,
    /// The record the command changed.
    pub ours: String,
    /// The record the daemon watches.
    pub theirs: String,
}

/// The daemon's answer names another drain record than the command's.
pub fn other_file(how: &Wait, answer: &Answer<'_>) -> Option<OtherFile> {
    let ours = how.drain_file.as_ref()?.display().to_string();
    let theirs = answer.drain_file.as_deref()?;
    // The daemon resolved its path when it started: resolve it again here, where the state
    // directory may exist by now.
    let resolved = crate::drain::file::DrainFile::new(
        std::path::Path::new(theirs)
            .parent()
            .unwrap_or(std::path::Path::new("/")),
    )
    .resolved()
    .display()
    .to_string();
    (theirs != ours && resolved != ours).then(|| OtherFile {
        url: how.url.clone(),
        ours,
        theirs: theirs.to_owned(),
    })
}

/// What the daemon answers right after a drain or an undrain, asked for up to two seconds
/// (it sees the record within milliseconds): `Ok` with its answer once it is `DRAINED`
/// (`drained`) or not; `Err` with a warning when it cannot be asked, watches another record, or
/// still answers otherwise.
pub async fn daemon_answer(how: &Wait, drained: bool) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let last = match ask(&how.url).await {
            Err(e) => {
                return Err(format!(
                    "{e}; the record is written, and a daemon watching it answers accordingly from its start"
                ));
            }
            Ok(reply) => match Answer::from_json(&reply.body) {
                Err(e) => return Err(format!("{} does not answer like pmcheck ({e})", how.url)),
                Ok(answer) => {
                    if let Some(e) = other_file(how, &answer) {
                        return Err(e.to_string());
                    }
                    let said = format!(
                        "pmcheck at {} answers {} ({}): {}",
                        how.url,
                        answer.verdict.as_str(),
                        answer.status,
                        answer.reason
                    );
                    if (answer.verdict == Verdict::Drained) == drained {
                        return Ok(said);
                    }
                    said
                }
            },
        };
        if Instant::now() >= deadline {
            return Err(format!("after 2s, {last}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
