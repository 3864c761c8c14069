//! Why a probe failed, phase by phase, in the words an operator fixes it with: refused,
//! connect, TLS (spelt out), HTTP status, Puppet Server's own state, unreadable answers; and
//! why it could not be made at all (this host's identity or settings).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rustls::AlertDescription;
use thiserror::Error;

use crate::puppet::identity::IdentityError;
use crate::settings::duration::format_duration;
use crate::text;

/// Why a probe could not be made: a problem on this host, not in Puppet Server.
#[derive(Debug, Error)]
pub enum CannotProbe {
    /// The certificate, key or CA file is missing, unreadable or unusable.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// reqwest refused the TLS configuration.
    #[error("cannot set up the HTTPS client: {}", chain(.0))]
    Client(#[source] reqwest::Error),
    /// The task loading the identity files died.
    #[error("cannot set up the HTTPS client: loading the identity files failed: {0}")]
    Loader(#[source] tokio::task::JoinError),
    /// The settings could not be resolved (inetd still answers, with this as the reason).
    #[error(transparent)]
    Settings(#[from] crate::settings::SettingsError),
}

/// How Puppet Server failed the probe, phase by phase.
#[derive(Debug, Error)]
pub enum ProbeError {
    /// Nothing listens on the port.
    #[error(
        "connection to {addr} refused: Puppet Server is not listening (stopped, restarting or still starting)"
    )]
    Refused {
        /// Where pmcheck connected.
        addr: SocketAddr,
    },
    /// The TCP connection failed otherwise (unreachable, reset during connect, ...).
    #[error("cannot connect to {addr}: {}", chain(.source))]
    Connect {
        /// Where pmcheck connected.
        addr: SocketAddr,
        /// What reqwest saw.
        source: reqwest::Error,
    },
    /// The TLS handshake failed; the problem says which side and what to do.
    #[error("TLS with Puppet Server at {addr} failed: {problem}")]
    Tls {
        /// Where pmcheck connected.
        addr: SocketAddr,
        /// What was wrong.
        problem: TlsProblem,
    },
    /// No answer within the probe's deadline.
    #[error("no answer from Puppet Server at {addr} within {timeout}", timeout = format_duration(*.after))]
    Timeout {
        /// Where pmcheck connected.
        addr: SocketAddr,
        /// The deadline.
        after: Duration,
    },
    /// An HTTP status pmcheck does not expect, with what the body was.
    #[error("Puppet Server answered HTTP {status}: {body}")]
    Status {
        /// The HTTP status code.
        status: u16,
        /// The body, or what kind of body it was.
        body: Body,
    },
    /// The status service answered with a failed state (`error`, `unknown`, ...).
    #[error("Puppet Server reports `{0}`, not `running`")]
    NotRunning(String),
    /// A JSON status answer that is not a service status.
    #[error("Puppet Server's status answer (HTTP {status}) is not a service status: {problem}")]
    Unreadable {
        /// The HTTP status code.
        status: u16,
        /// What serde_json said.
        problem: String,
    },
    /// The HTTP exchange broke after connecting.
    #[error("HTTP exchange with Puppet Server at {addr} failed: {}", chain(.source))]
    Http {
        /// Where pmcheck connected.
        addr: SocketAddr,
        /// What reqwest saw.
        source: reqwest::Error,
    },
}

/// A TLS handshake failure, spelt out for the operator who has to fix it.
#[derive(Debug, Error)]
pub enum TlsProblem {
    /// Puppet Server's certificate chains to another CA.
    #[error("Puppet Server's certificate is not signed by the CA in {} (localcacert)", ca.display())]
    UnknownIssuer {
        /// The localcacert file.
        ca: PathBuf,
    },
    /// A certificate without subjectAltName cannot be verified by name at all.
    #[error(
        "Puppet Server's certificate has no subjectAltName, so it cannot be verified as {certname} \
         (issued by a CA older than Puppet Server 6.15.2/7.1.0?): regenerate it with \
         `puppetserver ca generate` or reissue it with dns_alt_names"
    )]
    NoAltName {
        /// The name pmcheck expects.
        certname: String,
    },
    /// The certificate names other hosts.
    #[error(
        "Puppet Server's certificate is for {} but pmcheck expects {certname} (the certname, \
         from {certname_from}): set --certname, or certname in puppet.conf",
        presented.join(", ")
    )]
    WrongName {
        /// The names in the certificate, as names (`puppet`, not `DnsName("puppet")`).
        presented: Vec<String>,
        /// The name pmcheck expects.
        certname: String,
        /// Where that name came from.
        certname_from: String,
    },
    /// The certificate is not valid for the name (rustls gave no names).
    #[error("Puppet Server's certificate is not valid for {certname}: set --certname")]
    NotValidForName {
        /// The name pmcheck expects.
        certname: String,
    },
    /// Puppet Server's certificate has expired.
    #[error("Puppet Server's certificate has expired")]
    Expired,
    /// Puppet Server refused this host's certificate.
    #[error(
        "Puppet Server rejected this host's certificate {} ({alert:?}): is it signed by \
         Puppet Server's CA, current and not revoked?",
        hostcert.display()
    )]
    Rejected {
        /// The TLS alert Puppet Server sent.
        alert: AlertDescription,
        /// The hostcert file.
        hostcert: PathBuf,
    },
    /// Anything else rustls reports.
    #[error(transparent)]
    Other(rustls::Error),
}

