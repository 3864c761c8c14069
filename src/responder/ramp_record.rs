//! The slow start under way, kept across a restart of pmcheck: `STATE_DIR/ramp`, the wall-clock
//! time the ramp began. A package upgrade restarts the daemon, and a new daemon starts steady
//! (a first OK ramps nothing: HAProxy never took the node out), so a ramp under way jumped to
//! 100% (a new operator saw 31 go straight to 100). The file is written when a ramp begins and
//! removed when it ends or the node goes out; a new daemon resumes a ramp it names.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::drain::file::DrainFile;

/// The record's name in the state directory.
pub const NAME: &str = "ramp";

/// How far into a ramp of length `over` the record in `dir` says the node is, when one is
/// under way `now`.
pub fn under_way(dir: &Path, over: Duration, now: SystemTime) -> Option<Duration> {
    let bytes = crate::safe_file::read_state(&dir.join(NAME), 256).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let began = humantime::parse_rfc3339(text.trim()).ok()?;
    let elapsed = now.duration_since(began).ok()?;
    (elapsed < over).then_some(elapsed)
}

/// Keeps in `dir` the start of the ramp under way (`Some`), or that none is (`None`), on the
/// blocking pool; awaited, so that two changes land in their order. A failure costs only the
/// resumption after a restart: logged at debug level.
pub async fn keep(dir: PathBuf, began: Option<SystemTime>) {
    let kept = tokio::task::spawn_blocking(move || {
        let path = dir.join(NAME);
        let result = match began {
            Some(t) => {
                let text = format!("{}\n", humantime::format_rfc3339_millis(t));
                DrainFile::new(&dir).replace(&path, text.as_bytes())
            }
            None => std::fs::remove_file(&path).or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            }),
        };
        if let Err(e) = result {
            tracing::debug!(file = %path.display(), error = %e, "cannot keep the ramp");
        }
    });
    let _ = kept.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ramp_under_way_is_read_back_and_an_ended_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let over = Duration::from_secs(60);
        let now = SystemTime::now();
        assert_eq!(under_way(dir.path(), over, now), None);
        let began = now - Duration::from_secs(20);
        let text = format!("{}\n", humantime::format_rfc3339_millis(began));
        std::fs::write(dir.path().join(NAME), text).unwrap();
        let elapsed = under_way(dir.path(), over, now).expect("under way");
        assert!(elapsed.abs_diff(Duration::from_secs(20)) < Duration::from_millis(2));
        assert_eq!(under_way(dir.path(), over, now + over), None, "ended");
        std::fs::write(dir.path().join(NAME), "yesterday").unwrap();
        assert_eq!(under_way(dir.path(), over, now), None, "not a time");
    }
}
