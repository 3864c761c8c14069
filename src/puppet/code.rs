//! What code this master serves: the deploy record r10k (and Code Manager, which runs r10k)
//! writes into each environment it deploys, `.r10k-deploy.json`. A master whose deploy failed
//! keeps compiling old catalogues without a word; Prometheus compares the masters' commits
//! (`PmcheckCodeDiverged`). Read for the operator and Prometheus, never for the verdict: a
//! missing or unreadable record is shown as such, not as an error.
//!
//! The record, as r10k 3.15 writes it (`r10k deploy environment`, Debian's package):
//!
//! ```json
//! { "name": "production", "signature": "753f061ba2e22128aa61a0ec75b6cfe8aa60eb07",
//!   "started_at": "2026-11-24 11:40:32 +0000", "finished_at": "2026-11-24 11:40:32 +0000",
//!   "deploy_success": true, "module_deploys": [] }
//! ```
//!
//! The times are Ruby's `Time#to_s`, not RFC 3339; RFC 3339 is accepted too.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use serde::Deserialize;

use crate::puppet::client::PuppetClient;
use crate::puppet::file_sync::{self, FileSync};
use crate::reading::off_workers;

/// The record's file name in an environment's directory.
pub const RECORD: &str = ".r10k-deploy.json";

/// A record larger than this is not r10k's (a few hundred bytes, plus one line per module).
const MAX_RECORD_BYTES: u64 = 1024 * 1024;

/// The longest commit kept: a git SHA-256 commit is 64 hex digits.
const MAX_COMMIT: usize = 64;

/// How often the daemon re-reads the records: a deploy shows in a scrape within this.
pub const REFRESH: Duration = Duration::from_secs(10);

/// Puppet Server is asked for its file sync client's status every this many re-reads (a
/// minute): an HTTPS request, where a record is a small file.
const FILE_SYNC_EVERY: u32 = 6;

/// One reading: the records, and what file sync says (Puppet Enterprise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// Each `--code-environment`'s record.
    pub deployments: Vec<Deployment>,
    /// Puppet Server's file sync client.
    pub file_sync: FileSync,
}

/// The daemon's reader of the records (off the async workers) and, every minute, of Puppet
/// Server's file sync status, for [`crate::reading::refresh`] every [`REFRESH`]. A Puppet
/// Server that has never shown a file sync client and cannot be reached still has none (open
/// source stays silent while it restarts).
pub struct Reader {
    environments: Environments,
    puppet: Arc<PuppetClient>,
    round: u32,
    file_sync: FileSync,
}

impl Reader {
    /// Reads `environments`' records, and asks `puppet` for file sync.
    pub fn new(environments: Environments, puppet: Arc<PuppetClient>) -> Self {
        Self {
            environments,
            puppet,
            round: 0,
            file_sync: FileSync::Absent,
        }
    }

    /// One reading.
    pub async fn read(&mut self) -> Option<Reading> {
        let environments = self.environments.clone();
        let deployments = off_workers(move || environments.read())
            .await
            .unwrap_or_default();
        if self.round.is_multiple_of(FILE_SYNC_EVERY) {
            self.file_sync = match self.puppet.service_status(file_sync::SERVICE).await {
                Ok((status, body)) => file_sync::read(status, &body, &self.environments.names),
                Err(_) if self.file_sync == FileSync::Absent => FileSync::Absent,
                Err(why) => FileSync::Unreadable(why),
            };
        }
        self.round = self.round.wrapping_add(1);
        Some(Reading {
            deployments,
            file_sync: self.file_sync.clone(),
        })
    }
}

/// What one environment's directory says about its deploy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    /// The environment's name, as `--code-environment` gave it.
    pub environment: String,
    /// What was found.
    pub found: Found,
}

/// An environment's deploy, as far as its directory tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The record, read.
    Record {
        /// Its path.
        path: PathBuf,
        /// What it says.
        record: Record,
    },
    /// No directory of that name on the environmentpath.
    NoEnvironment,
    /// The environment has no record: it was not deployed by r10k or Code Manager.
    NoRecord {
        /// Where the record would be.
        path: PathBuf,
    },
    /// The record could not be read or understood.
    Unreadable {
        /// Its path.
        path: PathBuf,
        /// Why, in words.
        why: String,
    },
}

/// A deploy record's facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// `signature`: the control repository's commit the environment holds.
    pub commit: Option<String>,
    /// `deploy_success`: whether r10k deployed everything (modules too).
    pub success: Option<bool>,
    /// `started_at`, in seconds since the epoch.
    pub started_at: Option<i64>,
    /// `finished_at`, in seconds since the epoch.
    pub finished_at: Option<i64>,
}

/// The record's fields pmcheck reads; the rest (`name`, `module_deploys`) are skipped.
#[derive(Deserialize)]
struct Raw {
    signature: Option<String>,
    deploy_success: Option<bool>,
    started_at: Option<String>,
    finished_at: Option<String>,
}

/// Where to look and for what: puppet.conf's `environmentpath` and `--code-environment`.
#[derive(Debug, Clone)]
pub struct Environments {
    /// `environmentpath`: directories separated by `:`; the first holding an environment wins.
    pub environmentpath: String,
    /// The environments to read.
    pub names: Vec<String>,
}

