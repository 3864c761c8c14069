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
//! A key travels in clear, so each line of the key file may bind its key to the addresses
//! allowed to send it (`KEY 10.0.0.5 10.0.0.6`): captured and replayed from elsewhere, it
//! proves nothing (the c8a278e audit replayed one). A key file that is set but cannot be used
//! never stops the daemon (that would take every master out at once when configuration
//! management pushes the mistake): nothing proves a poll, and the guard refuses unforced drains
//! until it is fixed.
//!
//! Checking costs no allocation: the keys are compared in constant time, so a poller cannot
//! learn a key byte by byte from the answers' timing.

use std::io;
use std::net::IpAddr;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::safe_file;
use crate::settings::allow;
use crate::settings::daemon::Daemon;
use crate::settings::lb_key::{Key, LONGEST, SHORTEST, WIDEST_V4, WIDEST_V6, parse_keys, wide};

/// The header of HAProxy's HTTP check that carries the key.
pub const HEADER: &str = "x-pmcheck-key";
/// The most lines in the file: a key per load balancer, each beside its next one while it is
/// rolled out, and a key on a line per address where that is clearer.
pub const MOST: usize = 16;

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
    /// It sent a key of the file from an address that key is not bound to: replayed.
    Elsewhere,
    /// A key file is set but cannot be used: nothing proves a poll until it is fixed.
    Unusable,
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
            Self::Elsewhere => "unverified: sent a key bound to other addresses (--lb-key-file)",
            Self::Unusable => "unverified: the key file (--lb-key-file) cannot be used",
            Self::Unlisted => {
                "unverified: no key file is set and its address is not an --lb-address"
            }
        }
    }
}

/// Whose word a poll is: how it proved itself and, when by a key, which one. One key per
/// load balancer makes the key its name: two HAProxy processes on one host (or behind one NAT)
/// are two views when each has its own key, whatever their address says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Whose {
    /// How it proved itself.
    pub proof: Proof,
    /// The key it proved itself with, by the first line of the key file that holds it.
    pub key_line: Option<usize>,
}

/// What a load balancer must show.
#[derive(Debug, Clone, Default)]
pub struct LbProof {
    keys: Vec<Key>,
    addresses: Vec<IpNet>,
    /// A key file is set but cannot be used: why.
    unusable: Option<Arc<str>>,
    /// The file as it was re-read at a reload cannot be used: why (these keys are the ones
    /// read before, kept).
    rejected: Option<Arc<str>>,
}

/// What the key file says of one key, without the key: for `status` and `config`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyScope {
    /// Its line in the file, from 1.
    pub line: usize,
    /// The networks it is bound to; empty: any address.
    pub from: Vec<String>,
}

impl KeyScope {
    /// Its addresses in words: `10.0.0.5/32, 10.0.0.6/32`, or `any address`.
    pub fn addresses(&self) -> String {
        match self.from.as_slice() {
            [] => "any address".to_owned(),
            from => from.join(", "),
        }
    }
}

/// The key file as the daemon uses it, for the operator's JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyFileAnswer {
    /// Why it cannot be used, if it cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Each key's addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<KeyScope>,
    /// What is weak about it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Why the file re-read at the latest reload cannot be used: the keys above are the ones
    /// read before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<String>,
}

/// Why the key file cannot be used: the file and what is wrong with it.
#[derive(Debug, Error)]
#[error("{}", problem.said(path))]
pub struct LbKeyError {
    /// The file: as given when it cannot be read, else the one a link points to.
    pub path: PathBuf,
    /// What is wrong with it.
    pub problem: KeyFileProblem,
}

/// What is wrong with the key file.
#[derive(Debug)]
pub enum KeyFileProblem {
    /// It cannot be read.
    Read(io::Error),
    /// Everybody can read it (its mode), so it proves nothing.
    WorldReadable(u32),
    /// Owned by somebody (in words) else than root or the daemon's user, who may change it.
    Owner(String),
    /// Others than its owner (who, in words) may write it, or replace it in its directory.
    Writable(String),
    /// A line (from 1) is not a key, and why.
    BadKey(usize, String),
    /// No key, or too many: how many it holds.
    Count(usize),
}

