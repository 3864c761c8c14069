//! Whether a poll comes from a load balancer: what the waits, the last-server guard and
//! `status` may believe.
//!
//! Any process that can reach port 9200 can send `X-Haproxy-Server-State` and poll at a
//! steady rhythm (the e5ddf73 audit ended `drain --wait` early, held it to its timeout, and
//! made `drain` refuse, all from a loop of curl). So a poll proves itself with what only the
//! load balancer's configuration holds: a key from `--lb-key-file`, sent by HAProxy's HTTP
//! check (`http-check send hdr X-Pmcheck-Key <key>`) and agent check (`agent-send <key>`).
//! Without a key file, `--lb-address` lists the load balancers' addresses: weaker, since any
//! process on those hosts (a monitoring check, a user's curl) passes for the load balancer.
//!
//! Checking costs no allocation: the keys are compared in constant time, so a poller cannot
//! learn a key byte by byte from the answers' timing.

use std::io;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::safe_file;
use crate::settings::allow;

/// The header of HAProxy's HTTP check that carries the key.
pub const HEADER: &str = "x-pmcheck-key";
/// The shortest key: 128 bits in hex.
pub const SHORTEST: usize = 32;
/// The longest key: HAProxy sends it in one check buffer with everything else.
pub const LONGEST: usize = 128;
/// The most keys in the file: the one in use, and the next one while it is rolled out.
pub const MOST: usize = 4;
/// The packaged HAProxy example's placeholder, which everybody can read.
pub const PLACEHOLDER: &str = "CHANGE-ME";

/// How a poll proved that it comes from a load balancer, or why it did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Proof {
    /// It sent a key of `--lb-key-file`.
    Key,
    /// No key file is set and it came from an `--lb-address`.
    Address,
    /// A key file is set and it sent no key.
    NoKey,
    /// A key file is set and it sent another key.
    WrongKey,
    /// Neither a key file nor `--lb-address` is set, or it came from another address.
    #[default]
    Unlisted,
}

impl Proof {
    /// What the waits and the guard may act on.
    pub fn proven(self) -> bool {
        matches!(self, Self::Key | Self::Address)
    }

    /// For a person: how it proved itself, or what it lacks.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Key => "proved by its key",
            Self::Address => "trusted by its address (--lb-address)",
            Self::NoKey => "unverified: sent no X-Pmcheck-Key",
            Self::WrongKey => "unverified: sent a wrong X-Pmcheck-Key",
            Self::Unlisted => {
                "unverified: no key file is set and its address is not an --lb-address"
            }
        }
    }
}

/// What a load balancer must show.
#[derive(Debug, Clone, Default)]
pub struct LbProof {
    keys: Vec<Box<[u8]>>,
    addresses: Vec<IpNet>,
}

/// Why the key file cannot be used.
#[derive(Debug, Error)]
pub enum LbKeyError {
    /// It cannot be read.
    #[error("cannot read the load balancer key file {path} (--lb-key-file): {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Everybody can read it, so it proves nothing.
    #[error(
        "the load balancer key file {path} (--lb-key-file) is readable by every user (mode {mode:o}): `chmod 0640 {path}` and keep it owned by root and pmcheck's group"
    )]
    WorldReadable {
        /// The file.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// A line is not a key.
    #[error(
        "the load balancer key file {path} (--lb-key-file), line {line}: {why}; a key is {SHORTEST} to {LONGEST} characters of A-Z a-z 0-9 . _ ~ + / = - (make one with `openssl rand -hex 32`)"
    )]
    BadKey {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// No key, or too many.
    #[error(
        "the load balancer key file {path} (--lb-key-file) holds {found} keys: give 1 to {MOST}, one per line (# starts a comment)"
    )]
    Count {
        /// The file.
        path: PathBuf,
        /// How many it holds.
        found: usize,
    },
}

impl LbProof {
    /// Polls prove nothing: every poll is [`Proof::Unlisted`].
    pub fn none() -> Self {
        Self::default()
    }

    /// Keys from `key_file` (if any), else the `addresses` of the load balancers.
    pub fn load(key_file: Option<&Path>, addresses: Vec<IpNet>) -> Result<Self, LbKeyError> {
        let Some(path) = key_file else {
            return Ok(Self {
                keys: Vec::new(),
                addresses,
            });
        };
        let read = |source| LbKeyError::Read {
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read)?;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o004 != 0 {
            return Err(LbKeyError::WorldReadable {
                path: path.to_owned(),
                mode,
            });
        }
        let text = safe_file::read_to_string(path, safe_file::CONFIG_LIMIT).map_err(read)?;
        let keys = parse_keys(&text).map_err(|(line, why)| LbKeyError::BadKey {
            path: path.to_owned(),
            line,
            why,
        })?;
        if keys.is_empty() || keys.len() > MOST {
            return Err(LbKeyError::Count {
                path: path.to_owned(),
                found: keys.len(),
            });
        }
        Ok(Self {
            keys,
            addresses: Vec::new(),
        })
    }

