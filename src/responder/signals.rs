//! The daemon's signals. TERM and INT stop it. HUP re-reads the certificates and the drain
//! record now (the habit of every Unix daemon; its default action would kill pmcheck, and
//! systemd counts a death by SIGHUP as a clean exit that `Restart=on-failure` does not undo).
//! USR1 and USR2 are logged and otherwise ignored, for the same reason.

use std::io;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// Resolves on SIGTERM or SIGINT; meanwhile each SIGHUP marks `reload` changed. The handlers
/// are installed before this returns its future, so no signal is lost to the default action.
pub fn stop_requested(
    reload: watch::Sender<()>,
) -> io::Result<impl std::future::Future<Output = ()>> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut usr2 = signal(SignalKind::user_defined2())?;
    Ok(async move {
        loop {
            tokio::select! {
                _ = term.recv() => return,
                _ = int.recv() => return,
                _ = hup.recv() => {
                    tracing::info!(signal = "HUP", "re-reading the certificates, the drain record and the key file");
                    reload.send_replace(());
                }
                _ = usr1.recv() => tracing::info!(signal = "USR1", "signal ignored (SIGHUP re-reads the files, SIGTERM stops)"),
                _ = usr2.recv() => tracing::info!(signal = "USR2", "signal ignored (SIGHUP re-reads the files, SIGTERM stops)"),
            }
        }
    })
}
