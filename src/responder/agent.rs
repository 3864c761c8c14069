//! The HAProxy agent check (`agent-check agent-port 9201`): for each TCP connection, one line
//! in HAProxy's agent grammar, then close.
//!
//! HAProxy connects, sends its `agent-send` string if it has one, and reads one line ended by
//! `\n`. The shipped backend sends `BACKEND/SERVER KEY\n`: the key proves the load balancer,
//! the server line says which of its backends the check is for, and a drain takes effect (or
//! is held) per server line ([`crate::health::hold`]). So the string is read first, up to its
//! line end, for at most [`SEND_WAIT`]; a load balancer that cannot prove itself (no key file,
//! not an `--lb-address`) is answered at once. Words it does not find keep their old value and only
//! the agent can undo what it set, so every line carries the whole state it knows: health,
//! admin state and, while the node takes traffic or is out for a failure, the weight. The
//! lines that know none carry no word, so that HAProxy keeps what it had: before the first
//! probe, and a drain the rule may hold while its server line's HTTP check is not seen yet. HAProxy
//! shows the text after `#` only next to a health word (`via agent : up (text)`; a line without
//! one leaves `last_agt` empty as `agent=CHECKED`), which is why every drained line says
//! `up drain`, whatever Puppet Server does: the drain's reason stays on the stats page while
//! Puppet Server restarts. That `up` cannot put a failing server back: HAProxy never lets an
//! agent `up` override a failed HTTP check, and the drain keeps new agents away until
//! `pmcheck undrain`, whose line says `down` while Puppet Server is not healthy.
//!
//! A drained line has no weight: HAProxy 2.6 logs "remains in forced drain mode" at every
//! weight it is sent while drained, one warning per server per `agent-inter`. Nothing is lost:
//! the admin drain keeps new agents away until the line that says `ready`, which carries the
//! ramp's first weight.

use std::fmt::Write;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::drain::record::DrainState;
use crate::health::decision::Decision;
use crate::health::verdict::Verdict;
use crate::responder::connections::Activity;

/// How long the line may wait for the client to take it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the connection stays open after the line, reading what the client still sends
/// (`agent-send`), so that closing never resets it before the line is read.
const LINGER: Duration = Duration::from_secs(2);
/// The most read after the line: HAProxy's `agent-send` string fits in one check buffer
/// (`tune.bufsize`, 16 KiB by default). A client that sends more is no load balancer; it is
/// closed, its line long written.
const SEND_LIMIT: usize = 16 * 1024;
/// HAProxy keeps 128 bytes of a check's description, `via agent : down (` included.
const DESCRIPTION: usize = 100;

/// The line for `decision`, ended by `\n`.
///
/// | verdict | line |
/// |---|---|
/// | OK (warm, busy, warming, ramping) | `up ready 80% #OK - ...` |
/// | DRAINED, whatever Puppet Server does | `up drain #DRAINED - ...` (the reason stays shown) |
/// | DOWN, NOTREADY | `down ready 10% #DOWN - ...` |
/// | UNKNOWN | `fail ready 10% #UNKNOWN - ...`; `fail #...` when the drain state is unknown |
/// | STARTING | `#STARTING - ...`: no state word, HAProxy keeps what it had until the first probe |
///
/// `quiet`: no word of state at all, so that HAProxy keeps the server as it was (a drained
/// node's agent check that has no HTTP check of its server line to follow yet).
pub fn line(decision: &Decision<'_>, quiet: bool) -> String {
    // (words, whether the weight goes with them)
    let (words, weighted) = match decision.verdict {
        _ if quiet => ("", false),
        Verdict::Ok => ("up ready", true),
        Verdict::Drained => ("up drain", false),
        Verdict::Down | Verdict::NotReady => ("down ready", true),
        Verdict::Unknown if matches!(decision.drain, DrainState::Unknown(_)) => ("fail", false),
        Verdict::Unknown => ("fail ready", true),
        Verdict::Starting => ("", false),
    };
    let mut line = String::with_capacity(words.len() + DESCRIPTION + 16);
    if !words.is_empty() {
        line.push_str(words);
        line.push(' ');
    }
    if weighted {
        // Into the line itself: no string of its own for the number.
        let _ = write!(line, "{}% ", decision.weight);
    }
    line.push('#');
    line.push_str(decision.verdict.as_str());
    line.push_str(" - ");
    let room = DESCRIPTION.saturating_sub(decision.verdict.as_str().len() + 3);
    for (i, c) in decision.reason.chars().enumerate() {
        if i >= room {
            line.push_str("...");
            break;
        }
        // One line of printable ASCII: a line break would end the line early.
        line.push(if c.is_ascii_graphic() || c == ' ' {
            c
        } else {
            '?'
        });
    }
    line.push('\n');
    line
}

