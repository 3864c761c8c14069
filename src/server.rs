//! The daemon: listeners, the prober task and graceful shutdown.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use socket2::{Domain, Protocol, Socket, Type};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::cli::format_duration;
use crate::drain::DrainFile;
use crate::probe::{self, ProbeReport, Prober};
use crate::responder::Health;
use crate::settings::Settings;
use crate::verdict::{Verdict, Word};

/// Port 9200 on every address, IPv4 included.
pub const DEFAULT_LISTEN_V6: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), 9200);
/// Where we listen on hosts without IPv6.
pub const DEFAULT_LISTEN_V4: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 9200);
/// How long a client may take to send its request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for polls in flight.
const DRAIN_CONNECTIONS: Duration = Duration::from_secs(2);

#[derive(Debug, Error)]
#[error("cannot listen on {addr}: {source}{hint}", hint = listen_hint(source))]
pub struct ListenError {
    pub addr: SocketAddr,
    pub source: io::Error,
}

impl ListenError {
    /// sysexits: 69 (EX_UNAVAILABLE) when the address is taken or absent, 71 (EX_OSERR) otherwise.
    pub fn exit_code(&self) -> u8 {
        match self.source.kind() {
            io::ErrorKind::AddrInUse | io::ErrorKind::AddrNotAvailable => 69,
            _ => 71,
        }
    }
}

fn listen_hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::AddrInUse => {
            " (another pmcheck, or the old xinetd service, already listens there: stop it or pass another --listen)"
        }
        io::ErrorKind::PermissionDenied => " (ports below 1024 need CAP_NET_BIND_SERVICE)",
        _ => "",
    }
}

/// Binds the listen addresses. Without any, `[::]:9200` accepting IPv4 too, or `0.0.0.0:9200`
/// where the host has no IPv6.
pub fn bind(addrs: &[SocketAddr]) -> Result<Vec<std::net::TcpListener>, ListenError> {
    if addrs.is_empty() {
        return match bind_one(DEFAULT_LISTEN_V6) {
            Ok(listener) => Ok(vec![listener]),
            Err(e) if no_ipv6(&e.source) => {
                tracing::warn!(
                    "no IPv6 on this host ({}); listening on {DEFAULT_LISTEN_V4} only",
                    e.source
                );
                Ok(vec![bind_one(DEFAULT_LISTEN_V4)?])
            }
            Err(e) => Err(e),
        };
    }
    addrs.iter().map(|addr| bind_one(*addr)).collect()
}

fn no_ipv6(e: &io::Error) -> bool {
    /// EAFNOSUPPORT on Linux: the kernel has no IPv6 at all.
    const EAFNOSUPPORT: i32 = 97;
    e.kind() == io::ErrorKind::AddrNotAvailable || e.raw_os_error() == Some(EAFNOSUPPORT)
}

fn bind_one(addr: SocketAddr) -> Result<std::net::TcpListener, ListenError> {
    let fail = |source| ListenError { addr, source };
    let socket =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(fail)?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        // Dual stack regardless of net.ipv6.bindv6only.
        socket.set_only_v6(false).map_err(fail)?;
    }
    socket.set_reuse_address(true).map_err(fail)?;
    socket.bind(&addr.into()).map_err(fail)?;
    socket.listen(1024).map_err(fail)?;
    socket.set_nonblocking(true).map_err(fail)?;
    Ok(socket.into())
}

/// Runs the daemon on already-bound listeners until `shutdown` resolves. `ready` is called once
/// every listener accepts (the systemd notification goes there).
pub async fn serve(
    settings: &Settings,
    interval: Duration,
    listeners: Vec<std::net::TcpListener>,
    ready: impl FnOnce(),
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let timeout = settings.timeout.value;
    let (stop, stopped) = watch::channel(());
    let (publish, latest) = watch::channel(None);
    let health = Arc::new(Health {
        drain: DrainFile::new(&settings.state_dir.value),
        latest,
        // A probe lands at least every interval + timeout; allow one missed round.
        stale_after: 2 * (interval + timeout),
    });

    let mut tasks = JoinSet::new();
    for listener in listeners {
        let listener = TcpListener::from_std(listener)?;
        tracing::info!("listening on {}", listener.local_addr()?);
        tasks.spawn(accept(listener, Arc::clone(&health), stopped.clone()));
    }
    let prober = Prober::new(settings.probe_target());
    tracing::info!(
        "probing {} at {} every {} (timeout {}); drain record {}",
        prober.endpoint(),
        settings.puppet_addr.value,
        format_duration(interval),
        format_duration(timeout),
        health.drain.path().display()
    );
    tasks.spawn(probe::run(
        prober,
        interval,
        publish,
        log_changes(Arc::clone(&health)),
        until_stopped(stopped.clone()),
    ));
    ready();
    shutdown.await;
    tracing::info!("shutting down");
    drop(stop);
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Resolves when the stop sender is dropped.
async fn until_stopped(mut stopped: watch::Receiver<()>) {
    while stopped.changed().await.is_ok() {}
}

/// Accepts polls until stopped, then gives those in flight a moment to finish.
async fn accept(listener: TcpListener, health: Arc<Health>, stopped: watch::Receiver<()>) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(16 * 1024);
    let mut connections = JoinSet::new();
    let stop = until_stopped(stopped.clone());
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
            Some(_) = connections.join_next() => continue,
        };
        let _ = stream.set_nodelay(true);
        let health = Arc::clone(&health);
        let service = service_fn(move |request| {
            let response = health.answer(&request);
            async move { Ok::<_, std::convert::Infallible>(response) }
        });
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let stop = until_stopped(stopped.clone());
        connections.spawn(async move {
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = stop => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            // HAProxy closes checks with a RST: routine, not worth more than debug.
            if let Err(e) = result {
                tracing::debug!("poll from {peer}: {e}");
            }
        });
    }
    let _ = tokio::time::timeout(DRAIN_CONNECTIONS, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

/// Logs one line whenever the verdict changes, not one per poll.
fn log_changes(health: Arc<Health>) -> impl FnMut(&ProbeReport) {
    let mut last: Option<(Word, String)> = None;
    move |report| {
        let drain = health.drain.state(SystemTime::now());
        let verdict = Verdict::decide(&drain, Some(report), Instant::now(), health.stale_after);
        if last
            .as_ref()
            .is_some_and(|(w, r)| *w == verdict.word && *r == verdict.reason)
        {
            return;
        }
        if verdict.word == Word::Ok {
            tracing::info!("verdict {}: {}", verdict.word.as_str(), verdict.reason);
        } else {
            tracing::warn!("verdict {}: {}", verdict.word.as_str(), verdict.reason);
        }
        last = Some((verdict.word, verdict.reason.into_owned()));
    }
}
