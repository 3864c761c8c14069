//! HAProxy's own view of this server: the `X-Haproxy-Server-State` header that
//! `http-check send-state` adds to every HTTP check.
//!
//! HAProxy 2.6 writes it as `UP 2/3; address=A; port=P; name=BACKEND/SERVER; node=NODE;
//! weight=OWN/TOTAL; scur=SERVER/BACKEND; qcur=N` and, during slow start, `; throttle=N%`
//! (`httpchk_build_status_header`). The first word is HAProxy's operational state of this
//! server: `UP`, `DOWN` or `NOLB`, with `n/m` while a transition is under way, or `no check`.
//! `OWN` is this server's effective weight, `TOTAL` the backend's total over the servers that
//! take new traffic: an agent or admin drain leaves the word `UP` and `OWN` unchanged and only
//! drops `TOTAL`. `scur` is first this server's current sessions.
//!
//! It is network input: parsed strictly (every known field at most once, numbers as plain
//! digits, at most [`LIMIT`] bytes of visible ASCII) and used to show the operator what the
//! load balancer says and to decide the waits. It changes an answer only by the drain rule
//! ([`crate::health::hold`]), and only when it came with the load balancers' key.

use serde::{Deserialize, Serialize};

/// The longest header kept: HAProxy's is about 150 bytes with usual names.
pub const LIMIT: usize = 384;
/// The header's name, as HAProxy sends it (header names are case-insensitive).
pub const HEADER: &str = "x-haproxy-server-state";

/// HAProxy's operational state of this server, the header's first word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Health {
    /// Taking traffic (unless an admin or agent drain holds it: see [`LbState::counted`]).
    #[serde(rename = "UP")]
    Up,
    /// Failed its checks: no traffic.
    #[serde(rename = "DOWN")]
    Down,
    /// Stopping (`http-check disable-on-404`): no new traffic, open sessions continue.
    #[serde(rename = "NOLB")]
    Nolb,
    /// Health checks are off for this server.
    #[serde(rename = "no check")]
    NoCheck,
}

impl Health {
    /// The word as HAProxy writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Up => "UP",
            Health::Down => "DOWN",
            Health::Nolb => "NOLB",
            Health::NoCheck => "no check",
        }
    }
}

/// One `X-Haproxy-Server-State` header, read: its names as `S` (`String`; `()` when a poll
/// only checks that it reads, allocating nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LbState<S = String> {
    /// The state word.
    pub health: Health,
    /// `n/m` after the word: n of the m checks of a transition under way (`UP 2/3`: one
    /// failed check on the way down).
    pub transition: Option<(u32, u32)>,
    /// The backend (HAProxy's `name=BACKEND/SERVER`).
    pub backend: S,
    /// The server line's name.
    pub server: S,
    /// HAProxy's `node` (its host name unless `global node` says otherwise); empty if absent.
    pub node: S,
    /// This server's effective weight.
    pub weight: u32,
    /// The backend's total weight over the servers that take new traffic.
    pub total_weight: u32,
    /// This server's current sessions.
    pub scur: u32,
    /// The backend's current sessions.
    pub backend_scur: u32,
    /// Requests queued for this server.
    pub qcur: u32,
    /// Slow start's throttle in percent, while it lasts.
    pub throttle: Option<u32>,
}

impl LbState {
    /// This server's weight counts in the backend's total as far as the header alone can tell:
    /// it has weight, and the total holds at least that much. An agent or admin drain drops it
    /// from the total, which shows only when the other servers weigh less than this one
    /// (the waits of `drain --wait` also use the agent check's drain for that case).
    pub fn counted(&self) -> bool {
        self.weight > 0 && self.total_weight >= self.weight
    }

    /// The only server taking new traffic in its backend: `UP` and its own weight is the
    /// whole total.
    pub fn last_serving(&self) -> bool {
        matches!(self.health, Health::Up | Health::NoCheck)
            && self.weight > 0
            && self.total_weight == self.weight
    }

    /// `UP 2/3`, `NOLB`.
    pub fn word(&self) -> String {
        match self.transition {
            Some((n, m)) => format!("{} {n}/{m}", self.health.as_str()),
            None => self.health.as_str().to_owned(),
        }
    }
}

