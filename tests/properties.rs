//! Properties of the parsers that take what operators write: puppet.conf and durations. Any
//! input gets a value or an error that names its place, never a panic; and what is written in
//! the documented forms is read back exactly.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use pmcheck::settings::duration::{format_duration, parse_duration};
use pmcheck::settings::puppet_conf::{PuppetConf, PuppetConfError};
use proptest::prelude::*;

const CONF: &str = "/etc/puppetlabs/puppet/puppet.conf";
const TEN_YEARS: u64 = 10 * 365 * 24 * 3600 * 1000;

/// One line of a generated puppet.conf.
#[derive(Debug, Clone)]
enum Line {
    Section(&'static str),
    /// Name, value, and the `{ owner = ..., mode = ... }` metadata Puppet allows after a value.
    Setting(String, String, Option<&'static str>),
    Comment(char, String),
    Blank,
}

fn line() -> impl Strategy<Value = Line> {
    let section = prop_oneof![
        Just("main"),
        Just("agent"),
        Just("server"),
        Just("master"),
        Just("user")
    ];
    // Names as Puppet spells them; the serverport/masterport alias has a test of its own.
    let name = "[a-z][a-z_]{0,11}".prop_filter("not the port alias", |n| {
        n != "serverport" && n != "masterport"
    });
    let value = "[A-Za-z0-9/$._-][A-Za-z0-9/$._ -]{0,20}[A-Za-z0-9/$._-]|[A-Za-z0-9]?";
    let metadata = proptest::option::weighted(
        0.2,
        prop_oneof![
            Just("{ owner = service, mode = 0640 }"),
            Just("{owner=puppet}"),
            Just("  { mode = 0750 }"),
        ],
    );
    prop_oneof![
        section.prop_map(Line::Section),
        (name, value, metadata).prop_map(|(n, v, m)| Line::Setting(n, v, m)),
        (prop_oneof![Just('#'), Just(';')], "[ -~]{0,30}").prop_map(|(c, t)| Line::Comment(c, t)),
        Just(Line::Blank),
    ]
}

/// The text, with the whitespace Puppet tolerates around names, values and headers, and
/// Unix or DOS line ends.
fn render(lines: &[Line], pad: &[usize], crlf: bool) -> String {
    let sp = |i: usize| " \t".repeat(pad[i % pad.len()] % 3);
    let mut text = String::new();
    for (i, line) in lines.iter().enumerate() {
        match line {
            Line::Section(s) => text.push_str(&format!("{}[{s}]{}", sp(i), sp(i + 1))),
            Line::Setting(n, v, m) => text.push_str(&format!(
                "{}{n}{}={}{v}{}{}",
                sp(i),
                sp(i + 1),
                sp(i + 2),
                m.map(|m| format!(" {m}")).unwrap_or_default(),
                sp(i + 3)
            )),
            Line::Comment(c, t) => text.push_str(&format!("{}{c} {t}", sp(i))),
            Line::Blank => text.push_str(&sp(i)),
        }
        text.push_str(if crlf { "\r\n" } else { "\n" });
    }
    text
}

/// Puppet's rule: settings before any header are `[main]`, the last of a name in a section
/// wins, the metadata after a value is not part of it, and the server reads `[server]`, then
/// `[master]`, then `[main]` (never `[agent]` or `[user]`).
fn model(lines: &[Line]) -> HashMap<String, (String, &'static str)> {
    let mut sections: HashMap<&'static str, HashMap<String, String>> = HashMap::new();
    let mut current = "main";
    for line in lines {
        match line {
            Line::Section(s) => current = s,
            Line::Setting(n, v, _) => {
                sections
                    .entry(current)
                    .or_default()
                    .insert(n.clone(), v.clone());
            }
            _ => {}
        }
    }
    let mut seen = HashMap::new();
    for section in ["main", "master", "server"] {
        for (n, v) in sections.get(section).into_iter().flatten() {
            seen.insert(n.clone(), (v.clone(), section));
        }
    }
    seen
}

/// Text made of what puppet.conf parsing turns on (brackets, `=`, comment marks, metadata
/// braces, line ends alone and as CRLF, NUL, whitespace Rust trims but Ruby's `\s` does not,
/// a byte-order mark, section and setting names) mixed with any character.
fn hostile_text() -> impl Strategy<Value = String> {
    const PIECES: [&str; 27] = [
        "[",
        "]",
        "=",
        "#",
        ";",
        "{",
        "}",
        "\n",
        "\r\n",
        "\r",
        "\0",
        " ",
        "\t",
        "\u{a0}",
        "\u{85}",
        "\u{2028}",
        "\u{feff}",
        "é",
        "main",
        "server",
        "master",
        "agent",
        "ssldir",
        "serverport",
        "$confdir",
        "x_1",
        "a",
    ];
    // Cheap to generate and to shrink: an index into PIECES, or past its end any character.
    let piece = (0..PIECES.len() + 8, any::<char>());
    proptest::collection::vec(piece, 0..120).prop_map(|pieces| {
        let mut text = String::new();
        for (i, c) in pieces {
            match PIECES.get(i) {
                Some(p) => text.push_str(p),
                None => text.push(c),
            }
        }
        text
    })
}

/// A refused puppet.conf names the file, the first line it cannot read (counted as `str::lines`
/// counts them) and that line; everything before that line parses.
fn check_error(
    text: &str,
    result: Result<PuppetConf, PuppetConfError>,
) -> Result<(), TestCaseError> {
    let e = match result {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    let message = e.to_string();
    prop_assert!(message.starts_with(&format!("{CONF}:")), "{}", message);
    let PuppetConfError::Syntax {
        path,
        line,
        text: quoted,
    } = e
    else {
        return Err(TestCaseError::fail(format!(
            "parse gave a non-syntax error: {message}"
        )));
    };
    prop_assert_eq!(path.as_path(), Path::new(CONF));
    let lines: Vec<&str> = text.lines().collect();
    prop_assert!(
        (1..=lines.len()).contains(&line),
        "line {} of {}",
        line,
        lines.len()
    );
    prop_assert_eq!(quoted.as_str(), lines[line - 1].trim());
    prop_assert!(
        message.starts_with(&format!("{CONF}:{line}: ")),
        "{}",
        message
    );
    let before = lines[..line - 1].join("\n");
    prop_assert!(
        PuppetConf::parse(Path::new(CONF), &before).is_ok(),
        "line {} is not the first bad line of {:?}",
        line,
        text
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_text_parses_or_names_the_file_and_line(text in "(?s).{0,400}") {
        check_error(&text, PuppetConf::parse(Path::new(CONF), &text))?;
    }

    #[test]
    fn any_bytes_as_text_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes);
        check_error(&text, PuppetConf::parse(Path::new(CONF), &text))?;
    }

    #[test]
    fn hostile_text_parses_or_names_the_first_bad_line(text in hostile_text()) {
        check_error(&text, PuppetConf::parse(Path::new(CONF), &text))?;
    }

    #[test]
    fn settings_are_read_from_the_section_the_server_uses(
        lines in proptest::collection::vec(line(), 0..40),
        pad in proptest::collection::vec(0usize..3, 1..8),
        crlf in any::<bool>(),
    ) {
        let text = render(&lines, &pad, crlf);
        let conf = PuppetConf::parse(Path::new(CONF), &text)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        let expected = model(&lines);
        for line in &lines {
            if let Line::Setting(name, _, _) = line {
                let got = conf.get(name).map(|(v, s)| (v.to_owned(), s));
                prop_assert_eq!(got, expected.get(name).cloned(), "{}\n{}", name, text);
            }
        }
        prop_assert_eq!(conf.get("no_such_setting"), None);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// An error goes to a terminal or the journal: like other text from outside (`text::one_line`)
    /// the quoted line should be one line, without control characters, of bounded length.
    #[test]
    fn syntax_errors_are_one_bounded_line(text in hostile_text(), len in 0usize..2000) {
        let text = format!("{text}{}", "x".repeat(len));
        if let Err(e) = PuppetConf::parse(Path::new(CONF), &text) {
            let message = e.to_string();
            prop_assert!(!message.chars().any(char::is_control), "{:?}", message);
            prop_assert!(message.chars().count() <= 1000, "{} characters", message.chars().count());
        }
    }
}

proptest! {
    // Lines up to a megabyte: fewer cases, each one costs.
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn very_long_lines_parse_or_name_the_line(
        head in hostile_text(),
        filler in prop_oneof![
            Just('a'), Just('='), Just(' '), Just('\0'), Just('\r'), Just('['), Just('#'),
            Just('é'), Just('{'), any::<char>(),
        ],
        len in 0usize..1_000_000,
        tail in hostile_text(),
    ) {
        let text = format!("{head}{}{tail}", filler.to_string().repeat(len));
        check_error(&text, PuppetConf::parse(Path::new(CONF), &text))?;
    }

    #[test]
    fn very_long_values_are_read_whole(
        section in prop_oneof![Just("main"), Just("master"), Just("server")],
        value in "[A-Za-z0-9/]{1,8}",
        len in 0usize..1_000_000,
    ) {
        let value = value.repeat(len / 8 + 1);
        let text = format!("[agent]\nssldir = /nope\n[{section}]\nssldir = {value}\n");
        let conf = PuppetConf::parse(Path::new(CONF), &text)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(conf.get("ssldir"), Some((value.as_str(), section)));
    }
}

/// Text shaped like a duration: numbers small, huge, fractional or negative, humantime's units
/// and some it does not know, with and without spaces, one to three parts.
fn duration_text() -> impl Strategy<Value = String> {
    let number = prop_oneof![
        "[0-9]{1,4}",
        "[0-9]{12,25}",
        "[0-9]{1,3}\\.[0-9]{1,4}",
        "-[0-9]{1,3}",
        Just(String::new())
    ];
    let unit = prop_oneof![
        Just(""),
        Just("ns"),
        Just("us"),
        Just("µs"),
        Just("ms"),
        Just("s"),
        Just("sec"),
        Just("m"),
        Just("min"),
        Just("h"),
        Just("hours"),
        Just("d"),
        Just("days"),
        Just("w"),
        Just("M"),
        Just("months"),
        Just("y"),
        Just("years"),
        Just("x"),
        Just("S"),
    ];
    proptest::collection::vec((number, " {0,2}", unit, " {0,2}"), 1..4).prop_map(|parts| {
        parts
            .into_iter()
            .map(|(n, a, u, b)| format!("{n}{a}{u}{b}"))
            .collect()
    })
}

/// A whole number of milliseconds between 1 ms and ten years, often a whole number of seconds,
/// minutes or hours (so that every unit `format_duration` writes is exercised), and the ends.
fn whole_ms() -> impl Strategy<Value = u64> {
    prop_oneof![
        1..=TEN_YEARS,
        (1..=TEN_YEARS / 1_000).prop_map(|s| s * 1_000),
        (1..=TEN_YEARS / 60_000).prop_map(|m| m * 60_000),
        (1..=TEN_YEARS / 3_600_000).prop_map(|h| h * 3_600_000),
        Just(1),
        Just(TEN_YEARS),
    ]
}

/// humantime's units and their length in milliseconds (`M` and `y` are 30.44 and 365.25 days).
const UNITS: [(&str, u64); 7] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
    ("w", 604_800_000),
    ("y", 31_557_600_000),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn durations_never_panic(text in "(?s).{0,40}") {
        if let Ok(d) = parse_duration(&text) {
            prop_assert!(!d.is_zero() && d <= Duration::from_millis(TEN_YEARS));
        }
    }

    /// pmcheck takes exactly what humantime takes, minus zero and more than ten years.
    #[test]
    fn durations_are_humantime_bounded(text in duration_text()) {
        let got = parse_duration(&text);
        match humantime::parse_duration(&text) {
            Err(_) => prop_assert!(got.as_ref().is_err_and(|e| e.contains("1500ms")), "{:?}: {:?}", text, got),
            Ok(d) if d.is_zero() => prop_assert_eq!(got, Err("must be longer than zero".to_owned()), "{:?}", text),
            Ok(d) if d > Duration::from_millis(TEN_YEARS) => {
                prop_assert_eq!(got, Err("must be at most ten years".to_owned()), "{:?}", text)
            }
            Ok(d) => prop_assert_eq!(got, Ok(d), "{:?}", text),
        }
    }

    #[test]
    fn durations_print_as_they_parse(ms in whole_ms()) {
        let d = Duration::from_millis(ms);
        let text = format_duration(d);
        prop_assert_eq!(parse_duration(&text), Ok(d), "{}", text);
        // In the largest unit that keeps it whole.
        let unit = if ms % 3_600_000 == 0 { "h" } else if ms % 60_000 == 0 { "m" } else if ms % 1_000 == 0 { "s" } else { "ms" };
        prop_assert_eq!(text.trim_start_matches(|c: char| c.is_ascii_digit()), unit);
    }

    #[test]
    fn zero_in_any_unit_is_refused(parts in proptest::collection::vec((0..UNITS.len(), " {0,2}"), 1..4)) {
        let text: String = parts.iter().map(|(u, sp)| format!("0{sp}{}", UNITS[*u].0)).collect::<Vec<_>>().join(" ");
        prop_assert_eq!(parse_duration(&text), Err("must be longer than zero".to_owned()), "{:?}", text);
    }

    #[test]
    fn durations_past_ten_years_are_refused(unit in 0..UNITS.len(), extra in 1..u32::MAX as u64) {
        let (name, ms) = UNITS[unit];
        let text = format!("{}{name}", TEN_YEARS / ms + extra);
        prop_assert_eq!(parse_duration(&text), Err("must be at most ten years".to_owned()), "{}", text);
    }

    /// Whatever `parse_duration` accepts, `format_duration` must print as something it accepts
    /// again (`pmcheck config` and the log lines print settings with it).
    #[test]
    fn accepted_durations_print_as_accepted_text(text in duration_text()) {
        if let Ok(d) = parse_duration(&text) {
            let printed = format_duration(d);
            prop_assert!(parse_duration(&printed).is_ok(), "{:?} -> {:?} -> {}", text, d, printed);
        }
    }
}

#[test]
fn serverport_and_masterport_are_one_setting() {
    let conf = PuppetConf::parse(
        Path::new(CONF),
        "[main]\nserverport = 8141\n[master]\nmasterport = 8142\n",
    )
    .unwrap();
    assert_eq!(conf.get("serverport"), Some(("8142", "master")));
    assert_eq!(conf.get("masterport"), Some(("8142", "master")));
}

#[test]
fn zero_is_refused() {
    let error = parse_duration("0s").unwrap_err();
    assert!(error.contains("longer than zero"), "{error}");
}
