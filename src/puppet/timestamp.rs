//! Puppet Server's timestamps: a JRuby pool lock's `last-change-time`. Puppet Server writes UTC
//! with milliseconds (`2026-11-25T12:23:04.408Z`); OpenVox since 8.13 writes `java.time`'s
//! `ISO_OFFSET_DATE_TIME`: 0 to 9 fractional digits and the JVM zone's offset (`+01:00`, `Z` in
//! UTC). An offset read as UTC would put a lock taken in Paris an hour in the future, and no
//! pause could be granted from it. r10k's deploy records hold Ruby's `Time#to_s`
//! (`2026-11-25 13:23:04 +0100`). Times shown in answers are written here too: humantime
//! panics on one before 1970 or after 9999.

use std::time::{Duration, SystemTime};

/// `YYYY-MM-DDT`: the offset's sign can only come after it (the date's dashes come before).
const DATE: usize = "2026-11-25T".len();
/// The first moment of year 10000, from the epoch: RFC 3339 has four-digit years.
const YEAR_10000: Duration = Duration::from_secs(253_402_300_800);

/// `t` in RFC 3339 as `format` (humantime's `format_rfc3339_*`) writes it, or `None` before
/// 1970 or after 9999, where humantime panics (an offset can take a lock time there).
pub fn write(
    t: SystemTime,
    format: fn(SystemTime) -> humantime::Rfc3339Timestamp,
) -> Option<String> {
    writable(t).then(|| format(t).to_string())
}

/// `t`'s time of day in UTC (`12:00:01Z`), or `None` where [`write()`] has none.
pub fn clock(t: SystemTime) -> Option<String> {
    write(t, humantime::format_rfc3339_seconds)?
        .get(DATE..)
        .map(str::to_owned)
}

fn writable(t: SystemTime) -> bool {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .is_ok_and(|d| d < YEAR_10000)
}

/// The moment `text` names, or `None` when it is not such a timestamp or falls outside 1970
/// to 9999 (a misreading: no lock was taken then).
pub fn parse(text: &str) -> Option<SystemTime> {
    let (local, east) = split_offset(text.trim())?;
    // Ruby puts a space before the offset.
    let local = local.trim_end();
    // Nothing but the time of day after the date: humantime would skip a second offset.
    let time = local.get(DATE..)?;
    if !time
        .bytes()
        .all(|b| b.is_ascii_digit() || b == b':' || b == b'.')
    {
        return None;
    }
    // humantime reads a time of day without an offset as UTC; the offset then moves it.
    let utc = humantime::parse_rfc3339_weak(local).ok()?;
    let shift = Duration::from_secs(east.unsigned_abs());
    if east >= 0 {
        utc.checked_sub(shift)
    } else {
        utc.checked_add(shift)
    }
    .filter(|t| writable(*t))
}

/// The date and time of day, and the offset in seconds east of UTC (`Z`, `+HH:MM`, `-HH:MM`,
/// `+HH:MM:SS` as Java writes an offset with seconds, or `+HHMM` as Ruby writes it).
fn split_offset(text: &str) -> Option<(&str, i64)> {
    if let Some(local) = text.strip_suffix(['Z', 'z']) {
        return Some((local, 0));
    }
    let at = DATE + text.get(DATE..)?.rfind(['+', '-'])?;
    let (local, offset) = text.split_at(at);
    let (sign, offset) = match offset.split_at(1) {
        ("+", rest) => (1, rest),
        (_, rest) => (-1, rest),
    };
    let mut parts = offset.split(':');
    let first = parts.next()?;
    let (hours, minutes) = match (first.get(..2), first.get(2..)) {
        (Some(hh), Some(mm)) if mm.len() == 2 => (two_digits(hh)?, two_digits(mm)?),
        _ => (two_digits(first)?, two_digits(parts.next()?)?),
    };
    let seconds = parts.next().map_or(Some(0), two_digits)?;
    // java.time's offsets stay within 18 hours.
    if parts.next().is_some() || hours > 18 || minutes > 59 || seconds > 59 {
        return None;
    }
    Some((local, sign * (hours * 3600 + minutes * 60 + seconds)))
}