/// Why a header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// Over [`LIMIT`].
    #[error("longer than {LIMIT} bytes")]
    TooLong,
    /// A control or non-ASCII byte.
    #[error("not visible ASCII")]
    NotAscii,
    /// The first word is none of HAProxy's.
    #[error(
        "unknown state word {0:?} (want UP, DOWN, NOLB, each with an optional n/m, or `no check`)"
    )]
    Word(String),
    /// A field without `=`, or a key that is no identifier.
    #[error("field {0:?} is not `key=value`")]
    Field(String),
    /// A known field twice.
    #[error("{0} given twice")]
    Twice(&'static str),
    /// A value of the wrong shape.
    #[error("{0} is not {1}")]
    Value(&'static str, &'static str),
    /// A required field is missing.
    #[error("no {0}")]
    Missing(&'static str),
}

/// The `name=BACKEND/SERVER` of a header, found without reading the rest: which of this
/// node's server lines a check is for (one load balancer may check the node in several
/// backends). Empty when there is none.
pub fn name_of(bytes: &[u8]) -> &[u8] {
    field_of(bytes, b"name")
}

/// One field of a header (`node=` gives `node`), found without reading the rest; empty when
/// there is none.
fn field_of<'a>(bytes: &'a [u8], key: &[u8]) -> &'a [u8] {
    (bytes.split(|&b| b == b';').map(<[u8]>::trim_ascii))
        .find_map(|field| field.strip_prefix(key)?.strip_prefix(b"="))
        .unwrap_or_default()
}

/// The `node=` of a header: which HAProxy wrote it (its `global node`, else its host name).
pub fn node_of(bytes: &[u8]) -> &[u8] {
    field_of(bytes, b"node")
}

/// What a header says that the drain rule reads ([`crate::health::hold`]): whether this node
/// is its backend's last server taking new traffic, and whether the backend has none; `None`
/// when the header does not say. Read without allocating, on every check. One HAProxy changes
/// it only when a server joins or leaves the backend, which takes `rise` or `fall` checks or a
/// drain; two HAProxy processes answering as one, with different servers, flip it at every
/// check ([`crate::responder::server_line`]). Weights that move with each master's load do not
/// change it.
pub fn hold_view(bytes: &[u8]) -> Option<(bool, bool)> {
    let word = bytes.split(|&b| b == b';').next()?.trim_ascii();
    let serving = word.starts_with(b"UP") || word == b"no check";
    let weight = field_of(bytes, b"weight");
    let at = weight.iter().position(|&b| b == b'/')?;
    let number = |digits: &[u8]| std::str::from_utf8(digits).ok()?.parse::<u32>().ok();
    let (own, total) = (number(&weight[..at])?, number(&weight[at + 1..])?);
    Some((serving && own > 0 && total == own, total == 0))
}

/// Reads one header value.
pub fn parse(bytes: &[u8]) -> Result<LbState, Malformed> {
    fields(bytes, str::to_owned)
}

/// Whether a header value reads, without allocating (a poll records it this way).
pub fn well_formed(bytes: &[u8]) -> bool {
    fields(bytes, |_| ()).is_ok()
}

/// The header read, its names made `S` by `own`.
fn fields<S>(bytes: &[u8], own: impl Fn(&str) -> S) -> Result<LbState<S>, Malformed> {
    if bytes.len() > LIMIT {
        return Err(Malformed::TooLong);
    }
    if !bytes.iter().all(|b| (b' '..=b'~').contains(b)) {
        return Err(Malformed::NotAscii);
    }
    // Checked above: every byte is ASCII.
    let text = std::str::from_utf8(bytes).map_err(|_| Malformed::NotAscii)?;
    let mut fields = text.split(';').map(str::trim);
    let (health, transition) = word(fields.next().unwrap_or_default())?;
    let mut name: Option<(&str, &str)> = None;
    let (mut node, mut weight, mut scur, mut qcur) = (None, None, None, None);
    let (mut throttle, mut address, mut port) = (None, None, None);
    for field in fields {
        let (key, value) = field
            .split_once('=')
            .ok_or_else(|| Malformed::Field(field.chars().take(40).collect()))?;
        match key {
            "name" => {
                let pair = value
                    .split_once('/')
                    .filter(|(b, s)| is_name(b) && is_name(s))
                    .ok_or(Malformed::Value("name", "BACKEND/SERVER"))?;
                once(&mut name, pair, "name")?;
            }
            "node" => once(&mut node, value, "node")?,
            "weight" => once(&mut weight, pair(value, "weight")?, "weight")?,
            "scur" => once(&mut scur, pair(value, "scur")?, "scur")?,
            "qcur" => once(&mut qcur, number(value, "qcur")?, "qcur")?,
            "throttle" => {
                let pct = value
                    .strip_suffix('%')
                    .ok_or(Malformed::Value("throttle", "a percentage"))?;
                once(&mut throttle, number(pct, "throttle")?, "throttle")?;
            }
            "address" => once(&mut address, (), "address")?,
            "port" => once(&mut port, (), "port")?,
            // A later HAProxy may add fields: a well-formed unknown key is passed over.
            _ if is_name(key) => {}
            _ => return Err(Malformed::Field(field.chars().take(40).collect())),
        }
    }
    let (backend, server) = name.ok_or(Malformed::Missing("name"))?;
    let (weight, total_weight) = weight.ok_or(Malformed::Missing("weight"))?;
    let (scur, backend_scur) = scur.ok_or(Malformed::Missing("scur"))?;
    Ok(LbState {
        health,
        transition,
        backend: own(backend),
        server: own(server),
        node: own(node.unwrap_or_default()),
        weight,
        total_weight,
        scur,
        backend_scur,
        qcur: qcur.ok_or(Malformed::Missing("qcur"))?,
        throttle,
    })
}

