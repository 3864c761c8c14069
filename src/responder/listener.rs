//! A listener of the daemon: accepts connections within the guard (`--allow`, the connection
//! table), and serves each, HTTP polls with hyper, agent checks with one line.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::server::conn::http1::Builder;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use ipnet::IpNet;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::responder::agent;
use crate::responder::connections::{Activity, Connections, Limits, Throttle, Ticket};
use crate::responder::deadline::WriteDeadline;
use crate::responder::heartbeat::Beat;
use crate::responder::http::{Rendered, operator_view};
use crate::responder::node::Node;
use crate::responder::pollers::Via;
use crate::settings::allow::permits;

/// How long a client may take to send its request head, or stay idle between two requests.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an answer may wait for the client to read it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Past this age a kept-alive connection is closed after its current request: a client that
/// reads a byte now and then cannot hold a descriptor for ever.
const MAX_CONNECTION_AGE: Duration = Duration::from_secs(60);
/// How long shutdown waits for polls in flight.
const DRAIN_CONNECTIONS: Duration = Duration::from_secs(2);
/// At shutdown, how long a connection accepted but not yet read may take to send its request:
/// its client (a load balancer's check) is already waiting for the answer.
const FIRST_REQUEST: Duration = Duration::from_secs(1);
/// At start, how long the first accept waits for the first probe: a poll accepted before it
/// is answered STARTING, a 503 HAProxy counts as a failed check (`L7STS 503` at half of the
/// restarts with `pmcheck.socket`). Meanwhile the kernel queues the connections on the socket
/// (systemd's, or bound already); a second leaves a restart within HAProxy's `timeout check`.
const FIRST_PROBE: Duration = Duration::from_secs(1);

/// Who may connect, and how many at once.
pub struct Guard {
    /// The networks allowed (everyone when empty).
    pub allow: Vec<IpNet>,
    connections: Arc<Connections>,
    refused: Throttle,
    failed: Throttle,
}

impl Guard {
    /// Accepts only from `allow` (everyone when empty), at most `limits` at once.
    pub fn new(allow: Vec<IpNet>, limits: Limits) -> Self {
        Self {
            allow,
            connections: Connections::new(limits),
            refused: Throttle::default(),
            failed: Throttle::default(),
        }
    }
}

/// Resolves when the stop sender is dropped.
pub(crate) async fn closed(mut stopped: watch::Receiver<()>) {
    while stopped.changed().await.is_ok() {}
}