fn two_digits(text: &str) -> Option<i64> {
    match text.as_bytes() {
        [a @ b'0'..=b'9', b @ b'0'..=b'9'] => Some(i64::from((a - b'0') * 10 + (b - b'0'))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-25T12:23:04Z, and `nanos` more.
    fn at(nanos: u32) -> SystemTime {
        humantime::parse_rfc3339("2026-11-25T12:23:04Z").unwrap() + Duration::new(0, nanos)
    }

    #[test]
    fn puppet_servers_utc_milliseconds() {
        assert_eq!(parse("2026-11-25T12:23:04.408Z"), Some(at(408_000_000)));
    }

    #[test]
    fn every_form_java_writes_names_the_same_moment() {
        // ISO_OFFSET_DATE_TIME: no fraction, 3, 6 or 9 digits (or any count up to 9), Z or an offset.
        let same = [
            ("2026-11-25T12:23:04Z", 0),
            ("2026-11-25T12:23:04.4Z", 400_000_000),
            ("2026-11-25T12:23:04.408Z", 408_000_000),
            ("2026-11-25T12:23:04.408123Z", 408_123_000),
            ("2026-11-25T12:23:04.408123456Z", 408_123_456),
            ("2026-11-25T13:23:04.408123456+01:00", 408_123_456),
            ("2026-11-25T13:23:04+01:00", 0),
            ("2026-11-25T07:23:04.408-05:00", 408_000_000),
            ("2026-11-25T17:53:04.408+05:30", 408_000_000),
            ("2026-11-25T12:23:04.408+00:00", 408_000_000),
            ("2026-11-25T12:23:04.408-00:00", 408_000_000),
            ("2026-11-25T12:42:34+00:19:30", 0),
            (" 2026-11-25T12:23:04.408Z\n", 408_000_000),
        ];
        for (text, nanos) in same {
            assert_eq!(parse(text), Some(at(nanos)), "{text:?}");
        }
    }

    #[test]
    fn rubys_time_names_the_same_moment() {
        assert_eq!(parse("2026-11-25 13:23:04 +0100"), Some(at(0)));
        assert_eq!(parse("2026-11-25 07:23:04 -0500"), Some(at(0)));
        assert_eq!(parse("2026-11-25 12:23:04 +0000"), Some(at(0)));
    }

    #[test]
    fn an_offset_crosses_midnight_and_the_year() {
        assert_eq!(
            parse("2027-01-01T00:30:00+01:00"),
            humantime::parse_rfc3339("2026-12-31T23:30:00Z").ok()
        );
        assert_eq!(
            parse("2026-12-31T23:30:00-01:00"),
            humantime::parse_rfc3339("2027-01-01T00:30:00Z").ok()
        );
    }

    /// The audit: an offset took `1970-01-01T00:30:00+01:00` before the epoch, and formatting
    /// it panicked the prober; a year past 9999 cannot be written either.
    #[test]
    fn a_time_before_1970_or_after_9999_is_none() {
        for text in [
            "1970-01-01T00:30:00+01:00",
            "1970-01-01T00:00:00.001+00:00:01",
            "9999-12-31T23:30:00-01:00",
        ] {
            assert_eq!(parse(text), None, "{text:?}");
        }
        assert_eq!(
            parse("1970-01-01T01:00:00+01:00"),
            Some(SystemTime::UNIX_EPOCH)
        );
        assert!(parse("9999-12-31T23:59:59Z").is_some());
        // Nor is such a time written (the wedge's, the JVM's start): humantime would panic.
        let epoch = SystemTime::UNIX_EPOCH;
        assert_eq!(clock(epoch - Duration::from_secs(1)), None);
        assert_eq!(clock(epoch + YEAR_10000), None);
        assert_eq!(
            clock(epoch + YEAR_10000 - Duration::from_secs(1)).as_deref(),
            Some("23:59:59Z")
        );
    }

    #[test]
    fn not_a_timestamp_is_none() {
        for text in [
            "",
            "yesterday",
            "2026-11-25",
            "2026-11-25T12:23",
            "2026-11-25T12:23:04+1:00",
            "2026-11-25T12:23:04+01",
            "2026-11-25 12:23:04 +010",
            "2026-11-25T12:23:04+19:00",
            "2026-11-25T12:23:04+01:60",
            "2026-11-25T12:23:04+01:00:00:00",
            "2026-11-25T12:23:04.4x8Z",
            "2026-11-25T12:23:04.408Z+01:00",
            "2026-11-25T12:23:04\u{e9}+01:00",
            "2026-13-25T12:23:04Z",
            "2026-11-25T12:23:04.408+00:00+01:00",
            "2026-11-25T12:23:04.408+01:00Z",
        ] {
            assert_eq!(parse(text), None, "{text:?}");
        }
    }
}
