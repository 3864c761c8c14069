//! The running daemon as the operator's commands reach it: one client per command, made once,
//! that GETs the daemon's `/status` over plain HTTP on this host, bounded in time and size, and
//! reads it into a [`View`].

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use rustls::crypto::ring;
use thiserror::Error;

use crate::operator::config::{env_file, shuts_out_loopback};
use crate::operator::view::View;
use crate::protocol::Status;
use crate::protocol::progress::Ask;
use crate::settings::allow::parse_network;
use crate::settings::duration::format_duration;
use crate::settings::env_file::EnvFile;

const DEADLINE: Duration = Duration::from_secs(5);
/// How often a command asks the daemon, whatever it waits for: one interval for every loop.
pub const EVERY: Duration = Duration::from_millis(250);
/// The largest answer read: pmcheck's JSON is a few KiB.
const BODY_LIMIT: usize = 64 * 1024;

/// Why the daemon could not be asked.
#[derive(Debug, Error)]
pub enum StatusError {
    /// `--url` is not an http:// URL.
    #[error("--url {url}: {problem}; write it as http://HOST:PORT/")]
    Url { url: String, problem: &'static str },
    /// The client cannot be made.
    #[error("cannot make an HTTP client: {0}")]
    Client(reqwest::Error),
    /// Nothing answered, or the exchange broke.
    #[error("cannot reach pmcheck at {url}: {}", said(.source))]
    Unreachable { url: String, source: reqwest::Error },
    /// An answer larger than pmcheck ever sends.
    #[error(
        "cannot reach pmcheck at {url}: the answer is larger than {} KiB, which pmcheck never \
         sends: is this pmcheck?",
        BODY_LIMIT / 1024
    )]
    TooLarge { url: String },
    /// A daemon of another version (`theirs`, empty when it says none), whose `/status` has no
    /// progress answer: never read as "nothing pending".
    #[error(
        "pmcheck at {url} is {}, this command is {}: its /status has no progress answer, which \
         this command reads; run one version (after a package upgrade, `systemctl restart \
         pmcheck`)",
        if .theirs.is_empty() { "an older version" } else { .theirs.as_str() },
        crate::protocol::VERSION
    )]
    OtherVersion { url: String, theirs: String },
    /// An answer that is not pmcheck's JSON.
    #[error("{url} does not answer like pmcheck ({source})")]
    NotPmcheck {
        url: String,
        source: serde_json::Error,
    },
}

impl StatusError {
    /// Nothing listens at the URL (the connection was refused): no daemon runs there, so none
    /// answers the load balancers either. Any other failure may be a daemon that answers them
    /// but not this command.
    pub fn absent(&self) -> bool {
        matches!(self, StatusError::Unreachable { source, .. } if source.is_connect() && !source.is_timeout())
    }
}

/// The daemon's reply: its HTTP status and body.
pub struct Reply {
    /// The HTTP status: 200 when the daemon answers HAProxy OK.
    pub status: u16,
    pub body: String,
}

/// The daemon at `--url`, asked by one HTTP client for the whole command.
#[derive(Debug, Clone)]
pub struct Daemon {
    /// The URL as given, for messages.
    pub url: String,
    status: reqwest::Url,
    client: reqwest::Client,
}

impl Daemon {
    /// The daemon at `url` (its `/status` when the URL names no path).
    pub fn new(url: &str) -> Result<Self, StatusError> {
        let bad = |problem| StatusError::Url {
            url: url.to_owned(),
            problem,
        };
        let mut status = reqwest::Url::parse(url).map_err(|_| bad("not a URL"))?;
        if status.scheme() != "http" {
            return Err(bad("only http:// is supported (pmcheck serves plain HTTP)"));
        }
        if status.path() == "/" {
            status.set_path(crate::protocol::STATUS_PATH);
        }
        // reqwest needs a TLS setup even for plain HTTP; this one trusts nothing, so it can
        // never be used for anything but http://.
        let provider = Arc::new(ring::default_provider());
        let mut client = reqwest::Client::builder();
        if let Ok(tls) = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
        {
            let tls = tls.with_root_certificates(rustls::RootCertStore::empty());
            client = client.tls_backend_preconfigured(tls.with_no_client_auth());
        }
        let client = client
            .no_proxy()
            // Not a load balancer: the daemon does not count this request as a poller's.
            .user_agent(crate::protocol::USER_AGENT)
            .timeout(DEADLINE)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(StatusError::Client)?;
        Ok(Self {
            url: url.to_owned(),
            status,
            client,
        })
    }