fn word(text: &str) -> Result<(Health, Option<(u32, u32)>), Malformed> {
    if text == "no check" {
        return Ok((Health::NoCheck, None));
    }
    let bad = || Malformed::Word(text.chars().take(40).collect());
    let (word, rest) = text
        .split_once(' ')
        .map_or((text, None), |(w, r)| (w, Some(r)));
    let health = match word {
        "UP" => Health::Up,
        "DOWN" => Health::Down,
        "NOLB" => Health::Nolb,
        _ => return Err(bad()),
    };
    let transition = rest.map(|rest| pair(rest, "state").map_err(|_| bad()));
    Ok((health, transition.transpose()?))
}

/// HAProxy's identifiers: letters, digits, `-_.:`; also what a field key may be.
fn is_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 128
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

fn number(text: &str, what: &'static str) -> Result<u32, Malformed> {
    // Plain digits only: `parse` would take a sign.
    let digits = text.len() <= 10 && text.bytes().all(|b| b.is_ascii_digit());
    (text.parse().ok().filter(|_| digits)).ok_or(Malformed::Value(what, "a whole number"))
}

fn pair(text: &str, what: &'static str) -> Result<(u32, u32), Malformed> {
    let (a, b) = text.split_once('/').ok_or(Malformed::Value(what, "N/M"))?;
    Ok((number(a, what)?, number(b, what)?))
}

