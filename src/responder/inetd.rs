//! One poll on stdin/stdout, for xinetd or a systemd `Accept=yes` socket: the same verdict and
//! answer as the daemon, from a probe made for this poll alone.

use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper::service::{Service as _, service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::watch;

use crate::cli::InetdArgs;
use crate::drain::file::DrainFile;
use crate::drain::watch::read_once;
use crate::health::decision::Rules;
use crate::health::weight::Rejoin;
use crate::puppet::client::ProbeTarget;
use crate::puppet::probe::Prober;
use crate::puppet::probe_error::CannotProbe;
use crate::puppet::report::{ProbeOutcome, ProbeReport};
use crate::responder::listener::answers;
use crate::responder::node::{Feeds, Node};
use crate::settings::lb_proof::LbProof;
use crate::settings::{Given, Host, Settings};

/// The largest request head accepted; a health check is a few dozen bytes.
const REQUEST_LIMIT: usize = 8 * 1024;

/// Reads one request within `--read-timeout`, probes Puppet Server meanwhile (within
/// `--timeout`), answers, and closes.
/// Settings that cannot be resolved still get an answer: 503 UNKNOWN with the reason, because
/// under xinetd nobody reads stderr (it is the connection).
pub async fn answer_one(given: &Given, args: &InetdArgs) -> io::Result<()> {
    let (probe_deadline, read_timeout) = (given.puppet.timeout, args.read_timeout);
    let state_dir = &given.state_dir;
    let target = Settings::resolve(given, &Host::REAL).map(|s| ProbeTarget::of(&s));
    let (publish, latest) = watch::channel(None);
    let puppet = target.as_ref().ok().map(|t| t.addr.clone());
    match target {
        Ok(target) => {
            tokio::spawn(async move {
                let report = Prober::once(target).probe().await;
                publish.send_replace(Some(Arc::new(report)));
            });
        }
        Err(bad) => {
            // A probe that could not be made at all: the settings themselves are bad.
            let outcome = ProbeOutcome::CannotTell(CannotProbe::Settings(bad));
            let report = ProbeReport::new(outcome, Duration::ZERO, None);
            publish.send_replace(Some(Arc::new(report)));
        }
    }
    let drain = read_once(DrainFile::new(state_dir)).await;
    let (_keep, drains) = watch::channel(Arc::new(drain));
    let (_steady, rejoin) = watch::channel(Rejoin::Steady);
    let health = Arc::new(Node::new(
        Feeds {
            drain: drains,
            latest,
            rejoin,
        },
        Rules {
            stale_after: probe_deadline + read_timeout,
            drained_status: args.drained.drained_status,
            ..Rules::ONCE
        },
        // One poll per process: nobody waits on what it is told.
        LbProof::default(),
        &DrainFile::new(state_dir),
        puppet,
        false,
    ));
    // Who asks: xinetd hands over the connection; pipes (a test, a shell) have no peer.
    let socket = stdin_socket();
    let peer = (socket.as_ref().and_then(|s| s.peer_addr().ok()))
        .map_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED), |a| a.ip());
    let answered = Arc::new(AtomicBool::new(false));
    let service = {
        let (latest, answered) = (health.feeds.latest.clone(), Arc::clone(&answered));
        let answers = Rc::new(answers(health, peer, None));
        service_fn(move |request| {
            let (mut latest, answered) = (latest.clone(), Arc::clone(&answered));
            let answers = Rc::clone(&answers);
            async move {
                // Unlike the daemon, answer from a real check of Puppet Server, made for this poll.
                let _ = latest.wait_for(Option::is_some).await;
                answered.store(true, Ordering::Relaxed);
                answers.call(request).await
            }
        })
    };
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(read_timeout)
        .max_buf_size(REQUEST_LIMIT)
        // A client may shut its side down once the request is sent (or stdin end): answer anyway.
        .half_close(true)
        .keep_alive(false);
    let deadline = read_timeout + probe_deadline + Duration::from_secs(1);
    let served = if let Some(stream) = socket {
        let connection = http.serve_connection(TokioIo::new(stream), service);
        tokio::time::timeout(deadline, connection).await
    } else {
        let io = tokio::io::join(tokio::io::stdin(), tokio::io::stdout());
        let connection = http.serve_connection(TokioIo::new(io), service);
        tokio::time::timeout(deadline, connection).await
    };
    match served {
        Ok(Ok(())) => Ok(()),
        // HAProxy resets the connection once it has the status line: routine.
        Ok(Err(e)) if answered.load(Ordering::Relaxed) => {
            tracing::debug!(error = %e, "the connection failed after the answer");
            Ok(())
        }
        Ok(Err(e)) => Err(io::Error::other(e)),
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