    /// A key file is set: only a key proves a poll.
    pub fn wants_key(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Whether a poll from `peer` can prove itself at all: with a key file, any may (with the
    /// key); else only from an `--lb-address`.
    pub fn may_prove(&self, peer: IpAddr) -> bool {
        self.wants_key() || (!self.addresses.is_empty() && allow::permits(&self.addresses, peer))
    }

    /// How a poll from `peer` that sent `key` (the header, or the key word of the agent
    /// check's line) proves itself.
    pub fn judge(&self, peer: IpAddr, key: Option<&[u8]>) -> Proof {
        if self.wants_key() {
            return match key.map(trim) {
                None | Some([]) => Proof::NoKey,
                Some(sent) if self.keys.iter().any(|k| same(k, sent)) => Proof::Key,
                Some(_) => Proof::WrongKey,
            };
        }
        if allow::permits(&self.addresses, peer) && !self.addresses.is_empty() {
            Proof::Address
        } else {
            Proof::Unlisted
        }
    }
}

/// The keys of a key file, or the line at fault and why.
fn parse_keys(text: &str) -> Result<Vec<Box<[u8]>>, (usize, String)> {
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let key = line.split('#').next().unwrap_or_default().trim();
        if key.is_empty() {
            continue;
        }
        let why = if key.contains(PLACEHOLDER) {
            Some("it is the example's placeholder, which everybody can read".to_owned())
        } else if let Some(c) = key.chars().find(|&c| !key_char(c)) {
            Some(format!("{c:?} is not allowed"))
        } else if !(SHORTEST..=LONGEST).contains(&key.len()) {
            Some(format!("it is {} characters long", key.len()))
        } else {
            None
        };
        if let Some(why) = why {
            return Err((i + 1, why));
        }
        keys.push(key.as_bytes().into());
    }
    Ok(keys)
}

/// What a key may hold: base64 and hex, and nothing HAProxy's log-format would expand (`%`)
/// or split (spaces, quotes).
fn key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._~+/=-".contains(c)
}

/// The key as sent: HAProxy's agent check sends the `agent-send` string verbatim, so a line
/// end (and any space around) is not part of it.
fn trim(sent: &[u8]) -> &[u8] {
    sent.trim_ascii()
}

/// Equal, in a time that depends only on the lengths.
fn same(key: &[u8], sent: &[u8]) -> bool {
    if key.len() != sent.len() {
        return false;
    }
    let diff = key.iter().zip(sent).fold(0u8, |d, (a, b)| d | (a ^ b));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const KEY: &str = "0123456789abcdef0123456789abcdef";

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn a_key_proves_a_poll_and_nothing_else_does() {
        let proof = LbProof {
            keys: vec![KEY.as_bytes().into()],
            addresses: Vec::new(),
        };
        assert_eq!(proof.judge(ip(1), Some(KEY.as_bytes())), Proof::Key);
        let agent_line = format!("{KEY}\n");
        assert_eq!(proof.judge(ip(1), Some(agent_line.as_bytes())), Proof::Key);
        assert_eq!(proof.judge(ip(1), None), Proof::NoKey);
        assert_eq!(proof.judge(ip(1), Some(b"  ")), Proof::NoKey);
        assert_eq!(
            proof.judge(ip(1), Some(&KEY.as_bytes()[1..])),
            Proof::WrongKey
        );
        let mut wrong = KEY.as_bytes().to_vec();
        wrong[31] = b'0';
        assert_eq!(proof.judge(ip(1), Some(&wrong)), Proof::WrongKey);
        assert!(Proof::Key.proven() && !Proof::WrongKey.proven() && !Proof::NoKey.proven());
    }

    #[test]
    fn without_a_key_file_the_address_list_is_the_weaker_proof() {
        let proof = LbProof::load(None, vec!["10.0.0.0/30".parse().unwrap()]).unwrap();
        assert_eq!(proof.judge(ip(2), None), Proof::Address);
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 2).to_ipv6_mapped());
        assert_eq!(proof.judge(mapped, None), Proof::Address);
        assert_eq!(proof.judge(ip(9), Some(KEY.as_bytes())), Proof::Unlisted);
        assert_eq!(LbProof::none().judge(ip(2), None), Proof::Unlisted);
        assert!(Proof::Address.proven() && !Proof::Unlisted.proven());
    }

    #[test]
    fn a_key_file_holds_keys_and_comments_and_names_a_bad_line() {
        let keys = parse_keys(&format!("# rolled 2026-11\n\n{KEY}  # in use\n{KEY}ff\n")).unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(
            parse_keys("short\n"),
            Err((1, "it is 5 characters long".into()))
        );
        assert_eq!(
            parse_keys(&format!("{KEY}\n{KEY}%H\n")),
            Err((2, "'%' is not allowed".into()))
        );
        assert_eq!(
            parse_keys("CHANGE-ME-to-the-key-in-etc-pmcheck-lb-key\n")
                .unwrap_err()
                .0,
            1
        );
    }

    #[test]
    fn the_key_file_must_be_private_and_hold_one_to_four_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lb-key");
        std::fs::write(&path, format!("{KEY}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = LbProof::load(Some(&path), Vec::new()).unwrap_err();
        assert!(
            matches!(e, LbKeyError::WorldReadable { mode: 0o644, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("chmod 0640"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let proof = LbProof::load(Some(&path), vec!["10.0.0.0/8".parse().unwrap()]).unwrap();
        assert!(proof.wants_key());
        assert_eq!(
            proof.judge(ip(1), None),
            Proof::NoKey,
            "a key file beats addresses"
        );
        std::fs::write(&path, "# nothing yet\n").unwrap();
        let e = LbProof::load(Some(&path), Vec::new()).unwrap_err();
        assert!(matches!(e, LbKeyError::Count { found: 0, .. }), "{e}");
        let e = LbProof::load(Some(&dir.path().join("missing")), Vec::new()).unwrap_err();
        assert!(e.to_string().contains("missing (--lb-key-file)"), "{e}");
    }
}
