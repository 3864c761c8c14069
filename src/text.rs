//! Text that comes from outside (a hand-written drain record, Puppet Server's answers) made safe to
//! show: one line, no control characters, bounded length. A CR/LF from upstream must not split a
//! log line or the one-line body, and an escape sequence must not reach an operator's terminal.

use std::borrow::Cow;

/// `text` on one line of at most `limit` characters: whitespace runs become one space, other
/// control characters are shown escaped (`\u{1b}`), and a cut is marked with `...`.
pub fn one_line(text: &str, limit: usize) -> Cow<'_, str> {
    let clean = text.trim();
    let plain = !clean.contains("  ")
        && clean
            .chars()
            .all(|c| c == ' ' || !(c.is_control() || c.is_whitespace()))
        && clean.chars().count() <= limit;
    if plain {
        return Cow::Borrowed(clean);
    }
    let mut out = String::with_capacity(clean.len().min(limit * 4) + 3);
    let mut shown = 0;
    let mut space = false;
    for c in clean.chars() {
        if c.is_whitespace() {
            space = true;
            continue;
        }
        let piece: Cow<'_, str> = if c.is_control() {
            c.escape_unicode().to_string().into()
        } else {
            c.to_string().into()
        };
        let width = piece.chars().count() + usize::from(space);
        if shown + width > limit {
            out.push_str("...");
            return Cow::Owned(out);
        }
        if space {
            out.push(' ');
            space = false;
        }
        out.push_str(&piece);
        shown += width;
    }
    Cow::Owned(out)
}

/// `12.3s`.
pub fn seconds(d: std::time::Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Milliseconds, saturating: how `/status`'s JSON and the logs carry a duration. Here, in a
/// module that imports nothing of the crate, so that drain/ and health/ can use it without
/// importing the protocol that is built on them.
pub fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plain_text_is_borrowed() {
        assert!(matches!(one_line("kernel upgrade", 100), Cow::Borrowed(_)));
    }

    #[test]
    fn line_breaks_and_escapes_are_neutralised() {
        assert_eq!(one_line("a\r\nb\t c", 100), "a b c");
        assert_eq!(one_line("red\u{1b}[31m", 100), "red\\u{1b}[31m");
        assert_eq!(one_line("  padded  ", 100), "padded");
    }

    #[test]
    fn long_text_is_cut_and_marked() {
        let long = "x".repeat(500);
        assert_eq!(one_line(&long, 10), "xxxxxxxxxx...");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn always_one_bounded_printable_line(text in any::<String>(), limit in 1usize..300) {
            let line = one_line(&text, limit);
            prop_assert!(!line.chars().any(char::is_control), "{line:?}");
            prop_assert!(line.chars().count() <= limit + 3, "{line:?}");
            prop_assert!(!line.contains("  "), "{line:?}");
        }
    }
}
