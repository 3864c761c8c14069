//! pmcheck under a connection flood, beside the quiet case, in one run: a load balancer polls
//! from 127.0.0.2 (a new connection per poll, HAProxy's bytes) while 5,000 hostile connections
//! from 127.0.0.1 (idle, byte-a-second and never-reading pipelines, reconnecting as they are
//! closed) attack. pmcheck starts under systemd's default soft descriptor limit of 1,024.
//!
//!
//! A third phase fills the kernel's TCP table with TIME_WAIT entries (100,000 by default)
//! while 16 local clients ask for the operator's JSON view, whose agent connections are read
//! from that table, as fast as they can: the load balancer's polls must not slow down, and no
//! verdict may change (the phase's log lines).
//!
//!     cargo bench --bench flood                          # this build
//!     PMCHECK_BIN=/path/to/pmcheck cargo bench --bench flood   # another one
//!     FLOOD_SECONDS=60 FLOOD_CONNECTIONS=5000 cargo bench --bench flood
//!     FLOOD_PHASES=quiet,timewait FLOOD_TIMEWAIT=100000 FLOOD_JSON_CLIENTS=16 cargo bench --bench flood
//!
//! Two more phases: `spread`, the flood from 2,000 addresses with one connection each (no
//! address holds the most, so shedding must go by what the connections do), and `garbage`, 200
//! clients writing garbage to the agent port as fast as it is taken. In every phase a monitor
//! also asks on two kept-alive connections from 127.0.0.4, opened before the flood (its columns
//! after `max`).

#[path = "../tests/common/flood.rs"]
mod flood;

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use flood::{Attack, Polls};

/// The daemon under test, killed by PID when the bench ends however it ends.
struct Daemon {
    child: Child,
    addr: SocketAddr,
    agent: SocketAddr,
    log_lines: Arc<AtomicUsize>,
    _state: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(bin: &str) -> Daemon {
    let state = tempfile::tempdir().expect("a state directory");
    // An empty puppet.conf (a regular file: pmcheck refuses to read a device such as /dev/null).
    let puppet_conf = state.path().join("puppet.conf");
    std::fs::write(&puppet_conf, "").expect("an empty puppet.conf");
    let state_dir = state.path().join("state");
    std::fs::create_dir(&state_dir).expect("a state directory");
    // A port nobody listens on: polls are answered from the latest probe whatever it says.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let mut child = Command::new("sh")
        .args(["-c", "ulimit -Sn 1024 && exec \"$0\" \"$@\"", bin, "serve"])
        .args(["--listen", "127.0.0.1:0", "--puppet-conf"])
        .arg(&puppet_conf)
        .args(["--agent-listen", "127.0.0.1:0"])
        .args([
            "--certname",
            "bench.example",
            "--puppet-addr",
            &closed.to_string(),
        ])
        .arg("--state-dir")
        .arg(&state_dir)
        .env_clear()
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pmcheck starts");
    let stderr = child.stderr.take().expect("piped stderr");
    let log_lines = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel();
    let lines = Arc::clone(&log_lines);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            lines.fetch_add(1, Ordering::Relaxed);
            for (agent, needle) in [(false, "listening on "), (true, "agent checks on ")] {
                if let Some(addr) = line.split(needle).nth(1) {
                    let _ = tx.send((agent, addr.trim().parse::<SocketAddr>()));
                }
            }
            if std::env::var_os("FLOOD_SHOW_LOG").is_some() {
                eprintln!("  pmcheck: {line}");
            }
        }
    });
    let mut daemon = Daemon {
        child,
        addr: "127.0.0.1:0".parse().expect("an address"),
        agent: "127.0.0.1:0".parse().expect("an address"),
        log_lines,
        _state: state,
    };
    for _ in 0..2 {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok((false, Ok(addr))) => daemon.addr = addr,
            Ok((true, Ok(addr))) => daemon.agent = addr,
            other => panic!("pmcheck did not say where it listens: {other:?}"),
        }
    }
    daemon
}

struct Phase {
    name: String,
    polls: Polls,
    /// A monitor's requests on two kept-alive connections from 127.0.0.4.
    monitor: Polls,
    rss_kib: u64,
    fds: usize,
    log_lines: usize,
    hostile: u64,
}