/// Accepts polls on `listener` (HTTP checks or agent checks: `kind`) until `stopped` changes
/// (closes), each served by a [`Connection`] of its own, then gives those in flight a moment to
/// finish. `guard` (who may connect, and how many at once) is shared by every listener; `beat`
/// is marked at each turn of the loop, for the watchdog.
pub async fn run(
    kind: Via,
    listener: TcpListener,
    node: Arc<Node>,
    guard: Arc<Guard>,
    stopped: watch::Receiver<()>,
    beat: Arc<Beat>,
) {
    let http = http();
    let mut connections = JoinSet::new();
    let stop = closed(stopped.clone());
    tokio::pin!(stop);
    let mut latest = node.feeds.latest.clone();
    tokio::select! {
        _ = tokio::time::timeout(FIRST_PROBE, latest.wait_for(Option::is_some)) => {}
        () = &mut stop => return,
    }
    loop {
        beat.mark(Instant::now());
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    if let Some(n) = guard.failed.hit(Instant::now()) {
                        tracing::warn!(count = n, error = %e, "accept failed in the last 10s");
                    }
                    // Out of descriptors: shed connections are closing, give them a moment
                    // (not the 50 ms of other errors: a load balancer's check is waiting).
                    let pause = if out_of_descriptors(&e) { 1 } else { 50 };
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    continue;
                }
            },
            () = &mut stop => break,
            Some(_) = connections.join_next() => continue,
            // Idle, it turns when the watchdog asks: its pings stand for it.
            () = beat.asking.notified() => continue,
        };
        let peer = peer.ip();
        if !permits(&guard.allow, peer) {
            // Closed before a byte is read.
            drop(stream);
            if let Some(n) = guard.refused.hit(Instant::now()) {
                tracing::warn!(
                    count = n,
                    peer = %peer,
                    "refused connections from outside --allow in the last 10s"
                );
            }
            continue;
        }
        // A proven load balancer's until it shows otherwise: its address proved itself
        // lately, or is one the key file binds a key to (known from the daemon's first
        // second, so that a restart under a flood keeps every keyed check).
        let proven = node.proof().binds(peer) || (node.pollers).is_proven(peer, Instant::now());
        let connection = Connection {
            node: Arc::clone(&node),
            peer,
            ticket: guard.connections.admit(peer, proven),
        };
        match kind {
            Via::Agent => connections.spawn(connection.agent(stream)),
            Via::Http => connections.spawn(connection.http(stream, http.clone(), stopped.clone())),
        };
    }
    let _ = tokio::time::timeout(DRAIN_CONNECTIONS, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

/// One admitted connection, served until it ends, is shed to make room, or grows too old.
struct Connection {
    node: Arc<Node>,
    peer: IpAddr,
    /// Its place in the connection table, given back when dropped.
    ticket: Ticket,
}

impl Connection {
    /// HAProxy's agent check: what it sends first (`agent-send`: its server line and key),
    /// then one line for that server line, then close; noted once the line is out.
    async fn agent(mut self, mut stream: TcpStream) {
        let (node, peer, activity) = (&self.node, self.peer, &self.ticket.activity);
        let served = async {
            // Only a check that can prove a load balancer has an `agent-send` worth waiting for.
            let sent = if node.proof().may_prove(peer) {
                agent::read_sent(&mut stream).await
            } else {
                agent::Sent::NONE
            };
            let (line, told) = node.agent_line(peer, &sent);
            activity.proved(told.proven());
            if agent::answer(stream, line, activity).await {
                node.agent_told(told);
            }
        };
        tokio::select! {
            () = served => {}
            _ = &mut self.ticket.shed => {}
        }
    }

    /// HTTP polls, as many as the client sends on the connection.
    async fn http(mut self, stream: TcpStream, http: Builder, stopped: watch::Receiver<()>) {
        let _ = stream.set_nodelay(true);
        let activity = Arc::clone(&self.ticket.activity);
        let stream = WriteDeadline::new(stream, WRITE_TIMEOUT, Some(Arc::clone(&activity)));
        let service = answers(Arc::clone(&self.node), self.peer, Some(activity));
        let connection = http.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(connection);
        let result = tokio::select! {
            result = connection.as_mut() => result,
            // Shed to make room: close at once.
            _ = &mut self.ticket.shed => return,
            () = tokio::time::sleep(MAX_CONNECTION_AGE) => {
                connection.as_mut().graceful_shutdown();
                connection.await
            }
            () = closed(stopped) => {
                // hyper's graceful shutdown closes a connection whose request it has not read
                // yet. One accepted just before the stop is a poll on its way: answer it first
                // (under socket activation, the polls still queued go to the next process).
                if !self.ticket.activity.has_asked() {
                    let first = self.ticket.activity.first_request();
                    tokio::select! {
                        result = connection.as_mut() => return log_end(self.peer, result),
                        _ = tokio::time::timeout(FIRST_REQUEST, first) => {}
                    }
                }
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        log_end(self.peer, result);
    }
}

/// HAProxy closes checks with a RST: routine, not worth more than debug.
fn log_end(peer: IpAddr, result: Result<(), hyper::Error>) {
    if let Err(e) = result {
        tracing::debug!(peer = %peer, error = %e, "a poll's connection ended in an error");
    }
}

/// EMFILE or ENFILE: the process or the system has no descriptor left.
fn out_of_descriptors(e: &io::Error) -> bool {
    use nix::errno::Errno;
    matches!(e.raw_os_error(), Some(code) if code == Errno::EMFILE as i32 || code == Errno::ENFILE as i32)
}

/// The HTTP/1 settings every poll is served with.
fn http() -> Builder {
    let mut http = Builder::new();
    http.timer(TokioTimer::new())
        // Also the idle limit between requests on a kept-alive connection.
        .header_read_timeout(HEADER_READ_TIMEOUT)
        // hyper's smallest: a poll is a few dozen bytes.
        .max_buf_size(8 * 1024);
    http
}

/// What a poll gets back.
type Response = hyper::Response<http_body_util::Full<bytes::Bytes>>;

/// The service that answers each request of a connection from `peer` (inetd's one too).
pub(crate) fn answers(
    health: Arc<Node>,
    peer: IpAddr,
    activity: Option<Arc<Activity>>,
) -> impl hyper::service::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = Response,
    Error = std::convert::Infallible,
    Future = Reply,
> {
    let last = RefCell::new(Rendered::default());
    service_fn(move |request| {
        if let Some(activity) = &activity {
            activity.asked();
        }
        if !operator_view(&request, peer) {
            let mut last = last.borrow_mut();
            let answer = health.answer(&request, peer, &mut last);
            if let Some(activity) = &activity {
                activity.proved(last.proven);
            }
            return Reply::Now(Some(answer));
        }
        // The operator's view reads the agent connections first, off the async workers.
        let health = Arc::clone(&health);
        Reply::Later(Box::pin(async move {
            health.agents.refresh().await;
            health.answer(&request, peer, &mut Rendered::default())
        }))
    })
}

/// A poll's answer: at once, allocating nothing more (every load balancer's poll), or after
/// the operator's view has read the agent connections.
pub(crate) enum Reply {
    Now(Option<Response>),
    Later(std::pin::Pin<Box<dyn Future<Output = Response> + Send>>),
}

impl Future for Reply {
    type Output = Result<Response, std::convert::Infallible>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.get_mut() {
            Reply::Now(answer) => std::task::Poll::Ready(Ok(answer.take().unwrap_or_else(|| {
                // Polled again after it was ready: hyper never does.
                let mut gone = Response::default();
                *gone.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
                gone
            }))),
            Reply::Later(later) => later.as_mut().poll(cx).map(Ok),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::file::DrainFile;
    use crate::drain::record::{Drain, DrainState};
    use crate::health::decision::Rules;
    use crate::health::weight::Rejoin;
    use crate::puppet::report::ProbeReport;
    use crate::responder::node::Feeds;
    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A drained node with a healthy Puppet Server: the one case where a 200 would be a lie
    /// that still looks plausible.
    fn drained() -> (Arc<Node>, impl Sized) {
        let report = ProbeReport::new(
            crate::puppet::report::ProbeOutcome::Healthy(None),
            Duration::from_millis(1),
            None,
        );
        let (p, latest) = watch::channel(Some(Arc::new(report)));
        let state = DrainState::Drained(Drain::parse(b"{}"));
        let (d, drain) = watch::channel(Arc::new(state));
        let (r, rejoin) = watch::channel(Rejoin::Steady);
        let health = Node::new(
            Feeds {
                drain,
                latest,
                rejoin,
            },
            Rules {
                stale_after: Duration::from_secs(3600),
                ..Rules::ONCE
            },
            crate::settings::lb_proof::LbProof::default(),
            &DrainFile::new(std::path::Path::new("/var/lib/pmcheck")),
            None,
            true,
        );
        (Arc::new(health), (p, d, r))
    }

    /// Feeds `input` to one connection, closes the client's sending side, and returns what
    /// pmcheck wrote back.
    async fn exchange(health: &Arc<Node>, input: &[u8]) -> Vec<u8> {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let connection = http().serve_connection(
            TokioIo::new(server),
            answers(
                Arc::clone(health),
                std::net::Ipv4Addr::LOCALHOST.into(),
                None,
            ),
        );
        let served = tokio::spawn(connection);
        let _ = client.write_all(input).await;
        let _ = client.shutdown().await;
        let mut output = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut output));
        assert!(read.await.is_ok(), "pmcheck neither answered nor closed");
        let _ = served.await;
        output
    }

    fn requests() -> impl Strategy<Value = Vec<u8>> {
        let method = "(GET|HEAD|OPTIONS|POST|PRI|[A-Z]{1,8})";
        let version = "(HTTP/1\\.0|HTTP/1\\.1|HTTP/2\\.0|.{0,10})";
        let header = ("[ -~]{0,20}", "[ -~\\x80-\\xff]{0,40}");
        let shaped = (
            method,
            "[ -~]{0,30}",
            version,
            proptest::collection::vec(header, 0..6),
            any::<bool>(),
        )
            .prop_map(|(m, uri, v, headers, end)| {
                let mut text = format!("{m} {uri} {v}\r\n");
                for (name, value) in headers {
                    text.push_str(&format!("{name}: {value}\r\n"));
                }
                if end {
                    text.push_str("\r\n");
                }
                text.into_bytes()
            });
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..512),
            shaped.clone(),
            proptest::collection::vec(shaped, 1..4).prop_map(|r| r.concat()),
        ]
    }

    /// A poll accepted just before the daemon stops is answered, not closed unanswered: under
    /// socket activation a restart then loses no poll (scripts/check-systemd saw 1 of 300 lost).
    #[tokio::test]
    async fn a_poll_accepted_before_the_stop_is_still_answered() {
        let (health, _keep) = drained();
        let socket = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let (stop, stopped) = watch::channel(());
        let limits = Limits {
            total: 16,
            per_source: 16,
        };
        let guard = Arc::new(Guard::new(Vec::new(), limits));
        let listener = run(
            Via::Http,
            socket,
            health,
            Arc::clone(&guard),
            stopped,
            Beat::new(),
        );
        let running = tokio::spawn(listener);
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        while guard.connections.open() == 0 {
            tokio::task::yield_now().await;
        }
        drop(stop);
        tokio::task::yield_now().await;
        client.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
        let mut output = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut output));
        assert!(read.await.is_ok(), "neither answered nor closed");
        let text = String::from_utf8_lossy(&output);
        assert!(text.starts_with("HTTP/1.0 503 Drained"), "{text:?}");
        running.await.unwrap();
    }

    #[tokio::test]
    async fn the_exchange_sees_real_answers() {
        let (health, _keep) = drained();
        let output = exchange(&health, b"OPTIONS / HTTP/1.0\r\n\r\nGET / HTTP/1.1\r\n\r\n").await;
        let text = String::from_utf8_lossy(&output);
        assert!(text.starts_with("HTTP/1.0 503 Drained: "), "{text}");
        assert_eq!(
            text.matches(" 503 Drained: ").count(),
            1,
            "HTTP/1.0 closes after one: {text}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1500))]
        /// Any request bytes get an answer or a close: never a panic, never a 200 while drained.
        #[test]
        fn any_bytes_get_an_answer_or_a_close_and_never_200_while_drained(input in requests()) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let output = rt.block_on(async {
                let (health, _keep) = drained();
                exchange(&health, &input).await
            });
            let text = String::from_utf8_lossy(&output);
            prop_assert!(output.is_empty() || text.starts_with("HTTP/1."), "{text:?}");
            for status_line in text.split("\r\n").filter(|l| l.starts_with("HTTP/1.")) {
                let code = status_line.split(' ').nth(1).unwrap_or("");
                prop_assert_ne!(code, "200", "{}", text);
            }
        }
    }
}