/// What an agent-check client sent right after connecting: HAProxy's `agent-send` string,
/// `BACKEND/SERVER KEY` ([`crate::settings::lb_proof`]) ended by a line end. Kept inline.
pub struct Sent {
    len: usize,
    bytes: [u8; SENT_KEPT],
    /// Where its key and server line are, found once when it is complete.
    key: Option<(usize, usize)>,
    line: Option<(usize, usize)>,
}

/// What is kept of what the client sends: a server line's name (two HAProxy names of at most
/// 128 bytes), the longest key, the spaces and the line end.
const SENT_KEPT: usize = 2 * 128 + 1 + crate::settings::lb_key::LONGEST + 2;
/// How long the agent port waits for `agent-send` before it answers: HAProxy sends it as soon
/// as it connects, so it arrives within a round trip; a load balancer without `agent-send`
/// waits this long for its line.
pub const SEND_WAIT: Duration = Duration::from_millis(500);
/// Once part of a line came, how long the rest may take: an `agent-send` without a line end
/// is all there in one segment.
const REST_WAIT: Duration = Duration::from_millis(50);

impl Sent {
    /// Nothing was sent.
    pub const NONE: Sent = Sent {
        len: 0,
        bytes: [0; SENT_KEPT],
        key: None,
        line: None,
    };

    /// What a client sent, as [`read_sent`] keeps it.
    pub fn of(bytes: &[u8]) -> Sent {
        let mut sent = Sent::NONE;
        let kept = bytes.len().min(SENT_KEPT);
        sent.bytes[..kept].copy_from_slice(&bytes[..kept]);
        sent.len = kept;
        sent.find_parts();
        sent
    }

    /// The key, and the server line named (`BACKEND/SERVER`), in either order: a word made of
    /// HAProxy's name characters around one `/` is the server line, the other word the key.
    pub fn parts(&self) -> (Option<&[u8]>, Option<&[u8]>) {
        let at = |range: Option<(usize, usize)>| range.map(|(from, to)| &self.bytes[from..to]);
        (at(self.key), at(self.line))
    }

    /// Finds [`Sent::parts`] once, so that the agent check and its note read them for free.
    fn find_parts(&mut self) {
        // Its first line (all of it without a line end).
        let kept = &self.bytes[..self.len];
        let line = kept.split(|&b| b == b'\n').next().unwrap_or_default();
        // The next word's span: from its first byte that is no space to the next space.
        let mut at = 0;
        let mut word = || {
            let from = at + line[at..].iter().position(|b| !b.is_ascii_whitespace())?;
            let len = line[from..].iter().position(u8::is_ascii_whitespace);
            at = from + len.unwrap_or(line.len() - from);
            Some((from, at))
        };
        let (first, second) = (word(), word());
        let named = |span: &(usize, usize)| is_line(&line[span.0..span.1]);
        (self.key, self.line) = match first {
            Some(name) if named(&name) => (second, Some(name)),
            key => (key, second.filter(named)),
        };
    }
}

/// `BACKEND/SERVER`, each one of HAProxy's names.
fn is_line(word: &[u8]) -> bool {
    let name = |n: &[u8]| {
        !n.is_empty()
            && n.len() <= 128
            && n.iter()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(b))
    };
    let mut parts = word.split(|&b| b == b'/');
    matches!((parts.next(), parts.next(), parts.next()), (Some(b), Some(s), None) if name(b) && name(s))
}

