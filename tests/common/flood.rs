//! A connection flood and a legitimate poller to measure it by, for `tests/flood.rs` and
//! `benches/flood.rs`. Loopback only; every loop ends with its [`Until`].

#![allow(dead_code)]

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;

/// When a flood and its pollers end: not before `least` has passed, and then once every
/// poller that measures has made the checks it needs (a count, not a time: a loaded machine
/// only makes them slower), or at `most`.
#[derive(Debug, Clone)]
pub struct Until {
    least: Instant,
    most: Instant,
    wanting: Arc<AtomicUsize>,
    enough: Arc<watch::Sender<bool>>,
}

impl Until {
    /// At least `least` from now and at most `most`, with `measuring` pollers to wait for.
    pub fn new(least: Duration, most: Duration, measuring: usize) -> Self {
        let now = Instant::now();
        Self {
            least: now + least,
            most: now + most,
            wanting: Arc::new(AtomicUsize::new(measuring)),
            enough: Arc::new(watch::channel(measuring == 0).0),
        }
    }

    /// Whether the loops go on.
    pub fn going(&self) -> bool {
        let now = Instant::now();
        now < self.least || (now < self.most && !*self.enough.borrow())
    }

    /// One measuring poller has what it needs: the last one lets the rest end.
    pub fn enough(&self) {
        if self.wanting.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.enough.send_replace(true);
        }
    }

    /// Resolves when the loops end.
    pub async fn ended(&self) {
        let mut enough = self.enough.subscribe();
        let most = tokio::time::Instant::from_std(self.most);
        if tokio::time::timeout_at(most, enough.wait_for(|e| *e))
            .await
            .is_ok()
        {
            tokio::time::sleep_until(tokio::time::Instant::from_std(self.least)).await;
        }
    }
}

/// HAProxy's `option httpchk` request.
pub const CHECK: &[u8] = b"OPTIONS / HTTP/1.0\r\n\r\n";

/// Hostile connections, each reconnecting as soon as it is closed: from `source`, or spread
/// over `sources` loopback addresses from it on (one address per connection, a botnet's shape).
#[derive(Debug, Clone, Copy)]
pub struct Attack {
    pub target: SocketAddr,
    pub source: IpAddr,
    /// How many addresses, from `source` on, the connections come from (1: all from `source`).
    pub sources: u32,
    /// Where the garbage writers connect: an agent-check port.
    pub agent: Option<SocketAddr>,
    /// Write garbage to the agent port as fast as it is taken.
    pub garbage: usize,
    /// How long a closed connection waits before it connects again.
    pub pause: Duration,
    /// Connect and send nothing.
    pub idle: usize,
    /// Send a request line, then a header byte a second.
    pub slowloris: usize,
    /// Pipeline requests as fast as the socket takes them and never read an answer.
    pub pipeline: usize,
}

/// What the attack managed.
#[derive(Debug, Default)]
pub struct AttackCounts {
    pub connected: AtomicU64,
    pub failed: AtomicU64,
    pub closed_by_server: AtomicU64,
}

/// Raises this process's soft descriptor limit to the hard one (a flood needs thousands).
pub fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit");
    hard
}

/// A TCP connection from `source` (any port) to `target`.
pub async fn connect_from(source: IpAddr, target: SocketAddr) -> io::Result<TcpStream> {
    let socket = if source.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(target).await
}

impl Attack {
    /// Runs the attack on a thread and runtime of its own (so that it does not slow down the
    /// poller that measures pmcheck), until `until`.
    pub fn spawn(self, until: Until) -> std::thread::JoinHandle<Arc<AttackCounts>> {
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the attack")
                .block_on(self.run(until))
        })
    }

    /// Runs the attack until `until`; returns its counts.
    pub async fn run(self, until: Until) -> Arc<AttackCounts> {
        let counts = Arc::new(AttackCounts::default());
        let mut tasks = tokio::task::JoinSet::new();
        let kinds = [
            (Kind::Idle, self.idle),
            (Kind::Slowloris, self.slowloris),
            (Kind::Pipeline, self.pipeline),
            (
                Kind::Garbage,
                if self.agent.is_some() {
                    self.garbage
                } else {
                    0
                },
            ),
        ];
        let mut n = 0;
        for (kind, count) in kinds {
            for _ in 0..count {
                let source = self.nth_source(n);
                n += 1;
                let until = until.clone();
                tasks.spawn(hostile(self, source, kind, until, Arc::clone(&counts)));
            }
        }
        while tasks.join_next().await.is_some() {}
        counts
    }
}

impl Attack {
    /// From `source`, all of them (the default shape).
    pub fn from(target: SocketAddr, source: IpAddr) -> Self {
        Self {
            target,
            source,
            sources: 1,
            agent: None,
            garbage: 0,
            pause: Duration::from_millis(10),
            idle: 0,
            slowloris: 0,
            pipeline: 0,
        }
    }

