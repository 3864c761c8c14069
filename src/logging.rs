//! The daemon's log: under systemd every line is a native journal entry whose fields (`VERDICT`,
//! `REASON`, `PEER`, `ACTION`, ...) `journalctl -u pmcheck VERDICT=DOWN` can select; elsewhere
//! one readable line per event on stderr, the message alone.
//!
//! The journal is used only when `JOURNAL_STREAM` says stderr is the journal, as systemd
//! documents: the `device:inode` it names is fd 2's (a daemon started from a unit but with
//! stderr redirected keeps writing where it was sent).

use std::io::{self, IsTerminal as _};
use std::os::fd::AsFd as _;

use tracing_subscriber::fmt::format::debug_fn;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// Whether stderr is connected to the journal: `JOURNAL_STREAM` (`device:inode`) names fd 2.
pub fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(stat) = nix::sys::stat::fstat(io::stderr().as_fd()) else {
        return false;
    };
    stream.to_str() == Some(&format!("{}:{}", stat.st_dev, stat.st_ino))
}

/// Logs at `level` (or `RUST_LOG`), to the journal with fields when stderr is the journal and
/// journald takes entries, else as text on stderr.
pub fn init(level: &str) {
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    if stderr_is_journal() {
        // No prefix: the fields are `VERDICT=`, not `F_VERDICT=`.
        if let Ok(journal) = tracing_journald::layer() {
            let journal = journal
                .with_field_prefix(None)
                .with_syslog_identifier("pmcheck".to_owned());
            let _ = tracing_subscriber::registry()
                .with(journal.with_filter(filter()))
                .try_init();
            return;
        }
    }
    let text = tracing_subscriber::fmt::layer()
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .with_target(false)
        // The message says it all in words; the fields are for the journal.
        .fmt_fields(debug_fn(|writer, field, value| {
            if field.name() == "message" {
                write!(writer, "{value:?}")
            } else {
                Ok(())
            }
        }));
    // Under systemd (stderr a journal stream journald refused) the journal stamps lines already.
    let registry = tracing_subscriber::registry().with(filter());
    let _ = if std::env::var_os("JOURNAL_STREAM").is_some() {
        registry.with(text.without_time()).try_init()
    } else {
        registry.with(text).try_init()
    };
}
