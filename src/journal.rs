//! systemd's native journal protocol, for entries with fields of their own (`ACTION=drain`)
//! that `journalctl -u pmcheck ACTION=drain` can select. Only used when `JOURNAL_STREAM` says
//! stderr is the journal, as systemd documents: the `device:inode` it names is fd 2's.
//!
//! One datagram per entry to `/run/systemd/journal/socket`: `KEY=value\n` lines, or for a
//! value holding a newline, `KEY\n`, its length as 64-bit little-endian, the value, `\n`.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::path::Path;

/// journald's socket for native entries.
pub const SOCKET: &str = "/run/systemd/journal/socket";

/// Whether stderr is connected to the journal: `JOURNAL_STREAM` (`device:inode`) names fd 2.
pub fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(stat) = nix::sys::stat::fstat(io::stderr().as_fd()) else {
        return false;
    };
    stream.to_str() == Some(&format!("{}:{}", stat.st_dev, stat.st_ino))
}

/// A field name as journald accepts it: uppercase letters, digits and underscores, not
/// starting with an underscore (those are journald's own).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('_')
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// One entry's datagram; fields with invalid names are left out.
pub fn encode<'a>(fields: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields.into_iter().filter(|(n, _)| valid_name(n)) {
        out.extend_from_slice(name.as_bytes());
        if value.contains('\n') {
            out.push(b'\n');
            out.extend_from_slice(&(value.len() as u64).to_le_bytes());
        } else {
            out.push(b'=');
        }
        out.extend_from_slice(value.as_bytes());
        out.push(b'\n');
    }
    out
}

/// Sends one entry to the journal socket at `socket`.
pub fn send<'a>(
    socket: &Path,
    fields: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> io::Result<()> {
    let datagram = encode(fields);
    UnixDatagram::unbound()?
        .send_to(&datagram, socket)
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes a datagram as journald does, to check the encoding against the protocol.
    fn decode(mut bytes: &[u8]) -> Vec<(String, String)> {
        let mut fields = Vec::new();
        while !bytes.is_empty() {
            let end = bytes.iter().position(|&b| b == b'\n').unwrap();
            let line = &bytes[..end];
            if let Some(eq) = line.iter().position(|&b| b == b'=') {
                let (k, v) = (&line[..eq], &line[eq + 1..]);
                fields.push((
                    String::from_utf8(k.to_vec()).unwrap(),
                    String::from_utf8(v.to_vec()).unwrap(),
                ));
                bytes = &bytes[end + 1..];
            } else {
                let name = String::from_utf8(line.to_vec()).unwrap();
                let rest = &bytes[end + 1..];
                let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
                let value = String::from_utf8(rest[8..8 + len].to_vec()).unwrap();
                assert_eq!(rest[8 + len], b'\n', "a binary value ends with a newline");
                fields.push((name, value));
                bytes = &rest[8 + len + 1..];
            }
        }
        fields
    }

    #[test]
    fn an_entry_reaches_a_socket_standing_in_for_journald_field_by_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket");
        let journald = UnixDatagram::bind(&path).unwrap();
        send(
            &path,
            [
                ("MESSAGE", "drain by alice: kernel"),
                ("ACTION", "drain"),
                ("REASON", "two\nlines"),
                ("_PID", "1"),
                ("lower", "x"),
            ],
        )
        .unwrap();
        let mut buf = vec![0; 4096];
        let n = journald.recv(&mut buf).unwrap();
        let fields = decode(&buf[..n]);
        assert_eq!(
            fields,
            [
                ("MESSAGE".into(), "drain by alice: kernel".into()),
                ("ACTION".into(), "drain".into()),
                ("REASON".into(), "two\nlines".into()),
            ],
            "trusted and invalid names are left out"
        );
        assert!(
            buf[..n].starts_with(b"MESSAGE=drain by alice: kernel\nACTION=drain\nREASON\n\x09\0"),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
    }

    #[test]
    fn journal_stream_must_name_stderr() {
        // The test's stderr is not the journal, whatever JOURNAL_STREAM says elsewhere.
        if std::env::var_os("JOURNAL_STREAM").is_none() {
            assert!(!stderr_is_journal());
        }
    }
}
