//! One poll on stdin/stdout, for xinetd or a systemd `Accept=yes` socket: the same verdict and
//! answer as the daemon, from a probe made for this poll alone.

use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::watch;

use crate::drain::DrainFile;
use crate::probe::Prober;
use crate::responder::Health;
use crate::settings::Settings;

/// The largest request head accepted; a health check is a few dozen bytes.
const REQUEST_LIMIT: usize = 8 * 1024;

/// Reads one request within `read_timeout`, probes Puppet Server meanwhile, answers, and closes.
pub async fn answer_one(settings: &Settings, read_timeout: Duration) -> io::Result<()> {
    let (publish, latest) = watch::channel(None);
    let mut prober = Prober::new(settings.probe_target());
    tokio::spawn(async move {
        let report = prober.probe().await;
        publish.send_replace(Some(Arc::new(report)));
    });
    let health = Arc::new(Health {
        drain: DrainFile::new(&settings.state_dir.value),
        latest,
        stale_after: settings.timeout.value + read_timeout,
    });
    let service = service_fn(move |request| {
        let health = Arc::clone(&health);
        async move {
            // Unlike the daemon, answer from a real check of Puppet Server, made for this poll.
            let mut latest = health.latest.clone();
            let _ = latest.wait_for(Option::is_some).await;
            Ok::<_, std::convert::Infallible>(health.answer(&request))
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(read_timeout)
        .max_buf_size(REQUEST_LIMIT)
        .keep_alive(false);
    let deadline = read_timeout + settings.timeout.value + Duration::from_secs(1);
    let served = match stdin_socket() {
        Some(stream) => {
            tokio::time::timeout(
                deadline,
                http.serve_connection(TokioIo::new(stream), service),
            )
            .await
        }
        None => {
            let io = tokio::io::join(tokio::io::stdin(), tokio::io::stdout());
            tokio::time::timeout(deadline, http.serve_connection(TokioIo::new(io), service)).await
        }
    };
    match served {
        Ok(result) => result.map_err(io::Error::other),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the poll took too long",
        )),
    }
}

/// stdin as a TCP socket, when it is one (xinetd, systemd `Accept=yes`): a real socket can be
/// shut down cleanly after the answer, which a pair of pipes cannot.
fn stdin_socket() -> Option<tokio::net::TcpStream> {
    let fd = io::stdin().as_fd().try_clone_to_owned().ok()?;
    let stream = std::net::TcpStream::from(fd);
    stream.peer_addr().ok()?;
    stream.set_nonblocking(true).ok()?;
    tokio::net::TcpStream::from_std(stream).ok()
}

/// Whether stderr is the same file as stdin: xinetd hands the connection over as stdin, stdout
/// and stderr, and a log line there would corrupt the answer.
pub fn stderr_is_the_connection() -> bool {
    let identity = |fd: Result<std::os::fd::OwnedFd, io::Error>| {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::File::from(fd.ok()?).metadata().ok()?;
        Some((meta.dev(), meta.ino()))
    };
    let stdin = identity(io::stdin().as_fd().try_clone_to_owned());
    stdin.is_some() && stdin == identity(io::stderr().as_fd().try_clone_to_owned())
}
