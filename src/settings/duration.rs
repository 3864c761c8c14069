//! Durations as operators write them (`1500ms`, `2s`, `30m`, `1h`): read from flags and
//! printed back in the same words by `pmcheck config`, reasons and logs.

use std::time::Duration;

/// Ten years: longer is a typo, and would overflow the clock arithmetic.
const LONGEST: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Reads a duration for clap: positive, at most ten years.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text)
        .map_err(|e| format!("{e} (write a duration such as 1500ms, 2s, 30m or 1h)"))?;
    match duration {
        Duration::ZERO => Err("must be longer than zero".to_owned()),
        d if d > LONGEST => Err("must be at most ten years".to_owned()),
        d => Ok(d),
    }
}

/// Reads a duration for clap where `0s` means "off": at most ten years.
pub fn parse_duration_or_off(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(zero) if zero.is_zero() => Ok(zero),
        _ => parse_duration(text),
    }
}

/// Prints a duration in the largest unit that keeps it whole, which [`parse_duration`] reads back.
pub fn format_duration(d: Duration) -> String {
    // Finer than a millisecond (`--timeout 1500us`): humantime's own words, which it reads back.
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return humantime::format_duration(d).to_string();
    }
    let ms = d.as_millis();
    match ms {
        0 => "0s".to_owned(),
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1_000) => format!("{}s", ms / 1_000),
        _ => format!("{ms}ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_off_only_where_off_is_meant() {
        assert_eq!(parse_duration_or_off("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration_or_off("90s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("0s").is_err());
        assert!(
            parse_duration_or_off("soon")
                .unwrap_err()
                .contains("1500ms")
        );
    }

    #[test]
    fn durations_read_and_print_as_operators_write_them() {
        for text in ["1500ms", "2s", "30m", "1h"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("500000000000y").is_err());
        assert!(parse_duration("soon").unwrap_err().contains("1500ms"));
    }
}
