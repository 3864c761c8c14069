//! HTTP as a load balancer speaks it to pmcheck: raw bytes in, the answer parsed.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// An HTTP answer, parsed from the raw bytes on the wire.
#[derive(Debug, Clone)]
pub struct Reply {
    pub raw: String,
    pub status_line: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A TCP connection from `source` (another loopback address, say) to `to`, whose reads give up
/// after `within`.
pub fn connect_from(source: &str, to: SocketAddr, within: Duration) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    let source: SocketAddr = format!("{source}:0").parse().expect("an address");
    socket.bind(&source.into())?;
    socket.connect(&to.into())?;
    socket.set_read_timeout(Some(within))?;
    Ok(socket.into())
}

/// Sends `raw` bytes and reads until the server closes.
pub fn request(addr: SocketAddr, raw: &str) -> Reply {
    let mut stream = TcpStream::connect(addr).expect("pmcheck accepts");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(raw.as_bytes()).unwrap();
    let mut bytes = Vec::new();
    stream
        .read_to_end(&mut bytes)
        .expect("the server closes the connection");
    parse_answer(&String::from_utf8_lossy(&bytes))
}

pub fn parse_answer(raw: &str) -> Reply {
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default().to_owned();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Reply {
        raw: raw.to_owned(),
        status_line,
        status,
        headers,
        body: body.to_owned(),
    }
}

/// HAProxy's agent check: connects, sends `send` if any, and reads until the daemon closes;
/// the line, and how long it took.
pub fn agent_line(addr: SocketAddr, send: Option<&[u8]>) -> (String, std::time::Duration) {
    let started = std::time::Instant::now();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    if let Some(bytes) = send {
        stream.write_all(bytes).unwrap();
    }
    let mut line = String::new();
    stream
        .read_to_string(&mut line)
        .expect("the daemon closes after its line");
    (line, started.elapsed())
}
