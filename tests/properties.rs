//! Properties of the parsers that take what operators write: puppet.conf and durations. Any
//! input gets a value or an error that names its place, never a panic; and what is written in
//! the documented forms is read back exactly.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use pmcheck::cli::{format_duration, parse_duration};
use pmcheck::puppet_conf::PuppetConf;
use proptest::prelude::*;

const CONF: &str = "/etc/puppetlabs/puppet/puppet.conf";
const TEN_YEARS: u64 = 10 * 365 * 24 * 3600 * 1000;

/// One line of a generated puppet.conf.
#[derive(Debug, Clone)]
enum Line {
    Section(&'static str),
    Setting(String, String),
    Comment(String),
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
    prop_oneof![
        section.prop_map(Line::Section),
        (name, value).prop_map(|(n, v)| Line::Setting(n, v)),
        "[ -~]{0,30}".prop_map(Line::Comment),
        Just(Line::Blank),
    ]
}

/// The text, with the whitespace Puppet tolerates around names, values and headers.
fn render(lines: &[Line], pad: &[usize]) -> String {
    let sp = |i: usize| " \t".repeat(pad[i % pad.len()] % 3);
    let mut text = String::new();
    for (i, line) in lines.iter().enumerate() {
        match line {
            Line::Section(s) => text.push_str(&format!("{}[{s}]{}", sp(i), sp(i + 1))),
            Line::Setting(n, v) => text.push_str(&format!(
                "{}{n}{}={}{v}{}",
                sp(i),
                sp(i + 1),
                sp(i + 2),
                sp(i + 3)
            )),
            Line::Comment(c) => text.push_str(&format!("{}# {c}", sp(i))),
            Line::Blank => text.push_str(&sp(i)),
        }
        text.push('\n');
    }
    text
}

/// Puppet's rule: settings before any header are `[main]`, the last of a name in a section
/// wins, and the server reads `[server]`, then `[master]`, then `[main]` (never `[agent]`).
fn model(lines: &[Line]) -> HashMap<String, (String, &'static str)> {
    let mut sections: HashMap<&'static str, HashMap<String, String>> = HashMap::new();
    let mut current = "main";
    for line in lines {
        match line {
            Line::Section(s) => current = s,
            Line::Setting(n, v) => {
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_text_parses_or_names_the_file_and_line(text in "(?s).{0,400}") {
        if let Err(e) = PuppetConf::parse(Path::new(CONF), &text) {
            let message = e.to_string();
            prop_assert!(message.starts_with(&format!("{CONF}:")), "{message}");
        }
    }

    #[test]
    fn any_bytes_as_text_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = PuppetConf::parse(Path::new(CONF), &String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn settings_are_read_from_the_section_the_server_uses(
        lines in proptest::collection::vec(line(), 0..40),
        pad in proptest::collection::vec(0usize..3, 1..8),
    ) {
        let text = render(&lines, &pad);
        let conf = PuppetConf::parse(Path::new(CONF), &text)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        let expected = model(&lines);
        for line in &lines {
            if let Line::Setting(name, _) = line {
                let got = conf.get(name).map(|(v, s)| (v.to_owned(), s));
                prop_assert_eq!(got, expected.get(name).cloned(), "{}\n{}", name, text);
            }
        }
    }

    #[test]
    fn durations_never_panic(text in "(?s).{0,40}") {
        if let Ok(d) = parse_duration(&text) {
            prop_assert!(!d.is_zero() && d <= Duration::from_millis(TEN_YEARS));
        }
    }

    #[test]
    fn durations_print_as_they_parse(ms in 1..=TEN_YEARS) {
        let d = Duration::from_millis(ms);
        let text = format_duration(d);
        prop_assert_eq!(parse_duration(&text), Ok(d), "{}", text);
    }

    #[test]
    fn durations_past_ten_years_are_refused(extra in 1..u32::MAX as u64) {
        let text = format!("{}ms", TEN_YEARS + extra);
        prop_assert!(parse_duration(&text).unwrap_err().contains("ten years"));
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
    assert!(
        parse_duration("0s")
            .unwrap_err()
            .contains("longer than zero")
    );
}