fn once<T>(slot: &mut Option<T>, value: T, what: &'static str) -> Result<(), Malformed> {
    (slot.replace(value)).map_or(Ok(()), |_| Err(Malformed::Twice(what)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_what_haproxy_2_6_sends() {
        let s = parse(
            b"UP; address=127.0.0.1; port=19411; name=bk/m1; node=vm; weight=100/160; scur=0/0; qcur=0",
        )
        .unwrap();
        assert_eq!((s.health, s.transition), (Health::Up, None));
        assert_eq!((s.backend.as_str(), s.server.as_str()), ("bk", "m1"));
        assert_eq!(s.node, "vm");
        assert_eq!((s.weight, s.total_weight, s.scur, s.qcur), (100, 160, 0, 0));
        assert!(s.counted() && !s.last_serving());
        let s = parse(b"UP 2/3; address=::1; port=8140; name=puppet_compilers/compile01; node=lb1; weight=100/100; scur=13/22; qcur=1; throttle=25%").unwrap();
        assert_eq!(s.transition, Some((2, 3)));
        assert_eq!(s.word(), "UP 2/3");
        assert_eq!((s.scur, s.backend_scur, s.qcur), (13, 22, 1));
        assert_eq!(s.throttle, Some(25));
        assert!(s.last_serving());
        let s = parse(b"NOLB; name=bk/m2; node=vm; weight=60/100; scur=0/0; qcur=0").unwrap();
        assert_eq!(s.health, Health::Nolb);
        assert!(!s.last_serving());
        let s = parse(b"DOWN; name=bk/m1; node=vm; weight=100/0; scur=0/0; qcur=0").unwrap();
        assert!(!s.counted());
        assert_eq!(
            parse(b"no check; name=bk/m1; weight=1/1; scur=0/0; qcur=0")
                .unwrap()
                .health,
            Health::NoCheck
        );
    }

    #[test]
    fn finds_the_name_without_reading_the_rest() {
        assert_eq!(name_of(b"UP; address=x; name=bk/m1; node=vm"), b"bk/m1");
        assert_eq!(name_of(b"UP;name=bk/m2"), b"bk/m2");
        assert_eq!(name_of(b"UP; node=name=x"), b"");
        assert_eq!(name_of(b""), b"");
    }

    #[test]
    fn refuses_what_haproxy_never_sends() {
        let ok = "UP; name=bk/m1; node=vm; weight=1/2; scur=0/0; qcur=0";
        assert!(parse(ok.as_bytes()).is_ok());
        for (bad, why) in [
            (
                "up; name=bk/m1; weight=1/2; scur=0/0; qcur=0",
                "unknown state word",
            ),
            (
                "UP x/3; name=bk/m1; weight=1/2; scur=0/0; qcur=0",
                "unknown state word",
            ),
            ("UP; name=bk; weight=1/2; scur=0/0; qcur=0", "name is not"),
            (
                "UP; name=bk/m1; weight=-1/2; scur=0/0; qcur=0",
                "weight is not",
            ),
            (
                "UP; name=bk/m1; weight=1/2; scur=0/0; qcur=+0",
                "qcur is not",
            ),
            (
                "UP; name=bk/m1; weight=1/2; weight=1/2; scur=0/0; qcur=0",
                "weight given twice",
            ),
            ("UP; name=bk/m1; scur=0/0; qcur=0", "no weight"),
            (
                "UP; name=bk/m1; weight=1/2; scur=0/0; qcur=99999999999",
                "qcur is not",
            ),
            (
                "UP; name=bk/m1; weight=1/2; scur=0/0; qcur=0; junk",
                "is not `key=value`",
            ),
            (
                "UP; name=bk/m1; weight=1/2; scur=0/0; qcur=0; throttle=5",
                "throttle is not",
            ),
        ] {
            let e = parse(bad.as_bytes()).expect_err(bad).to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert_eq!(parse(&[b'U'; LIMIT + 1]), Err(Malformed::TooLong));
        assert_eq!(parse(b"UP\r\n"), Err(Malformed::NotAscii));
        assert_eq!(
            parse("UP; node=v\u{e9}".as_bytes()),
            Err(Malformed::NotAscii)
        );
    }

    fn header() -> impl Strategy<Value = (String, LbState)> {
        let health = prop_oneof![
            Just(Health::Up),
            Just(Health::Down),
            Just(Health::Nolb),
            Just(Health::NoCheck)
        ];
        (
            health,
            proptest::option::of((0u32..10, 1u32..10)),
            (
                "[a-z_][a-z0-9_.:-]{0,20}",
                "[a-z0-9][a-z0-9_-]{0,20}",
                "[a-z0-9.-]{1,20}",
            ),
            (
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
            ),
            proptest::option::of(0u32..=100),
            any::<u64>(),
        )
            .prop_map(
                |(health, transition, (bk, srv, node), (w, tw, sc, bsc, q), throttle, seed)| {
                    let transition = if health == Health::NoCheck {
                        None
                    } else {
                        transition
                    };
                    let state = LbState {
                        health,
                        transition,
                        backend: bk,
                        server: srv,
                        node,
                        weight: w,
                        total_weight: tw,
                        scur: sc,
                        backend_scur: bsc,
                        qcur: q,
                        throttle,
                    };
                    let mut fields = vec![
                        "address=127.0.0.1".to_owned(),
                        "port=8140".to_owned(),
                        format!("name={}/{}", state.backend, state.server),
                        format!("node={}", state.node),
                        format!("weight={w}/{tw}"),
                        format!("scur={sc}/{bsc}"),
                        format!("qcur={q}"),
                    ];
                    if let Some(t) = throttle {
                        fields.push(format!("throttle={t}%"));
                    }
                    // In any order.
                    let n = fields.len();
                    for i in 0..n {
                        let j = (seed.rotate_left(i as u32 * 7) as usize) % n;
                        fields.swap(i, j);
                    }
                    (format!("{}; {}", state.word(), fields.join("; ")), state)
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Every header HAProxy can write, in any field order, reads back as written.
        #[test]
        fn reads_back_every_header_haproxy_can_write((text, state) in header()) {
            prop_assert_eq!(parse(text.as_bytes()), Ok(state));
        }

        /// Any bytes: an answer or a refusal, never a panic, and nothing over the limit read.
        #[test]
        fn any_bytes_are_read_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..700)) {
            let result = parse(&bytes);
            if bytes.len() > LIMIT {
                prop_assert_eq!(result, Err(Malformed::TooLong));
            }
        }

        /// A header without one of its required fields is refused, not misread.
        #[test]
        fn a_header_missing_a_field_is_refused((text, _) in header(), cut in 0usize..8) {
            let required = ["name=", "weight=", "scur=", "qcur="];
            let fields: Vec<&str> = text.split("; ").collect();
            let kept: Vec<&str> = fields
                .iter()
                .copied()
                .filter(|f| !f.starts_with(required[cut % required.len()]))
                .collect();
            prop_assert!(parse(kept.join("; ").as_bytes()).is_err(), "{}", kept.join("; "));
        }
    }
}
