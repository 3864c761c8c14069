//! Who holds the node drained, since when and until when: the three fields that the drain
//! record, each holder and the event log share, serialised by one struct.
//!
//! A time is kept as it was written and read once, when the record is parsed ([`Stamp`]). A
//! hand-written record whose time is not RFC 3339 still drains the node, and its time is shown
//! as written (bounded to one short line), not guessed at.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize};

use crate::text;
use crate::text::ms;

/// The most of a hand-written time (or name) kept: an RFC 3339 time is 30 characters at most.
pub const STAMP_LIMIT: usize = 64;

/// Who holds the node, since when, and until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenure {
    /// Who (`alice`, `alice via sudo`).
    pub by: String,
    /// Since when (RFC 3339, UTC).
    pub since: Stamp,
    /// The end of a `drain --for` (RFC 3339, UTC, to the millisecond); absent for a hold that
    /// lasts until `pmcheck undrain` or the cycle's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Stamp>,
}

impl Tenure {
    /// Held by `by` from `now`, for `lasting` if given. `until` is to the millisecond, rounded
    /// up: `--for 3s` lasts 3 s, and never ends early.
    pub fn from(by: String, now: SystemTime, lasting: Option<Duration>) -> Self {
        Self {
            by,
            since: Stamp::seconds(now),
            until: lasting.map(|d| Stamp::millis(ceil_milli(now + d))),
        }
    }

    /// The hold lapsed by itself (its `--for` has passed). A `until` that is not a time never
    /// lapses: the node stays drained rather than return on a guess.
    pub fn expired_at(&self, now: SystemTime) -> bool {
        self.until
            .as_ref()
            .and_then(Stamp::time)
            .is_some_and(|until| now >= until)
    }
}

/// A time as written in a record, and what it means when it is RFC 3339.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Stamp {
    text: String,
    #[serde(skip)]
    time: Option<SystemTime>,
}

impl Stamp {
    /// `t` in whole seconds, UTC (truncated: the time is what the text says).
    pub fn seconds(t: SystemTime) -> Self {
        Self::read(&humantime::format_rfc3339_seconds(t).to_string())
    }

    /// `t` to the millisecond, UTC (truncated).
    pub fn millis(t: SystemTime) -> Self {
        Self::read(&humantime::format_rfc3339_millis(t).to_string())
    }

    /// Text read from a record: kept to one line of at most [`STAMP_LIMIT`] characters, and
    /// read as a time once, here.
    pub fn read(text: &str) -> Self {
        let text = text::one_line(text, STAMP_LIMIT).into_owned();
        let time = humantime::parse_rfc3339_weak(&text).ok();
        Self { text, time }
    }

    /// The time, when the text is RFC 3339.
    pub fn time(&self) -> Option<SystemTime> {
        self.time
    }

    /// As written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Why the text is not a time; `None` when it is.
    pub fn problem(&self) -> Option<humantime::TimestampError> {
        (self.time.is_none())
            .then(|| humantime::parse_rfc3339_weak(&self.text).err())
            .flatten()
    }
}

impl std::fmt::Display for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Stamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(Self::read(&text))
    }
}

fn ceil_milli(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) if d.subsec_nanos() % 1_000_000 > 0 => UNIX_EPOCH + Duration::from_millis(ms(d) + 1),
        _ => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_for_lasts_exactly_that_long_to_the_millisecond() {
        let now = humantime::parse_rfc3339("2026-11-22T10:00:00.250Z").unwrap();
        let t = Tenure::from("alice".into(), now, Some(Duration::from_secs(3)));
        assert_eq!(
            t.until.as_ref().map(Stamp::as_str),
            Some("2026-11-22T10:00:03.250Z")
        );
        assert!(!t.expired_at(now + Duration::from_millis(2999)));
        assert!(t.expired_at(now + Duration::from_secs(3)));
        // Below a millisecond, rounded up: never early.
        let now = now + Duration::from_micros(1);
        let t = Tenure::from("alice".into(), now, Some(Duration::from_secs(3)));
        assert_eq!(
            t.until.as_ref().map(Stamp::as_str),
            Some("2026-11-22T10:00:03.251Z")
        );
    }

    #[test]
    fn a_time_that_is_not_rfc_3339_is_kept_as_written_on_one_line_and_never_lapses() {
        let t: Tenure = serde_json::from_str(
            r#"{"by":"bob","since":"yesterday\nafternoon","until":"when the upgrade is done"}"#,
        )
        .unwrap();
        assert_eq!(t.since.as_str(), "yesterday afternoon");
        assert_eq!(
            (t.since.time(), t.until.as_ref().and_then(Stamp::time)),
            (None, None)
        );
        assert!(t.until.as_ref().and_then(Stamp::problem).is_some());
        assert!(!t.expired_at(SystemTime::now() + Duration::from_secs(1 << 40)));
        let long: Stamp = serde_json::from_str(&format!("\"{}\"", "9".repeat(500))).unwrap();
        assert_eq!(long.as_str().chars().count(), STAMP_LIMIT + 3, "{long}");
    }

    #[test]
    fn a_stamp_means_what_its_text_says() {
        let t = humantime::parse_rfc3339("2026-11-22T10:00:00.999999Z").unwrap();
        let whole = humantime::parse_rfc3339("2026-11-22T10:00:00Z").unwrap();
        assert_eq!(Stamp::seconds(t).time(), Some(whole));
        assert_eq!(Stamp::seconds(t), Stamp::read("2026-11-22T10:00:00Z"));
        let millis = whole + Duration::from_millis(999);
        assert_eq!(Stamp::millis(t).time(), Some(millis));
    }

    #[test]
    fn a_stamp_writes_back_exactly_what_it_read() {
        for text in ["2026-11-22T10:00:00Z", "2026-11-22T10:00:03.250Z", "soon"] {
            let stamp: Stamp = serde_json::from_str(&format!("\"{text}\"")).unwrap();
            assert_eq!(
                serde_json::to_string(&stamp).unwrap(),
                format!("\"{text}\"")
            );
        }
    }
}
