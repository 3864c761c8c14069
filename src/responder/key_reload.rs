//! The load balancers' key file, read again at each reload (SIGHUP), so that keys rotate
//! without a restart: the new key beside the old on every master, then on the load balancers,
//! then the old one removed, each step a `systemctl reload pmcheck`. A file that cannot be used
//! keeps the keys read before (a rotation half done must not leave every check unproven) and
//! says so, loudly and in `status`.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

use crate::responder::node::Node;
use crate::settings::Daemon;

/// Re-reads the `daemon`'s key file (else its addresses) into `node` at each `reload`, until
/// `stop`.
pub async fn follow(
    node: Arc<Node>,
    daemon: Daemon,
    mut reload: watch::Receiver<()>,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            changed = reload.changed() => if changed.is_err() { return },
            () = &mut stop => return,
        }
        let (node, daemon) = (Arc::clone(&node), daemon.clone());
        let _ = tokio::task::spawn_blocking(move || reread(&node, &daemon)).await;
    }
}

fn reread(node: &Node, daemon: &Daemon) {
    let (proof, problem) = node.proof().reload(daemon);
    let kept = proof.answer().is_some_and(|a| a.problem.is_none());
    let warnings = proof.warnings();
    node.set_proof(proof);
    let Some(path) = &daemon.lb_key_file else {
        return;
    };
    let path = path.display();
    match problem {
        None => tracing::info!(file = %path, "re-read the load balancer key file"),
        Some(e) if kept => tracing::error!(
            file = %path,
            error = %e,
            "the load balancer key file is unusable; the keys read before still prove the load balancers' checks: fix the file, then `systemctl reload pmcheck` (`pmcheck config --check` tells first)"
        ),
        Some(e) => tracing::error!(
            file = %path,
            error = %e,
            "the load balancer key file is unusable; no poll proves itself: fix the file, then `systemctl reload pmcheck` (`pmcheck config --check` tells first)"
        ),
    }
    for warning in warnings {
        tracing::warn!(file = %path, %warning, "a load balancer key is bound too widely");
    }
}
