//! Agent traffic: the established TCP connections to Puppet Server's listener, read the way
//! `ss` does from the kernel's socket tables (`/proc/self/net/tcp` and `tcp6`, the same tables
//! as `/proc/net/*`, and still visible under systemd's `ProcSubset=pid`).
//!
//! pmcheck's own probes are connections to that listener too. They are told apart by socket
//! inode: a socket whose inode is one of this process's descriptors (`/proc/self/fd`) is a
//! probe's client end, and the listener's end of it is the connection whose remote address is
//! that client's local one. Everything else (an agent through the load balancer, an agent
//! that bypasses it, another tool) is traffic.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use thiserror::Error;

/// The kernel's tables, IPv4 then IPv6.
const TABLES: [(&str, bool); 2] = [("/proc/self/net/tcp", false), ("/proc/self/net/tcp6", true)];
/// `TCP_ESTABLISHED` in the tables' `st` column.
const ESTABLISHED: u8 = 0x01;
/// `TCP_LISTEN`.
const LISTEN: u8 = 0x0a;

/// Why the connections cannot be read: a table or this process's descriptor list is
/// unreadable (not Linux, no /proc).
#[derive(Debug, Error)]
#[error("cannot read {path}: {source} (pmcheck reads TCP connections from /proc on Linux)")]
pub struct TrafficError {
    /// The file or directory.
    path: String,
    /// Why.
    source: io::Error,
}

/// One row of a socket table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Socket {
    /// This host's end (IPv4-mapped addresses as IPv4).
    pub local: SocketAddr,
    /// The other end.
    pub remote: SocketAddr,
    /// The TCP state (`st`).
    pub state: u8,
    /// The socket's inode, which names it in `/proc/PID/fd`.
    pub inode: u64,
}

/// The remote ends of the established connections to the Puppet Server listening at `puppet`
/// (the address pmcheck probes), without pmcheck's own probes.
pub fn connections(puppet: SocketAddr) -> Result<Vec<SocketAddr>, TrafficError> {
    // This process's sockets before and after the tables are read: a probe that connects
    // or closes in between is in one of the two lists (with only the list before, a probe
    // connected meanwhile was counted as an agent, once in a run of the whole suite). One
    // that both connects and closes in between is still missed: the window is narrowed, not
    // closed.
    let mut own = own_inodes(Path::new("/proc/self/fd"))?;
    let mut sockets = Vec::new();
    for (path, v6) in TABLES {
        match fs::read_to_string(path) {
            Ok(text) => sockets.extend(parse(&text, v6)),
            // A kernel without IPv6 has no tcp6.
            Err(e) if v6 && e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(TrafficError {
                    path: path.to_owned(),
                    source,
                });
            }
        }
    }
    own.extend(own_inodes(Path::new("/proc/self/fd"))?);
    Ok(agent_connections(&sockets, puppet, &own))
}

/// The remote ends of established connections to Puppet Server's listener, minus those whose
/// client end is one of `own` (this process's sockets).
pub fn agent_connections(
    sockets: &[Socket],
    puppet: SocketAddr,
    own: &HashSet<u64>,
) -> Vec<SocketAddr> {
    let puppet = SocketAddr::new(puppet.ip().to_canonical(), puppet.port());
    // A listener on the wildcard address takes connections to every local address; one on
    // a given address (two Puppet Servers on one host) only those to it.
    let wildcard = sockets.iter().any(|s| {
        s.state == LISTEN && s.local.port() == puppet.port() && s.local.ip().is_unspecified()
    });
    let ours: HashSet<SocketAddr> = sockets
        .iter()
        .filter(|s| own.contains(&s.inode) && s.remote == puppet)
        .map(|s| s.local)
        .collect();
    let mut remotes: Vec<SocketAddr> = sockets
        .iter()
        .filter(|s| {
            s.state == ESTABLISHED
                && s.local.port() == puppet.port()
                && (wildcard || s.local.ip() == puppet.ip())
                && !ours.contains(&s.remote)
        })
        .map(|s| s.remote)
        .collect();
    remotes.sort();
    remotes.dedup();
    remotes
}

/// The inodes of this process's sockets: `socket:[INODE]` links in `fd_dir`.
fn own_inodes(fd_dir: &Path) -> Result<HashSet<u64>, TrafficError> {
    let fail = |source| TrafficError {
        path: fd_dir.display().to_string(),
        source,
    };
    Ok((fs::read_dir(fd_dir).map_err(fail)?)
        // A descriptor closed while listing: not a probe any more.
        .filter_map(|entry| entry.and_then(|e| fs::read_link(e.path())).ok())
        .filter_map(|target| {
            let inode = target
                .to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?;
            inode.parse().ok()
        })
        .collect())
}

/// The rows of one table; malformed rows are skipped.
pub fn parse(text: &str, v6: bool) -> impl Iterator<Item = Socket> + '_ {
    text.lines().skip(1).filter_map(move |line| {
        let mut fields = line.split_whitespace();
        let _slot = fields.next()?;
        let local = address(fields.next()?, v6)?;
        let remote = address(fields.next()?, v6)?;
        let state = u8::from_str_radix(fields.next()?, 16).ok()?;
        // tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
        let inode = fields.nth(5)?.parse().ok()?;
        Some(Socket {
            local,
            remote,
            state,
            inode,
        })
    })
}

