//! The systemd protocols, without linking libsystemd: socket activation (`LISTEN_FDS`), so polls
//! queue in the kernel across a restart, and `sd_notify` (READY, WATCHDOG, STOPPING).

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SystemdError {
    #[error(
        "socket activation: descriptor {index} from systemd is not a listening TCP socket ({source}); \
         the .socket unit must use ListenStream= with Accept=no"
    )]
    Listener { index: usize, source: io::Error },
}

/// The listening sockets systemd passed (`LISTEN_FDS`, `LISTEN_PID`), if it passed any.
/// Call before starting threads: it clears those variables, as sd_listen_fds(3) does.
pub fn listeners() -> Result<Option<Vec<std::net::TcpListener>>, SystemdError> {
    let mut fds = listenfd::ListenFd::from_env();
    if fds.len() == 0 {
        return Ok(None);
    }
    let listeners = (0..fds.len())
        .map(|index| {
            (fds.take_tcp_listener(index))
                .and_then(|l| l.ok_or_else(|| io::Error::other("already taken")))
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|source| SystemdError::Listener { index, source })
        })
        .collect::<Result<Vec<_>, _>>()?;
    tracing::info!(
        sockets = listeners.len(),
        "using listening sockets from systemd"
    );
    Ok(Some(listeners))
}

/// Sends state changes to systemd's `NOTIFY_SOCKET` (`Type=notify`).
#[derive(Clone)]
pub struct Notifier {
    socket: Arc<UnixDatagram>,
    addr: Arc<SocketAddr>,
}

impl Notifier {
    /// `None` when not started by systemd with `NotifyAccess`, or when the socket is unusable.
    pub fn from_env() -> Option<Self> {
        let path = std::env::var_os("NOTIFY_SOCKET")?;
        let bytes = path.as_encoded_bytes();
        // A leading '@' names a socket in the abstract namespace.
        let addr = match bytes.strip_prefix(b"@") {
            Some(name) => SocketAddr::from_abstract_name(name),
            None => SocketAddr::from_pathname(&path),
        };
        // Never blocking a runtime thread: a datagram systemd is slow to take is dropped.
        let unbound = || -> io::Result<UnixDatagram> {
            let socket = UnixDatagram::unbound()?;
            socket.set_nonblocking(true)?;
            Ok(socket)
        };
        let made = addr.and_then(|addr| Ok((unbound()?, addr)));
        match made {
            Ok((socket, addr)) => Some(Self {
                socket: Arc::new(socket),
                addr: Arc::new(addr),
            }),
            Err(e) => {
                tracing::warn!(
                    notify_socket = %path.to_string_lossy(),
                    error = %e,
                    "cannot use NOTIFY_SOCKET; not notifying systemd"
                );
                None
            }
        }
    }

    pub fn notify(&self, state: &str) {
        if let Err(e) = self.socket.send_to_addr(state.as_bytes(), &self.addr) {
            tracing::warn!(state, error = %e, "cannot notify systemd");
        }
    }
}