async fn phase(d: &Daemon, name: &str, seconds: u64, attack: Option<Attack>) -> Phase {
    let lb: IpAddr = "127.0.0.2".parse().expect("an address");
    let monitor: IpAddr = "127.0.0.4".parse().expect("an address");
    let monitor = flood::Monitor::open(d.addr, monitor, 2, Duration::from_secs(2))
        .await
        .expect("the monitor's two connections, before the flood");
    let phase = Duration::from_secs(seconds);
    let until = flood::Until::new(phase, phase, 0);
    let logged = d.log_lines.load(Ordering::Relaxed);
    let attacking = attack.map(|a| a.spawn(until.clone()));
    let every = (Duration::from_millis(10), Duration::from_secs(2));
    let (polls, monitor, (rss_kib, fds)) = tokio::join!(
        flood::poll_like_haproxy(d.addr, lb, every, &until, None),
        monitor.poll(
            Duration::from_millis(20),
            Duration::from_secs(2),
            &until,
            None
        ),
        flood::sample_process(d.child.id(), &until),
    );
    let hostile = attacking
        .map(|t| {
            t.join()
                .expect("the attack")
                .connected
                .load(Ordering::Relaxed)
        })
        .unwrap_or(0);
    Phase {
        name: name.to_owned(),
        polls,
        monitor,
        rss_kib,
        fds,
        log_lines: d.log_lines.load(Ordering::Relaxed) - logged,
        hostile,
    }
}

/// Leaves about `n` connections in TIME_WAIT: from eight source addresses (ephemeral ports run
/// out at about 28,000 per address) to eight listeners, each closed by the client first.
/// Returns how many TIME_WAIT entries the kernel holds then.
fn make_time_wait(n: usize) -> usize {
    use std::io::Read;
    let mut targets = Vec::new();
    for _ in 0..8 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
        targets.push(listener.local_addr().expect("its address"));
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let _ = stream.read_to_end(&mut Vec::new());
            }
        });
    }
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let target = targets[i];
            std::thread::spawn(move || {
                use socket2::{Domain, Socket, Type};
                let source: SocketAddr =
                    format!("127.0.3.{}:0", i + 1).parse().expect("an address");
                for _ in 0..n / 8 {
                    let Ok(socket) = Socket::new(Domain::IPV4, Type::STREAM, None) else {
                        continue;
                    };
                    if socket.bind(&source.into()).is_ok() {
                        let _ = socket.connect(&target.into());
                    }
                }
            })
        })
        .collect();
    for c in clients {
        let _ = c.join();
    }
    time_wait_entries()
}

/// TIME_WAIT entries in this network namespace (state 06 in /proc/net/tcp).
fn time_wait_entries() -> usize {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|t| {
            t.lines()
                .filter(|l| l.split_whitespace().nth(3) == Some("06"))
                .count()
        })
        .sum()
}

