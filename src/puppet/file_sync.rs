//! Puppet Enterprise's file sync client, as its status tells
//! (`/status/v1/services/file-sync-client-service?level=debug`): whether file sync last
//! deployed each environment into this compiler, and its commit. Those commits are file sync's
//! own (of the `puppet-code` repository it keeps), not the control repository's: the deploy
//! record ([`crate::puppet::code`]) has that one. Shown beside the record, never in the verdict.
//!
//! Open source Puppet Server has no such service (404). PE could not be run here: the shape read
//! is that of a hand-made fixture (`tests/fixtures/pe-file-sync-client-service-debug.json`).

use serde_json::Value;

/// The status service's name for the file sync client.
pub const SERVICE: &str = "file-sync-client-service";

/// The repository Code Manager's environments are submodules of.
const REPO: &str = "puppet-code";

/// What Puppet Server says of its file sync client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSync {
    /// No file sync client: open source, or not asked yet.
    Absent,
    /// The client's state (`running`) and, per environment asked for, what it last synced.
    Status {
        /// The service's `state`.
        state: String,
        /// Per environment, in the order asked.
        environments: Vec<(String, Synced)>,
    },
    /// The status could not be read, in words.
    Unreadable(String),
}

/// What file sync last did to one environment; both `None` when it has no entry for it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Synced {
    /// Its `status`: `ok`, or what went wrong.
    pub status: Option<String>,
    /// `latest_commit.commit`: file sync's commit.
    pub commit: Option<String>,
}

impl FileSync {
    /// What file sync says of `environment`, when it says anything.
    pub fn of(&self, environment: &str) -> Option<&Synced> {
        match self {
            FileSync::Status { environments, .. } => environments
                .iter()
                .find(|(name, _)| name == environment)
                .map(|(_, synced)| synced),
            _ => None,
        }
    }
}

/// Reads an answer of the status service: 404 is no file sync client (open source).
pub fn read(status: u16, body: &[u8], environments: &[String]) -> FileSync {
    if status == 404 {
        return FileSync::Absent;
    }
    let all: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return FileSync::Unreadable(format!(
                "{SERVICE} answered HTTP {status} without a JSON status: {e}"
            ));
        }
    };
    let Some(state) = all.get("state").and_then(Value::as_str) else {
        return FileSync::Unreadable(format!("{SERVICE} answered HTTP {status} without a state"));
    };
    let submodules = &all["status"]["repos"][REPO]["submodules"];
    let word = |v: &Value| {
        v.as_str()
            .map(|s| crate::text::one_line(s, 64).into_owned())
    };
    FileSync::Status {
        state: crate::text::one_line(state, 32).into_owned(),
        environments: environments
            .iter()
            .map(|name| {
                let entry = &submodules[name.as_str()];
                let synced = Synced {
                    status: word(&entry["status"]),
                    commit: word(&entry["latest_commit"]["commit"]),
                };
                (name.clone(), synced)
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envs(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn each_environments_sync_is_read_from_the_made_fixture() {
        let body = include_bytes!("../../tests/fixtures/pe-file-sync-client-service-debug.json");
        let sync = read(200, body, &envs(&["production", "staging", "dev"]));
        let production = sync.of("production").expect("production is there");
        assert_eq!(production.status.as_deref(), Some("ok"));
        assert_eq!(
            production.commit.as_deref(),
            Some("0a1b2c3d4e5f60718293a4b5c6d7e8f901234567")
        );
        assert_eq!(
            sync.of("staging").and_then(|s| s.status.as_deref()),
            Some("failed")
        );
        assert_eq!(sync.of("dev"), Some(&Synced::default()));
        assert!(matches!(sync, FileSync::Status { ref state, .. } if state == "running"));
    }

    #[test]
    fn open_source_has_none_and_garbage_is_said() {
        let envs = envs(&["production"]);
        assert_eq!(read(404, b"not found", &envs), FileSync::Absent);
        let FileSync::Unreadable(why) = read(200, b"<html>", &envs) else {
            panic!("garbage is unreadable");
        };
        assert!(why.contains("without a JSON status"), "{why}");
        let FileSync::Unreadable(why) = read(503, b"{}", &envs) else {
            panic!("no state is unreadable");
        };
        assert!(why.contains("HTTP 503 without a state"), "{why}");
    }
}