/// Reads what the client sends before its line (`agent-send`): up to its line end, for at most
/// [`SEND_WAIT`] (and `REST_WAIT` once part of it came).
pub async fn read_sent(stream: &mut TcpStream) -> Sent {
    let mut sent = Sent::NONE;
    let deadline = tokio::time::Instant::now() + SEND_WAIT;
    while sent.len < SENT_KEPT && !sent.bytes[..sent.len].contains(&b'\n') {
        let until = if sent.len == 0 {
            deadline
        } else {
            deadline.min(tokio::time::Instant::now() + REST_WAIT)
        };
        let room = &mut sent.bytes[sent.len..];
        match tokio::time::timeout_at(until, stream.read(room)).await {
            Ok(Ok(n)) if n > 0 => sent.len += n,
            _ => break,
        }
    }
    sent.find_parts();
    sent
}

/// Writes `line` to one agent-check connection, shuts down the writing side, reads what the
/// client still sends (at most `SEND_LIMIT`, for at most `LINGER`) so that the close does
/// not reset the line before HAProxy reads it, then closes. `taken` is told once the line is
/// out. Whether the line was written.
pub async fn answer(mut stream: TcpStream, line: String, taken: &Activity) -> bool {
    let _ = stream.set_nodelay(true);
    match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(line.as_bytes())).await {
        Ok(Ok(())) => taken.asked(),
        // Gone, or never reading: nothing more to say.
        _ => return false,
    }
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let mut read = 0;
    let _ = tokio::time::timeout(LINGER, async {
        while read < SEND_LIMIT
            && let Ok(n) = stream.read(&mut sink).await
            && n > 0
        {
            read += n;
        }
    })
    .await;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::record::Drain;
    use crate::health::decision::Rules;
    use crate::health::weight::Rejoin;
    use crate::puppet::pool::{Load, Pool, Unready};
    use crate::puppet::probe_error::ProbeError;
    use crate::puppet::report::{ProbeOutcome, ProbeReport};

    fn pool(free: u32, borrowed: u32, waiting: u32) -> Pool {
        Pool {
            size: 4,
            free,
            borrowed,
            waiting,
            average_free: 0.0,
            average_wait_ms: 850,
            average_borrow_ms: 0,
            queue_limit_hits: 0,
            borrow_timeouts: 0,
            borrows: 0,
            lock: "not-in-use".into(),
            lock_since: None,
            multithreaded: false,
        }
    }

    fn report(outcome: ProbeOutcome, pool: Option<Pool>) -> ProbeReport {
        ProbeReport::with_pool(outcome, pool, Duration::from_millis(3), None)
    }

    fn line_for(drain: &DrainState, probe: Option<&ProbeReport>) -> String {
        let decision = Decision::decide(
            drain,
            probe,
            Rejoin::Steady,
            crate::responder::node::now(),
            &Rules::ONCE,
        );
        line(&decision, false)
    }

    fn refused() -> ProbeReport {
        let addr = "127.0.0.1:8140".parse().unwrap();
        report(ProbeOutcome::Unhealthy(ProbeError::Refused { addr }), None)
    }

    /// HAProxy's `agent-send` names the server line and the key, in either order; only the
    /// first line counts, and a word that is no `BACKEND/SERVER` is never taken for one.
    #[test]
    fn what_was_sent_splits_into_key_and_server_line() {
        let text = |b: Option<&[u8]>| b.map(|b| String::from_utf8_lossy(b).into_owned());
        for (sent, key, line) in [
            ("bk/m1 KEY\n", Some("KEY"), Some("bk/m1")),
            ("KEY bk/m1\n", Some("KEY"), Some("bk/m1")),
            (
                "  be_1/m-2.x:y \t KEY \r\n",
                Some("KEY"),
                Some("be_1/m-2.x:y"),
            ),
            ("KEY\n", Some("KEY"), None),
            ("bk/m1", None, Some("bk/m1")),
            ("", None, None),
            ("\n", None, None),
            ("a/b/c KEY\n", Some("a/b/c"), None),
            ("KEY1 KEY2\n", Some("KEY1"), None),
            ("KEY\nbk/m1\n", Some("KEY"), None),
            ("bk/ KEY\n", Some("bk/"), None),
        ] {
            let kept = Sent::of(sent.as_bytes());
            let (k, l) = kept.parts();
            assert_eq!(
                (text(k), text(l)),
                (key.map(str::to_owned), line.map(str::to_owned)),
                "{sent:?}"
            );
        }
        assert_eq!(Sent::NONE.parts(), (None, None));
    }

    #[test]
    fn one_line_per_verdict() {
        let warm = report(ProbeOutcome::Healthy(Some(Load::Warm)), Some(pool(4, 0, 0)));
        let busy = report(ProbeOutcome::Healthy(Some(Load::Busy)), Some(pool(0, 4, 3)));
        let locked = report(
            ProbeOutcome::NotReady(Unready::Locked { since: None }),
            Some(pool(4, 0, 0)),
        );
        let mut locked_pool = pool(4, 0, 0);
        locked_pool.lock = "acquired".into();
        let paused = ProbeReport::paused(
            Some(locked_pool),
            crate::puppet::pause::Pause {
                cause: crate::puppet::pause::PauseCause::Locked,
                since: std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(43201),
                lasted: Duration::from_secs(3),
                multithreaded: false,
                unanswered: false,
            },
            Duration::from_millis(3),
            None,
        );
        let drained = DrainState::Drained(Drain::parse(
            br#"{"reason":"kernel upgrade","by":"alice","since":"2026-11-22T10:00:00Z"}"#,
        ));
        let unknown = DrainState::Unknown(crate::drain::record::Unreadable::Read {
            path: "/var/lib/pmcheck/drain".into(),
            source: std::sync::Arc::new(std::io::ErrorKind::PermissionDenied.into()),
        });
        let none = DrainState::NotDrained;
        let cases = [
            (
                line_for(&none, Some(&warm)),
                "up ready 100% #OK - Puppet Server is running, 4 of 4 JRubies free\n",
            ),
            (
                line_for(&none, Some(&busy)),
                "up ready 10% #OK - busy: 0 of 4 JRubies free, 3 requests waiting, average wait 850 ms\n",
            ),
            (
                line_for(&drained, Some(&warm)),
                "up drain #DRAINED - kernel upgrade (by alice 2026-11-22T10:00Z); Puppet Server is running, 4 of 4 JRubies free\n",
            ),
            (
                line_for(&drained, Some(&refused())),
                "up drain #DRAINED - kernel upgrade (by alice 2026-11-22T10:00Z); Puppet Server is down: connection to 127.0.0....\n",
            ),
            (
                line_for(&none, Some(&refused())),
                "down ready 10% #DOWN - connection to 127.0.0.1:8140 refused: Puppet Server is not listening (stopped, restarting or ...\n",
            ),
            (
                line_for(&none, Some(&locked)),
                "down ready 10% #NOTREADY - Puppet Server's JRuby pool is locked: nothing compiles\n",
            ),
            (
                line_for(&none, Some(&paused)),
                "up ready 10% #OK - paused: JRuby pool locked since 12:00:01Z (3s)\n",
            ),
            (
                line_for(&unknown, Some(&warm)),
                "fail #UNKNOWN - cannot tell whether this node is drained: cannot read drain record /var/lib/pmcheck/drain:...\n",
            ),
            (
                line_for(&none, None),
                "#STARTING - no probe of Puppet Server has finished yet\n",
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
            assert!(got.len() <= 128, "{got}");
        }
    }

    #[test]
    fn a_reason_cannot_break_the_line() {
        let drain = DrainState::NotDrained;
        let mut decision = Decision::decide(
            &drain,
            None,
            Rejoin::Steady,
            crate::responder::node::now(),
            &Rules::ONCE,
        );
        decision.reason = "a\nup ready 100%\r\u{e9}".into();
        let line = line(&decision, false);
        assert_eq!(line, "#STARTING - a?up ready 100%??\n");
    }
}