/// A response body as the verdict shows it: text on one line, or what kind of bytes it was.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Body {
    /// Text, on one line and bounded.
    #[error("{0}")]
    Text(String),
    /// Nothing at all.
    #[error("(empty body)")]
    Empty,
    /// Compressed with `encoding`, which pmcheck does not decode.
    #[error(
        "a {encoding}-compressed body of {len} bytes, which pmcheck does not decode (it asks for \
         plain text; is something between pmcheck and Puppet Server compressing?)"
    )]
    Compressed {
        /// The content encoding (from the header, or `gzip` from the magic bytes).
        encoding: String,
        /// How many bytes were read.
        len: usize,
    },
    /// Bytes that are not text.
    #[error("a binary body of {len} bytes")]
    Binary {
        /// How many bytes were read.
        len: usize,
    },
}

/// An error and its causes, outermost first. `io::Error::source()` skips the error it wraps, so
/// a wrapped error is reached through `get_ref()` instead: that is where rustls' errors sit.
pub(crate) fn causes<'e>(
    e: &'e (dyn std::error::Error + 'static),
) -> Vec<&'e (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |current| {
        current
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
            .map(|inner| inner as &(dyn std::error::Error + 'static))
            .or_else(|| current.source())
    })
    .take(16)
    .collect()
}

/// All the causes on one line, each said once.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::new();
    for cause in causes(e) {
        let next = cause.to_string();
        if !text.contains(&next) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&next);
        }
    }
    text
}

/// A body for the verdict's reason: one line, control characters escaped, at most 120 characters.
pub(crate) fn shown(text: &str) -> Body {
    match text::one_line(text, 120) {
        flat if flat.is_empty() => Body::Empty,
        flat => Body::Text(flat.into_owned()),
    }
}

/// Says what a body is when it is not text to show: compressed (pmcheck asks for none, but a
/// proxy or a misconfigured server may send it anyway) or binary.
pub(crate) fn undecodable(encoding: Option<&str>, body: &[u8]) -> Option<Body> {
    let compressed = match encoding {
        Some(e) if !e.eq_ignore_ascii_case("identity") => Some(e.to_owned()),
        _ if body.starts_with(&[0x1f, 0x8b]) => Some("gzip".to_owned()),
        _ => None,
    };
    if let Some(encoding) = compressed {
        return Some(Body::Compressed {
            encoding,
            len: body.len(),
        });
    }
    let binary = body
        .iter()
        .any(|&b| b == 0 || (b < 0x20 && !b.is_ascii_whitespace()));
    binary.then_some(Body::Binary { len: body.len() })
}

/// A name from rustls's list of a certificate's names, as a person writes it: rustls gives
/// each in its `Debug` form (`DnsName("puppet")`).
pub(crate) fn plain_name(presented: &str) -> String {
    match presented.split_once('(') {
        Some((kind, rest)) if kind.chars().all(char::is_alphanumeric) && rest.ends_with(')') => {
            rest.trim_end_matches(')').trim_matches('"').to_owned()
        }
        _ => presented.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_flattened_and_cut() {
        assert_eq!(shown("a\n  b").to_string(), "a b");
        assert_eq!(shown("").to_string(), "(empty body)");
        assert!(shown(&"x".repeat(500)).to_string().ends_with("..."));
        assert_eq!(
            shown("stopping\r\nX-Evil: 1").to_string(),
            "stopping X-Evil: 1"
        );
    }

    #[test]
    fn compressed_and_binary_bodies_are_named_not_shown() {
        let gzip = undecodable(None, &[0x1f, 0x8b, 8, 0, 0, 0])
            .unwrap()
            .to_string();
        assert_eq!(
            gzip,
            "a gzip-compressed body of 6 bytes, which pmcheck does not decode (it asks for plain \
             text; is something between pmcheck and Puppet Server compressing?)"
        );
        let br = undecodable(Some("br"), b"xyz").unwrap().to_string();
        assert!(br.starts_with("a br-compressed body"), "{br}");
        assert_eq!(
            undecodable(None, b"\x00\x01").unwrap().to_string(),
            "a binary body of 2 bytes"
        );
        assert_eq!(undecodable(Some("identity"), b"running\n"), None);
    }
}
