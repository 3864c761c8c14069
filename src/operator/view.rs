//! One answer of the daemon as a command holds it: the `/status` it read
//! ([`crate::protocol`], whose lines and progress say what the load balancers did), and
//! whether it is about the drain record the command changed.

use std::ops::Deref;
use std::path::Path;

use thiserror::Error;

use crate::drain::file::DrainFile;
use crate::protocol::{Progress, Status};

/// One answer of the daemon, as read.
#[derive(Debug, Clone)]
pub struct View {
    status: Status<'static>,
    /// Where a drain, an undrain and a restart stand, as the daemon decided.
    pub progress: Progress,
}

impl Deref for View {
    type Target = Status<'static>;

    fn deref(&self) -> &Status<'static> {
        &self.status
    }
}

/// The daemon watches another drain record than the command changed.
#[derive(Debug, Error)]
#[error(
    "the daemon at {url} watches the drain record {theirs}, not {ours}: it does not see this drain; pass the daemon's --state-dir, or the --url of the daemon that watches {ours}"
)]
pub struct OtherFile {
    pub url: String,
    /// The record the command changed.
    pub ours: String,
    /// The record the daemon watches.
    pub theirs: String,
}

impl View {
    /// The daemon's answer `status`, with its `progress` taken out; `Err` with the version it
    /// says when it sends none (a daemon of another version).
    pub fn new(mut status: Status<'static>) -> Result<Self, String> {
        match status.progress.take() {
            Some(progress) => Ok(Self { status, progress }),
            None => Err(status.version),
        }
    }

    /// The daemon watches another drain record than `ours` (the command's, resolved), asked
    /// at `url`.
    pub fn other_file(&self, url: &str, ours: &Path) -> Option<OtherFile> {
        let ours = ours.display().to_string();
        let theirs = &self.status.drain_file;
        // The daemon resolved its path when it started: resolve it again here, where the state
        // directory may exist by now.
        let dir = Path::new(theirs).parent().unwrap_or(Path::new("/"));
        let resolved = DrainFile::new(dir).resolved().display().to_string();
        (*theirs != ours && resolved != ours).then(|| OtherFile {
            url: url.to_owned(),
            ours,
            theirs: theirs.clone(),
        })
    }
}
