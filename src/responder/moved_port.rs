//! Puppet Server's listener moved in its webserver.conf while pmcheck runs: pmcheck reads the
//! address once, at start, so it keeps probing the old one. A reload (SIGHUP) cannot change
//! it (the agent connections and the status are read against it), so at each reload the
//! file is read again and a move is said, with the restart that takes it.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::sync::watch;

use crate::settings::host::{Webserver, read_confd_file};

/// Says, at each reload until `stop`, when `webserver` (the file `probed` came from) names
/// another listener.
pub async fn watch(
    webserver: PathBuf,
    probed: SocketAddr,
    mut reload: watch::Receiver<()>,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            changed = reload.changed() => if changed.is_err() { return },
            () = &mut stop => return,
        }
        let path = webserver.clone();
        let read = tokio::task::spawn_blocking(move || {
            let text = read_confd_file(&path)?;
            Webserver::parse(path, &text).listener()
        });
        if let Ok(Some(now)) = read.await
            && now != probed
        {
            tracing::warn!(
                file = %webserver.display(),
                probed = %probed,
                listener = %now,
                "{} now says Puppet Server listens on {now}; pmcheck probes {probed} until it is restarted (`systemctl restart pmcheck`): a reload does not move the probe",
                webserver.display()
            );
        }
    }
}