impl KeyFileProblem {
    /// The problem of the key file `path`, in words.
    fn said(&self, path: &Path) -> String {
        let path = path.display();
        let file = format!("the load balancer key file {path} (--lb-key-file)");
        match self {
            Self::Read(e) => format!("cannot read {file}: {e}"),
            Self::WorldReadable(mode) => format!(
                "{file} is readable by every user (mode {mode:o}): `chmod 0640 {path}` and keep it owned by root and pmcheck's group"
            ),
            Self::Owner(owner) => format!(
                "{file} is owned by {owner}: its owner chooses the key; `chown root {path}`"
            ),
            Self::Writable(who) => format!(
                "{file} {who}: anyone who can write it chooses the key; `chmod 0640 {path}` and keep it and its directory owned by root"
            ),
            Self::BadKey(line, why) => format!(
                "{file}, line {line}: {why}; a line is a key of {SHORTEST} to {LONGEST} characters of A-Z a-z 0-9 . _ ~ + / = - holding at least 128 random bits (make one with `openssl rand -hex 32`), then the addresses allowed to send it (`KEY 10.0.0.5 10.0.0.6`)"
            ),
            Self::Count(found) => format!(
                "{file} holds {found} key lines: give 1 to {MOST}, one key per line (# starts a comment)"
            ),
        }
    }
}

impl LbProof {
    /// Keys from `key_file` (if any), else the `addresses` of the load balancers.
    pub fn load(key_file: Option<&Path>, addresses: Vec<IpNet>) -> Result<Self, LbKeyError> {
        let Some(path) = key_file else {
            return Ok(Self {
                addresses,
                ..Self::default()
            });
        };
        let fail = |path: &Path, problem| LbKeyError {
            path: path.to_owned(),
            problem,
        };
        let read = |e| fail(path, KeyFileProblem::Read(e));
        // The checks are of the file a link points to, in its own directory.
        let path = &std::fs::canonicalize(path).map_err(read)?;
        let meta = std::fs::metadata(path).map_err(read)?;
        let (owner, me) = (meta.uid(), nix::unistd::geteuid().as_raw());
        if owner != 0 && owner != me {
            let owner = crate::accounts::user_name(owner);
            return Err(fail(path, KeyFileProblem::Owner(owner)));
        }
        let mode = meta.permissions().mode() & 0o7777;
        // Readable by every user only if they may also enter its directory: 0644 inside the
        // packaged 0750 /etc/pmcheck is private.
        if mode & 0o004 != 0 && others_enter(path) {
            return Err(fail(path, KeyFileProblem::WorldReadable(mode)));
        }
        if let Some(who) = writable_by_others(path, mode) {
            return Err(fail(path, KeyFileProblem::Writable(who)));
        }
        let text = safe_file::read_to_string(path, safe_file::CONFIG_LIMIT).map_err(read)?;
        let keys = parse_keys(&text)
            .map_err(|(line, why)| fail(path, KeyFileProblem::BadKey(line, why)))?;
        if keys.is_empty() || keys.len() > MOST {
            return Err(fail(path, KeyFileProblem::Count(keys.len())));
        }
        Ok(Self {
            keys,
            ..Self::default()
        })
    }

    /// [`LbProof::load`] of the daemon's `--lb-key-file` and `--lb-address`: a key file that
    /// cannot be used proves nothing ([`Proof::Unusable`]) and says why, instead of stopping
    /// the daemon.
    pub fn of(daemon: &Daemon) -> (Self, Option<LbKeyError>) {
        match Self::load(daemon.lb_key_file.as_deref(), daemon.lb_address.clone()) {
            Ok(proof) => (proof, None),
            Err(e) => {
                let unusable = Self {
                    unusable: Some(e.to_string().into()),
                    ..Self::default()
                };
                (unusable, Some(e))
            }
        }
    }