/// `clients` threads asking `addr` for the operator's JSON view over kept-alive connections
/// until `until`; how many answers they got.
fn json_clients(addr: SocketAddr, clients: usize, until: Instant) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let threads: Vec<_> = (0..clients)
            .map(|_| {
                std::thread::spawn(move || {
                    use std::io::{BufRead, BufReader, Read, Write};
                    let mut answers = 0u64;
                    let ask = b"GET / HTTP/1.1\r\nHost: pmcheck\r\nAccept: application/json\r\nUser-Agent: pmcheck/bench\r\n\r\n";
                    'connect: while Instant::now() < until {
                        let Ok(stream) = std::net::TcpStream::connect(addr) else { continue };
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                        let mut reader = BufReader::new(stream);
                        while Instant::now() < until {
                            if reader.get_mut().write_all(ask).is_err() {
                                continue 'connect;
                            }
                            let mut length = 0usize;
                            loop {
                                let mut line = String::new();
                                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                    continue 'connect;
                                }
                                if line == "\r\n" {
                                    break;
                                }
                                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                                    length = v.trim().parse().unwrap_or(0);
                                }
                            }
                            let mut body = vec![0; length];
                            if reader.read_exact(&mut body).is_err() {
                                continue 'connect;
                            }
                            answers += 1;
                        }
                    }
                    answers
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap_or(0)).sum()
    })
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let bin =
        std::env::var("PMCHECK_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_pmcheck").to_owned());
    let seconds = env_number("FLOOD_SECONDS", 20);
    let total = env_number("FLOOD_CONNECTIONS", 5000) as usize;
    let fds = flood::raise_fd_limit();
    assert!(
        fds as usize > total + 500,
        "the bench needs more than {total} descriptors; its hard limit is {fds}"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let d = start(&bin);
    println!("pmcheck {bin} on {} (pid {})", d.addr, d.child.id());
    let attack = Attack {
        idle: total * 2 / 5,
        slowloris: total * 3 / 10,
        pipeline: total - total * 2 / 5 - total * 3 / 10,
        ..Attack::from(d.addr, "127.0.0.1".parse().expect("an address"))
    };
    // The same flood from 2,000 addresses, one connection each: no address holds the most.
    let spread = Attack {
        sources: 2000,
        idle: 1200,
        slowloris: 600,
        pipeline: 200,
        ..Attack::from(d.addr, "127.1.0.1".parse().expect("an address"))
    };
    // Clients that write garbage to the agent port as fast as it is taken.
    let garbage = Attack {
        sources: 200,
        agent: Some(d.agent),
        garbage: 200,
        ..Attack::from(d.addr, "127.2.0.1".parse().expect("an address"))
    };
    let wanted = std::env::var("FLOOD_PHASES")
        .unwrap_or_else(|_| "quiet,flood,spread,garbage,timewait".into());
    let wants = |name: &str| wanted.split(',').any(|w| w == name);
    let time_wait = env_number("FLOOD_TIMEWAIT", 100_000) as usize;
    let json = env_number("FLOOD_JSON_CLIENTS", 16) as usize;
    let phases = rt.block_on(async {
        // Let the first probe land.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut phases = Vec::new();
        if wants("quiet") {
            phases.push(phase(&d, "quiet", 5, None).await);
        }
        if wants("flood") {
            phases.push(phase(&d, &format!("{total} hostile"), seconds, Some(attack)).await);
        }
        if wants("spread") {
            phases.push(phase(&d, "2000 sources", seconds, Some(spread)).await);
        }
        if wants("garbage") {
            phases.push(phase(&d, "200 garbage", seconds, Some(garbage)).await);
        }
        if wants("timewait") {
            let entries = tokio::task::spawn_blocking(move || make_time_wait(time_wait))
                .await
                .unwrap_or(0);
            let until = Instant::now() + Duration::from_secs(seconds.min(20));
            let asking = json_clients(d.addr, json, until);
            let mut p = phase(
                &d,
                &format!("{}k TW+{json} JSON", entries / 1000),
                seconds.min(20),
                None,
            )
            .await;
            p.hostile = asking.join().unwrap_or(0);
            println!(
                "TIME_WAIT entries: {entries}; JSON answers to {json} local clients: {}",
                p.hostile
            );
            phases.push(p);
        }
        phases
    });
    println!(
        "\n{:<14} {:>6} {:>6} {:>9} {:>9} {:>9} {:>8} {:>5} {:>9} {:>9} {:>7} {:>9} {:>9}",
        "phase",
        "polls",
        "lost",
        "p50",
        "p99",
        "max",
        "monitor",
        "lost",
        "p99",
        "RSS KiB",
        "fds",
        "log lines",
        "attacks/JSON"
    );
    for p in &phases {
        let ms = |d: Duration| format!("{:.1}ms", d.as_secs_f64() * 1000.0);
        println!(
            "{:<14} {:>6} {:>6} {:>9} {:>9} {:>9} {:>8} {:>5} {:>9} {:>9} {:>7} {:>9} {:>9}",
            p.name,
            p.polls.latencies.len(),
            p.polls.lost,
            ms(p.polls.quantile(0.5)),
            ms(p.polls.quantile(0.99)),
            ms(p.polls.quantile(1.0)),
            p.monitor.latencies.len(),
            p.monitor.lost,
            ms(p.monitor.quantile(0.99)),
            p.rss_kib,
            p.fds,
            p.log_lines,
            p.hostile
        );
    }
}
