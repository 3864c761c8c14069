//! Binding the listen addresses: `[::]:9200` accepting IPv4 too by default, IPv4 alone on a
//! host without IPv6, and errors that name the address and the way out.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};
use thiserror::Error;

use crate::exit::Exit;

/// Port 9200 on every address, IPv4 included (`0.0.0.0:9200` on a host without IPv6).
const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 9200);

#[derive(Debug, Error)]
#[error("cannot listen on {addr} ({flag}): {source}{hint}", hint = listen_hint(source, flag))]
pub struct ListenError {
    /// The address.
    pub addr: SocketAddr,
    /// The option that asked for it: `--listen` or `--agent-listen`.
    pub flag: &'static str,
    /// What the kernel said.
    pub source: io::Error,
}

impl ListenError {
    /// EX_UNAVAILABLE when the address is taken or absent, EX_OSERR otherwise.
    pub fn exit(&self) -> Exit {
        match self.source.kind() {
            io::ErrorKind::AddrInUse | io::ErrorKind::AddrNotAvailable => Exit::Unavailable,
            _ => Exit::OsErr,
        }
    }
}

fn listen_hint(e: &io::Error, flag: &str) -> String {
    match e.kind() {
        io::ErrorKind::AddrInUse => format!(
            " (another pmcheck, or the old xinetd service, already listens there: stop it or pass \
             another {flag}, PMCHECK_{} in /etc/default/pmcheck)",
            flag.trim_start_matches('-')
                .replace('-', "_")
                .to_uppercase()
        ),
        io::ErrorKind::PermissionDenied => " (ports below 1024 need CAP_NET_BIND_SERVICE)".into(),
        _ => String::new(),
    }
}

/// Binds the listen addresses; without any, [`DEFAULT_LISTEN`].
pub fn bind(addrs: &[SocketAddr]) -> Result<Vec<TcpListener>, ListenError> {
    let default = [DEFAULT_LISTEN];
    bind_each(if addrs.is_empty() { &default } else { addrs }, "--listen")
}

/// Binds every address given, and nothing when none is. `[::]:PORT` falls back to
/// `0.0.0.0:PORT` on a host without IPv6, so one packaged setting fits every host. `flag` is
/// the option that named them, for the error.
pub fn bind_each(
    addrs: &[SocketAddr],
    flag: &'static str,
) -> Result<Vec<TcpListener>, ListenError> {
    addrs
        .iter()
        .map(|addr| match bind_one(*addr, flag) {
            Err(e)
                if *addr == SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), addr.port())
                    && no_ipv6(&e.source) =>
            {
                let v4 = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), addr.port());
                tracing::warn!(
                    error = %e.source,
                    address = %v4,
                    instead_of = %addr,
                    "no IPv6 on this host; listening on IPv4 instead"
                );
                bind_one(v4, flag)
            }
            other => other,
        })
        .collect()
}

fn no_ipv6(e: &io::Error) -> bool {
    /// EAFNOSUPPORT on Linux: the kernel has no IPv6 at all.
    const EAFNOSUPPORT: i32 = 97;
    e.kind() == io::ErrorKind::AddrNotAvailable || e.raw_os_error() == Some(EAFNOSUPPORT)
}

fn bind_one(addr: SocketAddr, flag: &'static str) -> Result<TcpListener, ListenError> {
    let fail = |source| ListenError { addr, flag, source };
    let socket =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(fail)?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        // Dual stack regardless of net.ipv6.bindv6only.
        socket.set_only_v6(false).map_err(fail)?;
    }
    socket.set_reuse_address(true).map_err(fail)?;
    socket.bind(&addr.into()).map_err(fail)?;
    // Deep enough for a flood not to drop a load balancer's SYN (the kernel caps it at
    // net.core.somaxconn).
    socket.listen(4096).map_err(fail)?;
    socket.set_nonblocking(true).map_err(fail)?;
    Ok(socket.into())
}