    /// The file re-read at a reload: its keys, or these ones kept when it cannot be used (a
    /// rotation half done must not make every check unproven), with why. `None`: no key file.
    pub fn reload(&self, daemon: &Daemon) -> (Self, Option<LbKeyError>) {
        match Self::of(daemon) {
            (_, Some(e)) if self.unusable.is_none() => {
                let kept = Self {
                    rejected: Some(e.to_string().into()),
                    ..self.clone()
                };
                (kept, Some(e))
            }
            // Read, or nothing proved before either: the new reason.
            loaded => loaded,
        }
    }

    /// A key file is set: only a key proves a poll.
    pub fn wants_key(&self) -> bool {
        !self.keys.is_empty() || self.unusable.is_some()
    }

    /// Whether `peer` is one host the key file binds a key to, or an `--lb-address` host:
    /// a load balancer known before it polls. A wider network is not: any of its hosts would
    /// get a load balancer's room.
    pub fn binds(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        let host = |net: &IpNet| net.prefix_len() == net.max_prefix_len() && net.addr() == peer;
        let mut listed = (self.keys.iter().flat_map(|k| &k.from))
            .chain(self.addresses.iter().filter(|_| self.keys.is_empty()));
        self.unusable.is_none() && listed.any(host)
    }

    /// Whether a poll from `peer` can prove itself at all: with a key file, any may (with the
    /// key); else only from an `--lb-address`.
    pub fn may_prove(&self, peer: IpAddr) -> bool {
        self.wants_key() || (!self.addresses.is_empty() && allow::permits(&self.addresses, peer))
    }

    /// Whose word a poll from `peer` that sent `key` (the header, or the key word of the
    /// agent check's line) is. A key's addresses are those of every line holding it.
    pub fn judge(&self, peer: IpAddr, key: Option<&[u8]>) -> Whose {
        let proof = |proof| Whose {
            proof,
            key_line: None,
        };
        if self.unusable.is_some() {
            return proof(Proof::Unusable);
        }
        if self.wants_key() {
            // HAProxy's agent check sends the `agent-send` string verbatim, so a line end (and
            // any space around) is not part of the key.
            let Some(sent) = key.map(<[u8]>::trim_ascii).filter(|k| !k.is_empty()) else {
                return proof(Proof::NoKey);
            };
            let mut lines = self
                .keys
                .iter()
                .filter(|k| same(&k.secret, sent))
                .peekable();
            let Some(first) = lines.peek().map(|k| k.first) else {
                return proof(Proof::WrongKey);
            };
            return match lines.any(|k| k.from.is_empty() || allow::permits(&k.from, peer)) {
                true => Whose {
                    proof: Proof::Key,
                    key_line: Some(first),
                },
                false => proof(Proof::Elsewhere),
            };
        }
        if self.may_prove(peer) {
            proof(Proof::Address)
        } else {
            proof(Proof::Unlisted)
        }
    }

    /// What the key file holds (never the keys) and what is weak about it, when one is set.
    pub fn answer(&self) -> Option<KeyFileAnswer> {
        let keys = (self.keys.iter()).map(|k| KeyScope {
            line: k.line,
            from: k.from.iter().map(ToString::to_string).collect(),
        });
        self.wants_key().then(|| KeyFileAnswer {
            problem: self.unusable.as_deref().map(str::to_owned),
            keys: keys.collect(),
            warnings: self.warnings(),
            rejected: self.rejected.as_deref().map(str::to_owned),
        })
    }