    /// One GET of `/status` asking with `ask` (its query), within five seconds: the reply as it
    /// came.
    pub async fn reply(&self, ask: &Ask) -> Result<Reply, StatusError> {
        let url = || self.url.clone();
        let unreachable = |source| StatusError::Unreachable { url: url(), source };
        let mut asked = self.status.clone();
        asked.set_query(Some(&ask.query()));
        let mut response = (self.client.get(asked))
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(unreachable)?;
        let status = response.status().as_u16();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
            if body.len() + chunk.len() > BODY_LIMIT {
                return Err(StatusError::TooLarge { url: url() });
            }
            body.extend_from_slice(&chunk);
        }
        let body = String::from_utf8_lossy(&body).into_owned();
        Ok(Reply { status, body })
    }

    /// The one loop of the operator's commands: asks with `ask()` every [`EVERY`] until `step`
    /// breaks with its result, given what the daemon says, read, with its progress.
    pub async fn asking<T>(
        &self,
        ask: impl Fn() -> Ask,
        mut step: impl FnMut(Result<View, StatusError>) -> ControlFlow<T>,
    ) -> T {
        loop {
            let url = || self.url.clone();
            let view = self.reply(&ask()).await.and_then(|reply| {
                let status = Status::from_json(&reply.body)
                    .map_err(|source| StatusError::NotPmcheck { url: url(), source })?;
                View::new(status).map_err(|theirs| StatusError::OtherVersion { url: url(), theirs })
            });
            if let ControlFlow::Break(done) = step(view) {
                return done;
            }
            tokio::time::sleep(EVERY).await;
        }
    }

    /// What the daemon says now, read, with its progress for the waits' defaults.
    pub async fn ask(&self) -> Result<View, StatusError> {
        self.asking(Ask::default, ControlFlow::Break).await
    }
}

/// Why the exchange failed, in words: a daemon that accepted the connection and closed it
/// unanswered refused this host (its `--allow`) or shed the connection under load, which a
/// dead daemon never does; the service's environment file, when it can be read, tells which.
fn said(e: &reqwest::Error) -> String {
    use std::io::ErrorKind::{ConnectionReset, UnexpectedEof};
    // `e` and its sources, outermost first.
    let first: &(dyn std::error::Error + 'static) = e;
    let chain = || std::iter::successors(Some(first), |e| e.source());
    // Taken and then closed, or reset, before any answer.
    let closed_unanswered = chain().any(|err| {
        (err.downcast_ref::<hyper::Error>()).is_some_and(hyper::Error::is_incomplete_message)
            || (err.downcast_ref::<std::io::Error>())
                .is_some_and(|io| matches!(io.kind(), ConnectionReset | UnexpectedEof))
    });
    if !closed_unanswered {
        // The innermost cause reqwest saw, or that it timed out.
        let cause = if e.is_timeout() {
            format!("no answer within {}", format_duration(DEADLINE))
        } else {
            chain().last().map(ToString::to_string).unwrap_or_default()
        };
        return format!("{cause} (is `pmcheck serve` running there?)");
    }
    let given = std::env::var_os("PMCHECK_ENV_FILE").map(PathBuf::from);
    refused(env_file(given.as_deref()).ok().flatten().as_ref())
}

/// Why a daemon closed this host's connection unanswered, by the `PMCHECK_ALLOW` of its
/// environment `file` (as the service reads it): both causes when there is none to read.
fn refused(file: Option<&EnvFile>) -> String {
    const CLOSED: &str = "it closed the connection without answering";
    const ADMIT: &str = "which must admit this host (127.0.0.1/32 and ::1/128) for `pmcheck status`, the waits and `cycle`";
    const SHED: &str =
        "shed the connection under load (a flood of connections; its log says `shed`)";
    let Some(file) = file else {
        return format!("{CLOSED}: refused by its --allow (PMCHECK_ALLOW), {ADMIT}; or it {SHED}");
    };
    let path = file.path.display();
    let allow = file.get("PMCHECK_ALLOW").unwrap_or_default();
    let nets: Vec<IpNet> = (allow.split(',').map(str::trim).filter(|n| !n.is_empty()))
        .filter_map(|n| parse_network(n).ok())
        .collect();
    if shuts_out_loopback(&nets) {
        return format!(
            "{CLOSED}: refused by its --allow: PMCHECK_ALLOW in {path} is {allow}, {ADMIT}"
        );
    }
    let allow = if nets.is_empty() { "unset" } else { allow };
    format!("{CLOSED}: {path} lets this host in (PMCHECK_ALLOW {allow}), so the daemon {SHED}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_refusal_names_the_cause_the_service_file_shows() {
        let file = |text: &str| EnvFile::parse(Path::new("/etc/default/pmcheck"), text);
        let both = refused(None);
        assert!(both.contains("--allow") && both.contains("shed"), "{both}");
        let allow = refused(Some(&file("PMCHECK_ALLOW=\"10.0.0.0/8, 192.0.2.7/32\"\n")));
        assert!(
            allow.contains("PMCHECK_ALLOW in /etc/default/pmcheck is 10.0.0.0/8, 192.0.2.7/32")
        );
        assert!(!allow.contains("shed"), "{allow}");
        for text in [
            "",
            "PMCHECK_ALLOW=10.0.0.0/8,127.0.0.1/32\n",
            "PMCHECK_ALLOW=::1/128\n",
        ] {
            let shed = refused(Some(&file(text)));
            assert!(
                shed.contains("shed the connection") && !shed.contains("refused by"),
                "{shed}"
            );
        }
    }
}
