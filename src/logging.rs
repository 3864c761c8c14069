//! The daemon's log. Every event is a constant message with its values as fields, rendered
//! for people one way everywhere: the message, then each field as ` key=value` (logfmt: a value
//! with a space, `=` or `"` in double quotes), e.g. `verdict changed verdict=DOWN
//! reason="drained: kernel upgrade"`. Under systemd every event is also a native journal
//! entry whose fields (`VERDICT`, `REASON`, `PEER`, `ACTION`, ...) `journalctl -u pmcheck
//! VERDICT=DOWN` can select, its `MESSAGE` that same line; elsewhere the line goes to stderr.
//!
//! The journal is used only when `JOURNAL_STREAM` says stderr is the journal, as systemd
//! documents: the `device:inode` it names is fd 2's (a daemon started from a unit but with
//! stderr redirected keeps writing where it was sent).

use std::fmt::{self, Write as _};
use std::io::{self, IsTerminal as _, Write as _};
use std::os::fd::AsFd as _;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

/// journald's socket for native entries.
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

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

/// Logs at `level` (or `RUST_LOG`), to the journal with fields when stderr is the journal and
/// journald takes entries, else as text on stderr.
pub fn init(level: &str) {
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    if stderr_is_journal()
        && let Ok(journal) = Journal::new(JOURNAL_SOCKET)
    {
        let _ = tracing_subscriber::registry()
            .with(journal.with_filter(filter()))
            .try_init();
        return;
    }
    let text = tracing_subscriber::fmt::layer()
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .with_target(false)
        .fmt_fields(Logfmt);
    // Under systemd (stderr a journal stream journald refused) the journal stamps lines already.
    let registry = tracing_subscriber::registry().with(filter());
    let _ = if stderr_is_journal() {
        registry.with(text.without_time()).try_init()
    } else {
        registry.with(text).try_init()
    };
}

/// One event's message and fields, as recorded.
#[derive(Debug, Default)]
struct Fields {
    message: String,
    fields: Vec<(&'static str, String)>,
}

impl Fields {
    fn of(record: impl RecordFields) -> Self {
        let mut fields = Self::default();
        record.record(&mut fields);
        fields
    }

    /// The message, then ` key=value` per field.
    fn render(&self) -> String {
        let mut line = self.message.clone();
        for (name, value) in &self.fields {
            let _ = write!(line, " {name}={}", Quoted(value));
        }
        line
    }

    fn put(&mut self, field: &Field, value: String) {
        // What the `log` crate's records carry (rustls, reqwest at debug) says nothing to
        // an operator.
        if field.name().starts_with("log.") {
            return;
        }
        if field.name() == "message" {
            self.message = value;
        } else {
            self.fields.push((field.name(), value));
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.to_owned());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, format!("{value:?}"));
    }
}

/// A value as logfmt writes it: bare, or in double quotes (`\` and `"` escaped, a control
/// character as Rust writes it: `\n`) when it is empty or holds a space, `=`, `"` or a control
/// character.
struct Quoted<'v>(&'v str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bare = !self.0.is_empty()
            && !(self.0.chars())
                .any(|c| c.is_whitespace() || c.is_control() || c == '=' || c == '"');
        if bare {
            return f.write_str(self.0);
        }
        f.write_char('"')?;
        for c in self.0.chars() {
            match c {
                '"' | '\\' => write!(f, "\\{c}")?,
                // `\n`, `\r`, `\t`, `\u{1b}`: nothing that moves a terminal's cursor or colours it.
                c if c.is_control() => write!(f, "{}", c.escape_default())?,
                c => f.write_char(c)?,
            }
        }
        f.write_char('"')
    }
}

/// The text layer's fields: the same line as the journal's `MESSAGE`.
struct Logfmt;

impl<'w> FormatFields<'w> for Logfmt {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        writer.write_str(&Fields::of(fields).render())
    }
}

/// Writes each event as a native journal entry, one datagram to journald's socket.
struct Journal {
    socket: UnixDatagram,
    path: PathBuf,
}

impl Journal {
    /// A writer to journald listening at `path`; fails unless an empty datagram (which
    /// journald ignores) reaches it.
    fn new(path: impl Into<PathBuf>) -> io::Result<Self> {
        let journal = Self {
            socket: UnixDatagram::unbound()?,
            path: path.into(),
        };
        journal.socket.send_to(&[], &journal.path)?;
        Ok(journal)
    }
}

impl<S: Subscriber> Layer<S> for Journal {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let fields = Fields::of(event);
        let level = *event.metadata().level();
        let entry = entry(&fields, level);
        if self.socket.send_to(&entry, &self.path).is_err() {
            // Too large a datagram, or journald gone: stderr is the journal's stream too,
            // which takes a `<priority>` prefix.
            let line = format!("<{}>{}\n", priority(level), fields.render());
            let _ = io::stderr().write_all(line.as_bytes());
        }
    }
}

/// syslog's priority of a level, as journald files it (`journalctl -p`).
fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// The native protocol's entry: `MESSAGE` (the rendered line), `PRIORITY`,
/// `SYSLOG_IDENTIFIER=pmcheck`, and each field under its journal name.
fn entry(fields: &Fields, level: Level) -> Vec<u8> {
    let mut entry = Vec::new();
    put(&mut entry, "MESSAGE", &fields.render());
    put(&mut entry, "PRIORITY", &priority(level).to_string());
    put(&mut entry, "SYSLOG_IDENTIFIER", "pmcheck");
    for (name, value) in &fields.fields {
        put(&mut entry, &journal_name(name), value);
    }
    entry
}

