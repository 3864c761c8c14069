//! Puppet Server's listener, followed. Worked out at start from webserver.conf (its `ssl-host`
//! and `ssl-port`), it moves when that file names another one. Puppet Server reads the file
//! only at its own start, so a changed file says nothing yet of where it listens: pmcheck
//! moves when the listener it probes refuses (the restart that applies the file, a stop's hold
//! then let go of on the new one), and at a reload only says what it will do. The probe, the
//! agent connections and `status` read the one [`crate::puppet::client::Address`] moved here.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

use crate::puppet::probe_error::ProbeError;
use crate::puppet::report::{ProbeOutcome, ProbeReport};
use crate::settings::host::{Webserver, read_confd_file};

/// Follows `webserver`, the file the listener in `moves` came from, until `stop`: read again
/// at each reload and at each probe (`reports`) its listener refused; each change said once.
pub async fn follow(
    webserver: PathBuf,
    moves: watch::Sender<SocketAddr>,
    mut reports: watch::Receiver<Option<Arc<ProbeReport>>>,
    mut reload: watch::Receiver<()>,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut said = String::new();
    loop {
        let reloaded = tokio::select! {
            changed = reload.changed() => match changed {
                Ok(()) => true,
                Err(_) => return,
            },
            changed = reports.changed() => match changed {
                Ok(()) => false,
                Err(_) => return,
            },
            () = &mut stop => return,
        };
        let refused = matches!(
            reports.borrow_and_update().as_deref().map(|r| &r.outcome),
            Some(ProbeOutcome::Unhealthy(ProbeError::Refused { .. }))
        );
        if !(reloaded || refused) {
            continue;
        }
        let path = webserver.clone();
        let read = tokio::task::spawn_blocking(move || {
            read_confd_file(&path).map(|text| Webserver::parse(path, &text).listener())
        });
        let probed = *moves.borrow();
        let file = webserver.display();
        let now = match read.await {
            Ok(Some(Some(now))) => now,
            Ok(Some(None)) => {
                if fresh(&mut said, format!("no port {file} {probed}")) {
                    tracing::warn!(
                        file = %file,
                        probing = %probed,
                        "Puppet Server's webserver.conf names no ssl-port; pmcheck keeps probing"
                    );
                }
                continue;
            }
            _ => {
                if fresh(&mut said, format!("unread {file} {probed}")) {
                    tracing::warn!(
                        file = %file,
                        probing = %probed,
                        "cannot read Puppet Server's webserver.conf; pmcheck keeps probing"
                    );
                }
                continue;
            }
        };
        if now == probed {
            said.clear();
        } else if refused {
            moves.send_replace(now);
            said.clear();
            tracing::warn!(
                file = %file,
                from = %probed,
                to = %now,
                "Puppet Server's listener moved: the old one refuses and webserver.conf names the new one; probing the new one from now on"
            );
        } else if fresh(&mut said, format!("names {file} {probed} {now}")) {
            tracing::warn!(
                file = %file,
                from = %probed,
                to = %now,
                "webserver.conf names another listener; pmcheck probes the old one, which still answers, and moves to the new one at the first probe the old one refuses (the restart of Puppet Server that applies the file)"
            );
        }
    }
}

/// Whether `what` is news: not the last said, which it becomes.
fn fresh(said: &mut String, what: String) -> bool {
    if *said == what {
        return false;
    }
    *said = what;
    true
}