impl Environments {
    /// Reads each environment's record now.
    pub fn read(&self) -> Vec<Deployment> {
        self.names
            .iter()
            .map(|name| Deployment {
                environment: name.clone(),
                found: match locate(&self.environmentpath, name) {
                    Some(dir) => read_record(&dir.join(RECORD)),
                    None => Found::NoEnvironment,
                },
            })
            .collect()
    }
}

/// The environment's directory: the first directory of the path holding one of that name, as
/// Puppet looks (a symlink to a directory counts, as Code Manager's versioned directories are).
fn locate(environmentpath: &str, name: &str) -> Option<PathBuf> {
    environmentpath
        .split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(name))
        .find(|dir| dir.is_dir())
}

fn read_record(path: &Path) -> Found {
    let unreadable = |why: String| Found::Unreadable {
        path: path.to_owned(),
        why,
    };
    let bytes = match crate::safe_file::read(path, MAX_RECORD_BYTES) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Found::NoRecord {
                path: path.to_owned(),
            };
        }
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            return unreadable(format!(
                "is larger than {} KiB: not a deploy record r10k writes",
                MAX_RECORD_BYTES / 1024
            ));
        }
        Err(e) => return unreadable(format!("cannot be read: {e}")),
    };
    parse(&bytes).map_or_else(unreadable, |record| Found::Record {
        path: path.to_owned(),
        record,
    })
}

/// A record's facts from its bytes; what does not fit is said in words.
pub fn parse(bytes: &[u8]) -> Result<Record, String> {
    let raw: Raw = serde_json::from_slice(bytes)
        .map_err(|e| format!("is not r10k's JSON deploy record: {e}"))?;
    let time = |field: &str, value: Option<String>| -> Result<Option<i64>, String> {
        value
            .map(|text| {
                parse_time(&text).ok_or_else(|| {
                    format!(
                        "{field} {:?} is not a time (r10k writes `2024-01-02 03:04:05 +0000`)",
                        crate::text::one_line(&text, 64)
                    )
                })
            })
            .transpose()
    };
    if let Some(s) = raw.signature.as_deref().filter(|s| !is_commit(s)) {
        return Err(format!(
            "signature {:?} is not a commit (at most {MAX_COMMIT} letters, digits and ._-)",
            crate::text::one_line(s, 80)
        ));
    }
    Ok(Record {
        commit: raw.signature,
        success: raw.deploy_success,
        started_at: time("started_at", raw.started_at)?,
        finished_at: time("finished_at", raw.finished_at)?,
    })
}

/// A commit id fit for a label value: git's hex, or another source's revision.
fn is_commit(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_COMMIT
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Ruby's `Time#to_s` (`2024-01-02 03:04:05 +0000`) or RFC 3339, in seconds since the epoch.
pub fn parse_time(text: &str) -> Option<i64> {
    let at = crate::puppet::timestamp::parse(text)?;
    i64::try_from(at.duration_since(UNIX_EPOCH).ok()?.as_secs()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rubys_time_and_rfc_3339_are_the_same_instant() {
        let utc = parse_time("2026-11-24 11:40:32 +0000");
        assert_eq!(utc, Some(1_795_520_432));
        assert_eq!(parse_time("2026-11-24T11:40:32Z"), utc);
        assert_eq!(parse_time("2026-11-24 12:40:32 +0100"), utc);
        assert_eq!(parse_time("2026-11-24T06:40:32-05:00"), utc);
        assert_eq!(parse_time("2026-11-24T11:40:32.250Z"), utc);
        for bad in ["yesterday", "2026-11-24", "2026-11-24 11:40:32 +01", ""] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_record_r10k_wrote_is_read() {
        let record = parse(include_bytes!("../../tests/fixtures/r10k-deploy.json"))
            .expect("r10k's own record parses");
        assert_eq!(
            record.commit.as_deref(),
            Some("753f061ba2e22128aa61a0ec75b6cfe8aa60eb07")
        );
        assert_eq!(record.success, Some(true));
        assert_eq!(record.finished_at, Some(1_795_520_432));
    }

    #[test]
    fn what_does_not_fit_is_said() {
        let why = |json: &str| parse(json.as_bytes()).expect_err(json);
        assert!(why("{").contains("not r10k's JSON"));
        assert!(why(r#"{"signature": 7}"#).contains("not r10k's JSON"));
        assert!(why(r#"{"signature": "a\"b"}"#).contains("is not a commit"));
        assert!(why(r#"{"finished_at": "soon"}"#).contains("finished_at \"soon\" is not a time"));
        let empty = parse(b"{}").expect("no field is required");
        assert_eq!(empty.commit, None);
    }

    #[test]
    fn the_first_directory_of_the_path_holding_the_environment_wins() {
        let root = std::env::temp_dir().join(format!("pmcheck-code-{}", std::process::id()));
        let (a, b) = (root.join("a"), root.join("b"));
        std::fs::create_dir_all(b.join("production")).expect("temp dir");
        std::fs::create_dir_all(a.join("staging")).expect("temp dir");
        std::fs::create_dir_all(b.join("staging")).expect("temp dir");
        let path = format!("{}::{}", a.display(), b.display());
        assert_eq!(locate(&path, "production"), Some(b.join("production")));
        assert_eq!(locate(&path, "staging"), Some(a.join("staging")));
        assert_eq!(locate(&path, "dev"), None);
        let _ = std::fs::remove_dir_all(&root);
    }
}