    /// What a captured key could do: a key bound to no address, or to a network wider than
    /// [`WIDEST_V4`] or [`WIDEST_V6`] (`0.0.0.0/0` and `::/0` among them).
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        for k in &self.keys {
            if k.from.is_empty() {
                warnings.push(format!(
                    "the key on line {} of the load balancer key file is bound to no address: captured, it proves a poll from anywhere; add the load balancers' addresses after it (`KEY 10.0.0.5`)",
                    k.line
                ));
            }
            for net in k.from.iter().filter(|n| wide(n)) {
                warnings.push(format!(
                    "the key on line {} of the load balancer key file is bound to {net}, wider than a /{WIDEST_V4} (IPv4) or /{WIDEST_V6} (IPv6): any host there that captures it passes for a load balancer; bind it to the load balancers' own addresses",
                    k.line
                ));
            }
        }
        warnings
    }
}

/// Whether users other than the owner and group of `path`'s directory may enter it (when it
/// cannot be read, assume they may).
fn others_enter(path: &Path) -> bool {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::metadata(dir).map_or(true, |m| m.permissions().mode() & 0o001 != 0)
}

/// Who besides the owner may write `path` or replace it in its directory, if anyone.
fn writable_by_others(path: &Path, mode: u32) -> Option<String> {
    if mode & 0o022 != 0 {
        return Some(format!(
            "is writable by others than its owner (mode {mode:o})"
        ));
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty())?;
    let dir_mode = std::fs::metadata(dir).ok()?.permissions().mode() & 0o7777;
    // Sticky (/tmp): others may write there, but not replace what is not theirs.
    (dir_mode & 0o022 != 0 && dir_mode & 0o1000 == 0).then(|| {
        format!(
            "sits in {}, which others than its owner may write (mode {dir_mode:o}): they can replace it",
            dir.display()
        )
    })
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

    /// The daemon's settings with `--lb-key-file path`.
    fn daemon(path: &Path) -> Daemon {
        use clap::CommandFactory as _;
        let argv = ["pmcheck", "serve", "--lb-key-file", path.to_str().unwrap()];
        let matches = crate::cli::Cli::command().get_matches_from(argv);
        let given = crate::provenance::Provenance::of(&matches).given();
        given.daemon.unwrap()
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn a_key_proves_a_poll_and_nothing_else_does() {
        let proof = LbProof {
            keys: vec![Key {
                secret: KEY.as_bytes().into(),
                line: 1,
                first: 1,
                from: Vec::new(),
            }],
            ..LbProof::default()
        };
        assert_eq!(proof.judge(ip(1), Some(KEY.as_bytes())).proof, Proof::Key);
        let agent_line = format!("{KEY}\n");
        assert_eq!(
            proof.judge(ip(1), Some(agent_line.as_bytes())).proof,
            Proof::Key
        );
        assert_eq!(proof.judge(ip(1), None).proof, Proof::NoKey);
        assert_eq!(proof.judge(ip(1), Some(b"  ")).proof, Proof::NoKey);
        assert_eq!(
            proof.judge(ip(1), Some(&KEY.as_bytes()[1..])).proof,
            Proof::WrongKey
        );
        let mut wrong = KEY.as_bytes().to_vec();
        wrong[31] = b'0';
        assert_eq!(proof.judge(ip(1), Some(&wrong)).proof, Proof::WrongKey);
        assert!(Proof::Key.proven() && !Proof::WrongKey.proven() && !Proof::NoKey.proven());
    }

    #[test]
    fn without_a_key_file_the_address_list_is_the_weaker_proof() {
        let proof = LbProof::load(None, vec!["10.0.0.0/30".parse().unwrap()]).unwrap();
        assert_eq!(proof.judge(ip(2), None).proof, Proof::Address);
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 2).to_ipv6_mapped());
        assert_eq!(proof.judge(mapped, None).proof, Proof::Address);
        assert_eq!(
            proof.judge(ip(9), Some(KEY.as_bytes())).proof,
            Proof::Unlisted
        );
        assert_eq!(LbProof::default().judge(ip(2), None).proof, Proof::Unlisted);
        assert!(Proof::Address.proven() && !Proof::Unlisted.proven());
    }

    #[test]
    fn the_key_file_must_be_private_and_hold_one_to_four_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lb-key");
        std::fs::write(&path, format!("{KEY}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        // In a directory others cannot enter (the packaged 0750 /etc/pmcheck), 0644 is private.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
        assert!(LbProof::load(Some(&path), Vec::new()).is_ok());
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = LbProof::load(Some(&path), Vec::new()).unwrap_err();
        assert!(
            matches!(e.problem, KeyFileProblem::WorldReadable(0o644)),
            "{e}"
        );
        assert!(e.to_string().contains("chmod 0640"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let proof = LbProof::load(Some(&path), vec!["10.0.0.0/8".parse().unwrap()]).unwrap();
        assert!(proof.wants_key());
        assert_eq!(
            proof.judge(ip(1), None).proof,
            Proof::NoKey,
            "a key file beats addresses"
        );
        std::fs::write(&path, "# nothing yet\n").unwrap();
        let e = LbProof::load(Some(&path), Vec::new()).unwrap_err();
        assert!(matches!(e.problem, KeyFileProblem::Count(0)), "{e}");
        let e = LbProof::load(Some(&dir.path().join("missing")), Vec::new()).unwrap_err();
        assert!(e.to_string().contains("missing (--lb-key-file)"), "{e}");
    }

    /// The c8a278e audit replayed a captured key from another address: a key bound to its
    /// load balancers' addresses proves nothing elsewhere.
    #[test]
    fn a_key_bound_to_addresses_proves_a_poll_only_from_them() {
        let keys = parse_keys(&format!("{KEY} 10.0.0.5 10.0.1.0/30\n{KEY}ff\n")).unwrap();
        let proof = LbProof {
            keys,
            ..LbProof::default()
        };
        assert_eq!(proof.judge(ip(5), Some(KEY.as_bytes())).proof, Proof::Key);
        assert_eq!(
            proof.judge(ip(6), Some(KEY.as_bytes())).proof,
            Proof::Elsewhere
        );
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 1, 2).to_ipv6_mapped());
        assert_eq!(proof.judge(mapped, Some(KEY.as_bytes())).proof, Proof::Key);
        let unbound = format!("{KEY}ff");
        assert_eq!(
            proof.judge(ip(9), Some(unbound.as_bytes())).proof,
            Proof::Key
        );
        assert!(!Proof::Elsewhere.proven());
        let answer = proof.answer().unwrap();
        assert_eq!(answer.keys[0].from, ["10.0.0.5/32", "10.0.1.0/30"]);
        assert!(answer.keys[1].from.is_empty());
        let [unbound] = &answer.warnings[..] else {
            panic!(
                "a /30 is no wider than a site's subnet: {:?}",
                answer.warnings
            )
        };
        assert!(
            unbound.contains("line 2") && unbound.contains("bound to no address"),
            "{unbound}"
        );
        assert_eq!(
            parse_keys(&format!("{KEY} lb1\n")).unwrap_err(),
            (
                1,
                "\"lb1\" is not an address or a network (10.0.0.5, 10.0.0.0/29)".into()
            )
        );
    }

    /// The audit at 4743d29: one key on two lines proved only from the first line's address;
    /// a key bound to `::ffff:10.0.0.5` never matched that IPv4 peer; `::/0` matched no IPv4
    /// peer and was not warned of; `OLDKEY NEWKEY` on one line echoed NEWKEY.
    #[test]
    fn a_keys_addresses_are_every_line_it_is_on_and_mapped_forms_are_ipv4() {
        let other = "fedcba9876543210fedcba9876543210";
        let keys = parse_keys(&format!(
            "{KEY} 10.0.0.5\n{other} ::ffff:10.0.0.7\n{KEY} 10.0.0.6\n"
        ))
        .unwrap();
        let proof = LbProof {
            keys,
            ..LbProof::default()
        };
        let whose = |last, key: &str| proof.judge(ip(last), Some(key.as_bytes()));
        assert_eq!(whose(5, KEY).proof, Proof::Key);
        assert_eq!(whose(6, KEY).proof, Proof::Key, "the second line's address");
        assert_eq!(whose(6, KEY).key_line, Some(1), "one key is one view");
        assert_eq!(whose(7, KEY).proof, Proof::Elsewhere);
        assert_eq!(
            whose(7, other),
            Whose {
                proof: Proof::Key,
                key_line: Some(2)
            }
        );
        assert!(
            proof.warnings().iter().all(|w| !w.contains("wider")),
            "{:?}",
            proof.warnings()
        );

        let wide = parse_keys(&format!("{KEY} 10.0.0.0/16\n{other} ::/0\n")).unwrap();
        let proof = LbProof {
            keys: wide,
            ..LbProof::default()
        };
        assert_eq!(proof.judge(ip(9), Some(other.as_bytes())).proof, Proof::Key);
        let warnings = proof.warnings();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].contains("line 1") && warnings[0].contains("10.0.0.0/16, wider than a /24")
        );
        assert!(warnings[1].contains("line 2") && warnings[1].contains("::/0, wider"));

        let (line, why) = parse_keys(&format!("{KEY} {other}\n")).unwrap_err();
        assert_eq!(line, 1);
        assert!(
            why.contains("one key per line") && !why.contains(other),
            "{why}"
        );
    }

    /// The audit: a link to a key file in a directory anyone may write passed, and the owner was
    /// never checked. The checks are of the file a link points to.
    #[test]
    fn a_key_files_checks_follow_a_link_and_want_root_or_the_daemon_as_owner() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let target = open.join("lb-key");
        std::fs::write(&target, format!("{KEY}\n")).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("lb-key");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = LbProof::load(Some(&link), Vec::new()).unwrap_err();
        assert!(matches!(e.problem, KeyFileProblem::Writable(_)), "{e}");
        assert!(
            e.to_string().contains("open"),
            "names the target's directory: {e}"
        );
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o750)).unwrap();
        assert!(LbProof::load(Some(&link), Vec::new()).is_ok());
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root: the owner check needs chown"
            );
            eprintln!("SKIPPED: the key file's owner check needs root to chown (run as root)");
            return;
        }
        std::os::unix::fs::chown(&target, Some(4242), None).unwrap();
        let e = LbProof::load(Some(&link), Vec::new()).unwrap_err();
        assert!(matches!(e.problem, KeyFileProblem::Owner(_)), "{e}");
        assert!(e.to_string().contains("chown root"), "{e}");
    }

    #[test]
    fn a_key_file_others_may_write_is_refused_and_the_daemon_keeps_going_without_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lb-key");
        std::fs::write(&path, format!("{KEY}\n")).unwrap();
        for mode in [0o602, 0o620] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = LbProof::load(Some(&path), Vec::new()).unwrap_err();
            assert!(
                matches!(e.problem, KeyFileProblem::Writable(_)),
                "{mode:o}: {e}"
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = LbProof::load(Some(&path), Vec::new()).unwrap_err();
        assert!(
            e.to_string()
                .contains("which others than its owner may write (mode 777)"),
            "{e}"
        );
        let (proof, problem) = LbProof::of(&daemon(&path));
        assert!(problem.is_some());
        assert_eq!(
            proof.judge(ip(1), Some(KEY.as_bytes())).proof,
            Proof::Unusable
        );
        assert!(proof.wants_key() && proof.may_prove(ip(1)));
        let answer = proof.answer().unwrap();
        assert!(answer.problem.unwrap().contains("mode 777"));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
        let (proof, problem) = LbProof::of(&daemon(&path));
        assert!(problem.is_none());
        assert_eq!(proof.judge(ip(1), Some(KEY.as_bytes())).proof, Proof::Key);
    }
}