/// `KEY=value\n`, or for a value holding a line break `KEY\n`, its length (64-bit little
/// endian), the value and `\n`.
fn put(entry: &mut Vec<u8>, key: &str, value: &str) {
    entry.extend_from_slice(key.as_bytes());
    if value.contains('\n') {
        entry.push(b'\n');
        entry.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        entry.push(b'=');
    }
    entry.extend_from_slice(value.as_bytes());
    entry.push(b'\n');
}

/// A field's name as journald takes it: upper case, `[A-Z0-9_]` only, not starting with `_`
/// (the journal's own) or a digit, at most 64 characters.
fn journal_name(name: &str) -> String {
    let mut key: String = (name.trim_start_matches('_').chars())
        .map(|c| match c.to_ascii_uppercase() {
            c @ ('A'..='Z' | '0'..='9') => c,
            _ => '_',
        })
        .collect();
    if !key.starts_with(|c: char| c.is_ascii_uppercase()) {
        key.insert_str(0, "F_");
    }
    key.truncate(64);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(message: &str, fields: &[(&'static str, &str)]) -> String {
        let fields = Fields {
            message: message.to_owned(),
            fields: (fields.iter())
                .map(|(k, v)| (*k, (*v).to_owned()))
                .collect(),
        };
        fields.render()
    }

    #[test]
    fn a_line_is_the_message_then_logfmt_fields() {
        assert_eq!(
            line(
                "verdict changed",
                &[
                    ("verdict", "DOWN"),
                    ("reason", "drained: kernel upgrade"),
                    ("weight", "0")
                ]
            ),
            "verdict changed verdict=DOWN reason=\"drained: kernel upgrade\" weight=0"
        );
        assert_eq!(line("shutting down", &[]), "shutting down");
        assert_eq!(
            line(
                "m",
                &[
                    ("empty", ""),
                    ("eq", "a=b"),
                    ("quote", "say \"hi\""),
                    ("back", "C:\\x"),
                    ("both", "a \\ b"),
                    ("lines", "one\ntwo"),
                    ("addr", "[::1]:9200"),
                ]
            ),
            r#"m empty="" eq="a=b" quote="say \"hi\"" back=C:\x both="a \\ b" lines="one\ntwo" addr=[::1]:9200"#
        );
    }

    /// Decodes the native protocol (for the tests).
    fn decode(mut bytes: &[u8]) -> Vec<(String, String)> {
        let mut fields = Vec::new();
        while let Some(end) = bytes.iter().position(|&b| b == b'=' || b == b'\n') {
            let name = String::from_utf8(bytes[..end].to_vec()).unwrap();
            let value;
            if bytes[end] == b'=' {
                let rest = &bytes[end + 1..];
                let stop = rest.iter().position(|&b| b == b'\n').unwrap();
                (value, bytes) = (&rest[..stop], &rest[stop + 1..]);
            } else {
                let (len, rest) = bytes[end + 1..].split_at(8);
                let len = usize::try_from(u64::from_le_bytes(len.try_into().unwrap())).unwrap();
                assert_eq!(rest[len], b'\n');
                (value, bytes) = (&rest[..len], &rest[len + 1..]);
            }
            fields.push((name, String::from_utf8(value.to_vec()).unwrap()));
        }
        fields
    }

    #[test]
    fn an_entry_is_journald_native_protocol() {
        let fields = Fields {
            message: "drain event".to_owned(),
            fields: vec![("who", "alice".to_owned()), ("reason", "a\nb".to_owned())],
        };
        let bytes = entry(&fields, Level::WARN);
        let mut want = b"MESSAGE=drain event who=alice reason=\"a\\nb\"\nPRIORITY=4\n\
                         SYSLOG_IDENTIFIER=pmcheck\nWHO=alice\nREASON\n"
            .to_vec();
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(b"a\nb\n");
        assert_eq!(bytes, want);
        assert_eq!(decode(&bytes)[4], ("REASON".to_owned(), "a\nb".to_owned()));
    }

    #[test]
    fn journal_names_are_upper_case_and_safe() {
        assert_eq!(journal_name("event_time"), "EVENT_TIME");
        assert_eq!(journal_name("lb-key.file"), "LB_KEY_FILE");
        assert_eq!(journal_name("_pid"), "PID");
        assert_eq!(journal_name("9lives"), "F_9LIVES");
        assert_eq!(journal_name(&"x".repeat(80)).len(), 64);
    }

    #[test]
    fn every_event_is_a_datagram_to_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket");
        let journald = UnixDatagram::bind(&path).unwrap();
        let journal = Journal::new(&path).unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        assert_eq!(journald.recv(&mut buf).unwrap(), 0, "the empty probe");
        let subscriber = tracing_subscriber::registry().with(journal);
        tracing::subscriber::with_default(subscriber, || {
            let reason = "drained: kernel upgrade";
            tracing::info!(verdict = "DOWN", %reason, weight = 0u32, "verdict changed");
        });
        let n = journald.recv(&mut buf).unwrap();
        let fields = decode(&buf[..n]);
        let get = |k: &str| {
            (fields.iter())
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(
            get("MESSAGE"),
            Some("verdict changed verdict=DOWN reason=\"drained: kernel upgrade\" weight=0")
        );
        assert_eq!(get("PRIORITY"), Some("6"));
        assert_eq!(get("SYSLOG_IDENTIFIER"), Some("pmcheck"));
        assert_eq!(get("VERDICT"), Some("DOWN"));
        assert_eq!(get("REASON"), Some("drained: kernel upgrade"));
        assert_eq!(get("WEIGHT"), Some("0"));
    }
}