/// `0100007F:1FCC` or 32 hex digits and a port. The kernel prints each 32-bit word of the
/// address as a native-endian number, and the port as a plain one.
fn address(text: &str, v6: bool) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = ip.get(8 * i..8 * i + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match (v6, ip.len()) {
        (true, 32) => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[4 * i..4 * i + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes)).to_canonical()
        }
        (false, 8) => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows as a little-endian kernel prints them (the `ss -tan` view in the comments).
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0200007F:1FCC 00000000:0000 0A 00000000:00000000 00:00000000 00000000   112        0 1001 1 0000000000000000 100 0 0 10 0
   1: 0300007F:1FCC 00000000:0000 0A 00000000:00000000 00:00000000 00000000   112        0 1002 1 0000000000000000 100 0 0 10 0
   2: 0200007F:1FCC 0100007F:A001 01 00000000:00000000 00:00000000 00000000   112        0 1003 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:A001 0200007F:1FCC 01 00000000:00000000 00:00000000 00000000     0        0 1004 1 0000000000000000 20 4 30 10 -1
   4: 0200007F:1FCC 0100007F:B002 01 00000000:00000000 00:00000000 00000000   112        0 1005 1 0000000000000000 20 4 30 10 -1
   5: 0300007F:1FCC 0100007F:C003 01 00000000:00000000 00:00000000 00000000   112        0 1006 1 0000000000000000 20 4 30 10 -1
   6: 0200007F:1FCC 0100007F:D004 06 00000000:00000000 00:00000000 00000000     0        0 0 3 0000000000000000
   7: garbage
";
    // [::]:8140 listening, and ::ffff:10.0.0.5:40000 -> ::ffff:192.168.1.10:8140
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1FCC 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000   112        0 2001 1 0000000000000000 100 0 0 10 0
   1: 0000000000000000FFFF00000A01A8C0:1FCC 0000000000000000FFFF00000500000A:9C40 01 00000000:00000000 00:00000000 00000000   112        0 2002 1 0000000000000000 20 4 30 10 -1
   2: 00000000000000000000000001000000:1FCC 00000000000000000000000001000000:E001 01 00000000:00000000 00:00000000 00000000   112        0 2003 1 0000000000000000 20 4 30 10 -1
";

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn parses_both_tables_into_addresses() {
        let v4: Vec<Socket> = parse(TCP, false).collect();
        assert_eq!(v4.len(), 7, "the garbage row is skipped");
        assert_eq!(v4[2].local, addr("127.0.0.2:8140"));
        assert_eq!(v4[2].remote, addr("127.0.0.1:40961"));
        assert_eq!((v4[2].state, v4[2].inode), (ESTABLISHED, 1003));
        let v6: Vec<Socket> = parse(TCP6, true).collect();
        assert_eq!(v6[0].local, addr("[::]:8140"));
        assert_eq!(v6[0].state, LISTEN);
        assert_eq!(
            v6[1].local,
            addr("192.168.1.10:8140"),
            "IPv4-mapped as IPv4"
        );
        assert_eq!(v6[1].remote, addr("10.0.0.5:40000"));
        assert_eq!(v6[2].remote, addr("[::1]:57345"));
    }

    #[test]
    fn counts_connections_to_its_own_listener_without_the_probe() {
        let sockets: Vec<Socket> = parse(TCP, false).collect();
        // This process owns inode 1004: the probe 127.0.0.1:40961 -> 127.0.0.2:8140.
        let own = HashSet::from([1004]);
        let seen = agent_connections(&sockets, addr("127.0.0.2:8140"), &own);
        // Not the probe's, not the other server's (127.0.0.3), not TIME_WAIT.
        assert_eq!(seen, [addr("127.0.0.1:45058")]);
        let other = agent_connections(&sockets, addr("127.0.0.3:8140"), &own);
        assert_eq!(other, [addr("127.0.0.1:49155")]);
        let without_ownership =
            agent_connections(&sockets, addr("127.0.0.2:8140"), &HashSet::new());
        assert_eq!(
            without_ownership.len(),
            2,
            "the probe counts when it is not ours"
        );
    }

    #[test]
    fn a_wildcard_listener_takes_every_local_address() {
        let sockets: Vec<Socket> = parse(TCP6, true).collect();
        let seen = agent_connections(&sockets, addr("127.0.0.1:8140"), &HashSet::new());
        assert_eq!(seen, [addr("10.0.0.5:40000"), addr("[::1]:57345")]);
    }

    #[test]
    fn reads_this_hosts_tables_and_finds_a_connection_it_makes() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(server).unwrap();
        let (_accepted, _) = listener.accept().unwrap();
        // Both ends belong to this process: the client end is "ours", so it is a probe.
        assert_eq!(connections(server).unwrap(), []);
        let sockets: Vec<Socket> = TABLES
            .iter()
            .flat_map(|(path, v6)| {
                parse(&fs::read_to_string(path).unwrap_or_default(), *v6).collect::<Vec<_>>()
            })
            .collect();
        let seen = agent_connections(&sockets, server, &HashSet::new());
        assert_eq!(seen, [client.local_addr().unwrap()]);
    }
}
