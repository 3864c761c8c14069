//! What the operator runs and reads: `pmcheck status`, the waits of `drain --wait` and
//! `undrain --wait`, `pmcheck cycle`, `on-stop` and `on-start`, and the manual.

pub mod access;
pub mod assessment;
pub mod backends;
pub mod check;
pub mod command;
pub mod config;
pub mod cycle;
pub mod daemon;
pub mod drain;
pub mod goal;
pub mod history;
pub mod manual;
pub mod status;
pub mod stop;
pub mod wait;

use std::time::Duration;

pub(crate) fn runtime(multi_thread: bool) -> std::io::Result<tokio::runtime::Runtime> {
    if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
}

/// Runs a short command on one thread, and does not wait for a blocking task left behind (the
/// stdin reader of `inetd`, which only returns when the client sends more).
pub(crate) fn run_single_threaded<F: std::future::Future>(future: F) -> std::io::Result<F::Output> {
    let rt = runtime(false)?;
    let output = rt.block_on(future);
    rt.shutdown_timeout(Duration::from_millis(100));
    Ok(output)
}
