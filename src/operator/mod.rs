//! What the operator runs and reads: `pmcheck status`, `drain` and `undrain` with their waits,
//! `pmcheck cycle`, `on-stop` and `on-start`, and the manual. Each command asks the daemon
//! through one client ([`daemon::Daemon`]) and reads its answer through one view
//! ([`view::View`]); the commands do not call each other.

pub mod check;
pub mod command;
pub mod config;
pub mod cycle;
pub mod daemon;
pub mod drain;
pub mod guard;
pub mod manual;
pub mod roll;
pub mod status;
pub mod stop;
pub mod view;
pub mod wait;

use crate::console::errln;

/// Runs one command on one thread, and does not wait for a blocking task left behind (the
/// stdin reader of `inetd`, which only returns when the client sends more).
pub(crate) fn run_single_threaded<F: std::future::Future>(future: F) -> std::io::Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let output = rt.block_on(future);
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    Ok(output)
}

/// Says each warning on stderr, as `pmcheck: warning: ...`.
pub(crate) fn warn(warnings: impl IntoIterator<Item = impl std::fmt::Display>) {
    for w in warnings {
        errln!("pmcheck: warning: {w}");
    }
}
