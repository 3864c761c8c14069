//! The slow readings in the operator's JSON: the deploy records and the certificates' dates.

use serde::{Deserialize, Serialize};

use crate::puppet::code::{Found, Reading};
use crate::puppet::expiry::{self, Expiries};
use crate::puppet::file_sync::FileSync;

/// One environment's deploy record ([`crate::puppet::code`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeAnswer {
    /// The environment.
    pub environment: String,
    /// `deployed`, `failed` (`deploy_success` false), `no_environment` (no directory on the
    /// environmentpath), `no_record` or `unreadable`.
    pub state: String,
    /// The record's path (where it would be, for `no_record`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `signature`: the commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// `started_at`, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// `finished_at`, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Seconds since `finished_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<i64>,
    /// Why the record is unreadable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Puppet Enterprise's file sync: its `status` for this environment (`ok`, what went
    /// wrong, or `unreadable: ...`); absent without a file sync client (open source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_sync_status: Option<String>,
    /// File sync's own commit for this environment (not the control repository's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_sync_commit: Option<String>,
}

impl CodeAnswer {
    /// Each deployment read, with its age at `now` (seconds since the epoch) and what file
    /// sync says of it.
    pub fn of(reading: &Reading, now: i64) -> Vec<Self> {
        reading
            .deployments
            .iter()
            .map(|d| {
                // An unreadable file sync says nothing of any environment.
                let synced = reading.file_sync.of(&d.environment);
                let mut answer = CodeAnswer {
                    environment: d.environment.clone(),
                    file_sync_status: match &reading.file_sync {
                        FileSync::Unreadable(why) => Some(format!("unreadable: {why}")),
                        _ => synced.map(|s| s.status.clone().unwrap_or_else(|| "none".into())),
                    },
                    file_sync_commit: synced.and_then(|s| s.commit.clone()),
                    ..CodeAnswer::default()
                };
                let (state, path) = match &d.found {
                    Found::Record { path, record } => {
                        answer.commit.clone_from(&record.commit);
                        answer.started_at = record.started_at.map(expiry::timestamp);
                        answer.finished_at = record.finished_at.map(expiry::timestamp);
                        answer.age_seconds = record.finished_at.map(|t| now - t);
                        match record.success {
                            Some(false) => ("failed", Some(path)),
                            _ => ("deployed", Some(path)),
                        }
                    }
                    Found::NoEnvironment => ("no_environment", None),
                    Found::NoRecord { path } => ("no_record", Some(path)),
                    Found::Unreadable { path, why } => {
                        answer.why = Some(why.clone());
                        ("unreadable", Some(path))
                    }
                };
                answer.state = state.into();
                answer.path = path.map(|p| p.display().to_string());
                answer
            })
            .collect()
    }
}

/// When the files Puppet's TLS rests on stop being valid ([`crate::puppet::expiry`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CertificatesAnswer {
    /// Every certificate of hostcert and localcacert.
    pub certs: Vec<CertAnswer>,
    /// The CRL, when one was read.
    pub crl: Option<CrlAnswer>,
    /// Files that could not be read, in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
}

/// One certificate's end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CertAnswer {
    /// `hostcert` or `localcacert`.
    pub file: String,
    /// `leaf`, `intermediate` or `root`.
    pub position: String,
    /// `CN=...`.
    pub subject: String,
    /// `notAfter`, RFC 3339.
    pub not_after: String,
    /// Days until then (negative: past).
    pub days_left: f64,
}

/// The CRL's dates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrlAnswer {
    /// Its issuer.
    pub issuer: String,
    /// `thisUpdate`, RFC 3339.
    pub this_update: String,
    /// `nextUpdate`, RFC 3339, when it has one.
    pub next_update: Option<String>,
    /// Days until `nextUpdate` (negative: past).
    pub days_left: Option<f64>,
}

impl CertificatesAnswer {
    /// The dates read, with the days left at `now` (seconds since the epoch).
    pub fn of(e: &Expiries, now: i64) -> Self {
        let days = |end: i64| ((end - now) as f64 / 86_400.0 * 10.0).round() / 10.0;
        Self {
            certs: e
                .certs
                .iter()
                .map(|c| CertAnswer {
                    file: c.file.as_str().to_owned(),
                    position: c.position.as_str().to_owned(),
                    subject: c.subject.clone(),
                    not_after: expiry::timestamp(c.not_after),
                    days_left: days(c.not_after),
                })
                .collect(),
            crl: e.crl.as_ref().map(|c| CrlAnswer {
                issuer: c.issuer.clone(),
                this_update: expiry::timestamp(c.this_update),
                next_update: c.next_update.map(expiry::timestamp),
                days_left: c.next_update.map(days),
            }),
            unreadable: e.unreadable.clone(),
        }
    }
}