    /// The address of the `n`th connection: `source` plus `n` modulo `sources` (IPv4).
    fn nth_source(&self, n: usize) -> IpAddr {
        match self.source {
            IpAddr::V4(v4) if self.sources > 1 => {
                let step = u32::try_from(n).unwrap_or(0) % self.sources;
                IpAddr::V4((u32::from(v4) + step).into())
            }
            other => other,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Idle,
    Slowloris,
    Pipeline,
    /// Writes garbage to the agent port and never stops.
    Garbage,
}

/// One hostile connection, again and again until `until`.
async fn hostile(
    attack: Attack,
    source: IpAddr,
    kind: Kind,
    until: Until,
    counts: Arc<AttackCounts>,
) {
    let target = match kind {
        Kind::Garbage => attack.agent.unwrap_or(attack.target),
        _ => attack.target,
    };
    while until.going() {
        let connected = tokio::select! {
            connected = connect_from(source, target) => connected,
            () = until.ended() => return,
        };
        let Ok(mut stream) = connected else {
            counts.failed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(attack.pause).await;
            continue;
        };
        counts.connected.fetch_add(1, Ordering::Relaxed);
        tokio::select! {
            () = abuse(&mut stream, kind) => {
                counts.closed_by_server.fetch_add(1, Ordering::Relaxed);
            }
            () = until.ended() => return,
        }
        // Not a spin: the next connection waits a moment.
        tokio::time::sleep(attack.pause).await;
    }
}

/// Runs a measuring poller on a thread and runtime of its own, so that the flood's tasks in
/// the test's runtime do not delay its checks: on a loaded machine they did, by seconds.
pub fn measure<F>(poller: F) -> std::thread::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the poller")
            .block_on(poller)
    })
}

/// Holds the connection the way `kind` does; returns when the server closes it.
async fn abuse(stream: &mut TcpStream, kind: Kind) {
    let mut byte = [0; 1];
    match kind {
        Kind::Idle => {
            let _ = stream.read(&mut byte).await;
        }
        Kind::Slowloris => {
            if stream.write_all(b"GET / HTTP/1.1\r\n").await.is_err() {
                return;
            }
            loop {
                tokio::select! {
                    read = stream.read(&mut byte) => if matches!(read, Ok(0) | Err(_)) { return },
                    () = tokio::time::sleep(Duration::from_secs(1)) => {
                        if stream.write_all(b"X").await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
        Kind::Pipeline => {
            let request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".repeat(64);
            while stream.write_all(&request).await.is_ok() {}
        }
        Kind::Garbage => {
            let garbage = [b'x'; 512];
            while stream.write_all(&garbage).await.is_ok() {}
        }
    }
}

/// A monitor: `connections` kept-alive connections from one address, asked in turn (`GET /`
/// over HTTP/1.1). A request not answered within its timeout, or a connection closed under it,
/// counts as lost (and the connection is opened again at its next turn).
pub struct Monitor {
    target: SocketAddr,
    source: IpAddr,
    open: Vec<Option<TcpStream>>,
}

impl Monitor {
    /// Opens every connection and asks once on each, as a monitor running long before a
    /// flood has: the table's promise is for connections that asked ("a newcomer never
    /// displaces a connection that asked"), not for a monitor's newcomer racing a flood's.
    pub async fn open(
        target: SocketAddr,
        source: IpAddr,
        connections: usize,
        timeout: Duration,
    ) -> io::Result<Self> {
        let mut open = Vec::with_capacity(connections);
        for _ in 0..connections {
            let mut stream = tokio::time::timeout(timeout, connect_from(source, target)).await??;
            tokio::time::timeout(timeout, ask_keepalive(&mut stream)).await??;
            open.push(Some(stream));
        }
        Ok(Self {
            target,
            source,
            open,
        })
    }

    /// Asks on each connection in turn, every `every` until `until`; measuring, `want` asks
    /// are what it needs.
    pub async fn poll(
        mut self,
        every: Duration,
        timeout: Duration,
        until: &Until,
        want: Option<usize>,
    ) -> Polls {
        let mut polls = Polls::default();
        let mut turn = 0;
        while until.going() {
            let started = Instant::now();
            let slots = self.open.len().max(1);
            let Some(slot) = self.open.get_mut(turn % slots) else {
                return polls;
            };
            turn += 1;
            let (source, target) = (self.source, self.target);
            let asked = tokio::time::timeout(timeout, async {
                if slot.is_none() {
                    *slot = Some(connect_from(source, target).await?);
                }
                let stream = slot
                    .as_mut()
                    .ok_or_else(|| io::Error::other("no connection"))?;
                ask_keepalive(stream).await
            })
            .await;
            match asked {
                Ok(Ok(status)) => {
                    polls.latencies.push(started.elapsed());
                    polls.statuses.push(status);
                }
                _ => {
                    polls.lost += 1;
                    *slot = None;
                }
            }
            polls.count_toward(want, until);
            tokio::time::sleep_until(tokio::time::Instant::from_std(started + every)).await;
        }
        polls
    }
}

/// A [`Monitor`] whose connections open at their first turn, every `every` until `until`.
pub async fn monitor_keepalive(
    target: SocketAddr,
    source: IpAddr,
    connections: usize,
    every: Duration,
    timeout: Duration,
    until: Until,
) -> Polls {
    let monitor = Monitor {
        target,
        source,
        open: (0..connections).map(|_| None).collect(),
    };
    monitor.poll(every, timeout, &until, None).await
}

/// A polite flood (the c8a278e audit): `sources` addresses from `first` on, each keeping
/// `connections` connections alive and asking on each every `every`, reading every answer, as
/// monitors do. What they lost, added up.
pub async fn polite_flood(
    target: SocketAddr,
    first: std::net::Ipv4Addr,
    sources: u32,
    connections: usize,
    every: Duration,
    until: &Until,
) -> Polls {
    let tasks: Vec<_> = (0..sources)
        .map(|n| {
            let source = IpAddr::V4(std::net::Ipv4Addr::from(u32::from(first) + n));
            let turn = every / connections as u32;
            tokio::spawn(monitor_keepalive(
                target,
                source,
                connections,
                turn,
                every,
                until.clone(),
            ))
        })
        .collect();
    let mut all = Polls::default();
    for task in tasks {
        if let Ok(polls) = task.await {
            all.lost += polls.lost;
            all.latencies.extend(polls.latencies);
            all.statuses.extend(polls.statuses);
        }
    }
    all
}

/// One keep-alive request and its whole answer (headers and `Content-Length` body).
async fn ask_keepalive(stream: &mut TcpStream) -> io::Result<u16> {
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: pmcheck\r\nUser-Agent: monitor\r\n\r\n")
        .await?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(io::Error::other("closed"));
        }
        answer.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&answer);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_owned())
                })
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| io::Error::other("no content-length"))?;
            if body.len() >= length {
                return head
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| io::Error::other("no status line"));
            }
        }
    }
}

