//! `pmcheck status --history N`: the last drain events, read from the state directory's event
//! log (its tail only), for a person or as JSON. Needs no daemon: the log is the record.

use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::console::outln;
use crate::drain::log::DrainLog;

/// Why the event log cannot be shown.
#[derive(Debug, Error)]
#[error("cannot read the drain event log {path}: {source}{hint}", hint = hint(source))]
pub struct HistoryError {
    pub path: PathBuf,
    pub source: io::Error,
}

fn hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::PermissionDenied => {
            "; only root and the group pmcheck read it: run the command with sudo, or as a member of pmcheck"
        }
        _ => "; check --state-dir (PMCHECK_STATE_DIR)",
    }
}

/// Prints the last `n` events, oldest first: one line each, or one JSON array.
pub fn show(state_dir: &Path, n: usize, json: bool) -> Result<(), HistoryError> {
    let log = DrainLog::new(state_dir);
    let fail = |source| HistoryError {
        path: log.path().to_owned(),
        source,
    };
    let events = log.tail(n).map_err(fail)?;
    if json {
        let text = serde_json::to_string_pretty(&events).map_err(|e| fail(e.into()))?;
        outln!("{text}");
    } else if events.is_empty() {
        outln!("no drain events in {}", log.path().display());
    } else {
        for event in &events {
            outln!("{}", event.describe());
        }
    }
    Ok(())
}
