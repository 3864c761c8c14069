//! `/etc/default/pmcheck`, read the way systemd's `EnvironmentFile=` reads it (systemd.exec(5)),
//! not the way a shell would: `pmcheck config` shows what the unit will get.
//!
//! One `VAR=value` per line; lines starting with `#` or `;` are comments; whitespace around the
//! value is dropped; a value in double quotes keeps its spaces and takes `\"`, `\\`, `\n`
//! escapes, one in single quotes is taken as it is; a backslash at the end of a line joins the
//! next one. A name that is not a variable name (`export X=1`) is ignored, as systemd ignores
//! it, and reported.

use std::path::{Path, PathBuf};

/// Where the packages install it, Debian's first.
pub const LOCATIONS: [&str; 2] = ["/etc/default/pmcheck", "/etc/sysconfig/pmcheck"];

/// An environment file, read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvFile {
    /// The file.
    pub path: PathBuf,
    /// Its assignments in order (a later one wins, as in systemd).
    pub vars: Vec<(String, String)>,
    /// Lines systemd would ignore, with their numbers: worth a warning.
    pub ignored: Vec<(usize, String)>,
}

impl EnvFile {
    /// The first of [`LOCATIONS`] that exists, read; `None` when none does.
    pub fn find() -> Option<std::io::Result<Self>> {
        LOCATIONS
            .iter()
            .map(Path::new)
            .find(|p| p.exists())
            .map(Self::load)
    }

    /// Reads `path`.
    pub fn load(path: &Path) -> std::io::Result<Self> {
        let text = crate::safe_file::read_to_string(path, crate::safe_file::CONFIG_LIMIT)?;
        Ok(Self::parse(path, &text))
    }

    /// The value of `var`, the last assignment winning.
    pub fn get(&self, var: &str) -> Option<&str> {
        self.vars
            .iter()
            .rev()
            .find(|(name, _)| name == var)
            .map(|(_, value)| value.as_str())
    }

    /// Parses `text` as systemd does.
    pub fn parse(path: &Path, text: &str) -> Self {
        let mut file = Self {
            path: path.to_owned(),
            ..Self::default()
        };
        let mut lines = text.lines().enumerate();
        while let Some((at, line)) = lines.next() {
            let mut line = line.trim_start().to_owned();
            if line.is_empty() || line.starts_with(['#', ';']) {
                continue;
            }
            // A backslash at the end joins the next line (outside single quotes).
            while line.ends_with('\\') && !line.ends_with("\\\\") {
                line.pop();
                match lines.next() {
                    Some((_, next)) => line.push_str(next),
                    None => break,
                }
            }
            match line.split_once('=') {
                Some((name, value)) if is_name(name.trim()) => {
                    file.vars
                        .push((name.trim().to_owned(), unquote(value.trim())));
                }
                _ => file.ignored.push((at + 1, line)),
            }
        }
        file
    }
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A value without its quotes, escapes resolved in double quotes.
fn unquote(value: &str) -> String {
    if let Some(inner) = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
        return inner.to_owned();
    }
    let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else {
        return value.to_owned();
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        out.push(match c {
            '\\' => match chars.next() {
                Some('n') => '\n',
                Some(other) => other,
                None => '\\',
            },
            c => c,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_systemd_reads() {
        let text = "# comment\n; also a comment\n\n  PMCHECK_INTERVAL = 2s  \n\
                    PMCHECK_ALLOW=\"10.0.0.0/8, 192.0.2.7/32\"\nPMCHECK_X='a \\n b'\n\
                    PMCHECK_Y=\"say \\\"hi\\\"\"\nPMCHECK_LONG=a,\\\nb\nexport PMCHECK_Z=1\n\
                    not an assignment\nPMCHECK_INTERVAL=3s # not a comment\n";
        let f = EnvFile::parse(Path::new("/etc/default/pmcheck"), text);
        assert_eq!(f.get("PMCHECK_INTERVAL"), Some("3s # not a comment"));
        assert_eq!(f.get("PMCHECK_ALLOW"), Some("10.0.0.0/8, 192.0.2.7/32"));
        assert_eq!(f.get("PMCHECK_X"), Some("a \\n b"));
        assert_eq!(f.get("PMCHECK_Y"), Some("say \"hi\""));
        assert_eq!(f.get("PMCHECK_LONG"), Some("a,b"));
        assert_eq!(f.get("PMCHECK_Z"), None, "`export` is not systemd's syntax");
        assert_eq!(
            f.ignored.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            vec![10, 11]
        );
    }

    #[test]
    fn the_packaged_file_sets_two_settings() {
        let text = include_str!("../../packaging/defaults/pmcheck");
        let f = EnvFile::parse(Path::new("/etc/default/pmcheck"), text);
        assert_eq!(
            f.vars,
            vec![
                ("PMCHECK_AGENT_LISTEN".to_owned(), "[::]:9201".to_owned()),
                ("PMCHECK_DRAINED_STATUS".to_owned(), "404".to_owned())
            ]
        );
        assert!(f.ignored.is_empty(), "{:?}", f.ignored);
    }
}