/// Polls as a load balancer does, from `source`, every `every` until `until`: a new connection,
/// HAProxy's request, the whole answer. A poll not answered within `timeout` counts as lost.
/// Measuring, `want` polls are what it needs.
pub async fn poll_like_haproxy(
    target: SocketAddr,
    source: IpAddr,
    (every, timeout): (Duration, Duration),
    until: &Until,
    want: Option<usize>,
) -> Polls {
    poll_with(target, source, CHECK, (every, timeout), until, want).await
}

/// [`poll_like_haproxy`] with a load balancers' key (`http-check send hdr X-Pmcheck-Key`): a
/// proven load balancer.
pub async fn poll_with_key(
    target: SocketAddr,
    source: IpAddr,
    key: &str,
    (every, timeout): (Duration, Duration),
    until: &Until,
    want: Option<usize>,
) -> Polls {
    let check = format!("OPTIONS / HTTP/1.0\r\nX-Pmcheck-Key: {key}\r\n\r\n");
    poll_with(
        target,
        source,
        check.as_bytes(),
        (every, timeout),
        until,
        want,
    )
    .await
}

async fn poll_with(
    target: SocketAddr,
    source: IpAddr,
    check: &[u8],
    (every, timeout): (Duration, Duration),
    until: &Until,
    want: Option<usize>,
) -> Polls {
    let mut polls = Polls::default();
    while until.going() {
        let started = Instant::now();
        match tokio::time::timeout(timeout, poll_once(source, target, check)).await {
            Ok(Ok(status)) => {
                polls.latencies.push(started.elapsed());
                polls.statuses.push(status);
            }
            Ok(Err(e)) => {
                eprintln!("poll from {source} lost after {:?}: {e}", started.elapsed());
                polls.lost += 1
            }
            Err(_) => {
                eprintln!("poll from {source} not answered within {timeout:?}");
                polls.lost += 1
            }
        }
        polls.count_toward(want, until);
        tokio::time::sleep_until(tokio::time::Instant::from_std(started + every)).await;
    }
    polls
}

async fn poll_once(source: IpAddr, target: SocketAddr, check: &[u8]) -> io::Result<u16> {
    let mut stream = connect_from(source, target).await?;
    stream.write_all(check).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let status = answer
        .split(|&b| b == b' ')
        .nth(1)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other("no status line"))?;
    Ok(status)
}

/// What the legitimate poller saw.
#[derive(Debug, Default)]
pub struct Polls {
    pub latencies: Vec<Duration>,
    pub statuses: Vec<u16>,
    pub lost: usize,
}

impl Polls {
    /// Tells `until` when this measuring poller has made the `want` polls it needs.
    fn count_toward(&self, want: Option<usize>, until: &Until) {
        if want == Some(self.latencies.len() + self.lost) {
            until.enough();
        }
    }

    /// The `p`-quantile of the answered polls' latencies (0.5, 0.99, 1.0 for the maximum).
    pub fn quantile(&self, p: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        match sorted.len() {
            0 => Duration::ZERO,
            n => sorted[((n - 1) as f64 * p).round() as usize],
        }
    }
}

/// The largest of a process's resident set size (KiB) and open descriptors, sampled every
/// 100 ms until `until`.
pub async fn sample_process(pid: u32, until: &Until) -> (u64, usize) {
    let (mut rss, mut fds) = (0, 0);
    while until.going() {
        rss = rss.max(rss_kib(pid).unwrap_or(0));
        fds = fds.max(
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|d| d.count())
                .unwrap_or(0),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (rss, fds)
}

pub fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}
