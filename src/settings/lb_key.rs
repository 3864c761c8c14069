//! A line of the load balancers' key file (`--lb-key-file`): a key, refused unless it holds
//! [`STRENGTH`] bits and none of the characters HAProxy's configuration would expand or split,
//! then the addresses allowed to send it ([`crate::settings::lb_proof`] judges the polls).

use ipnet::IpNet;

use crate::settings::allow;

/// The shortest key: 128 bits in hex.
pub const SHORTEST: usize = 32;
/// The fewest bits a key must hold, by its length and the alphabet it is written in.
pub const STRENGTH: f64 = 128.0;
/// The longest key: HAProxy sends it in one check buffer with everything else.
pub const LONGEST: usize = 128;
/// The widest IPv4 network a key is bound to without a warning: a site's load balancer subnet.
pub const WIDEST_V4: u8 = 24;
/// The widest IPv6 network a key is bound to without a warning: one subnet.
pub const WIDEST_V6: u8 = 64;
/// The packaged HAProxy example's placeholder, which everybody can read.
pub const PLACEHOLDER: &str = "CHANGE-ME";

/// One line of the key file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Key {
    pub(crate) secret: Box<[u8]>,
    /// Its line, from 1.
    pub(crate) line: usize,
    /// The first line holding the same key: a key on two lines is one key, sent from the
    /// addresses of both.
    pub(crate) first: usize,
    /// The addresses that may send it; none: any.
    pub(crate) from: Vec<IpNet>,
}

/// Wider than a key should be bound to.
pub(crate) fn wide(net: &IpNet) -> bool {
    net.prefix_len()
        < match net {
            IpNet::V4(_) => WIDEST_V4,
            IpNet::V6(_) => WIDEST_V6,
        }
}

/// The keys of a key file, or the line at fault and why.
pub(crate) fn parse_keys(text: &str) -> Result<Vec<Key>, (usize, String)> {
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let (line, _) = line.split_once('#').unwrap_or((line, ""));
        let mut words = line.split_whitespace();
        let Some(key) = words.next() else {
            continue;
        };
        let why = if key.contains(PLACEHOLDER) {
            Some("it is the example's placeholder, which everybody can read".to_owned())
        } else if let Some(c) = key.chars().find(|&c| !key_char(c)) {
            Some(format!("{c:?} is not allowed"))
        } else if !(SHORTEST..=LONGEST).contains(&key.len()) {
            Some(format!("it is {} characters long", key.len()))
        } else {
            weak(key)
        };
        if let Some(why) = why {
            return Err((i + 1, why));
        }
        let from = words
            .map(|w| {
                allow::parse_network(w).map_err(|_| {
                    // A word that could be a key is never shown: `OLDKEY NEWKEY` on one line
                    // would print the new key to whoever reads the log or `status`.
                    let why = if w.len() >= SHORTEST && w.chars().all(key_char) {
                        "a word after the key is no address and could be a second key (not shown): give one key per line, then its addresses (10.0.0.5, 10.0.0.0/29)".to_owned()
                    } else {
                        format!("{w:?} is not an address or a network (10.0.0.5, 10.0.0.0/29)")
                    };
                    (i + 1, why)
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let secret: Box<[u8]> = key.as_bytes().into();
        let first = (keys.iter())
            .find(|k: &&Key| k.secret == secret)
            .map_or(i + 1, |k| k.line);
        keys.push(Key {
            secret,
            line: i + 1,
            first,
            from,
        });
    }
    Ok(keys)
}

/// Why `key` is too weak, if it is: fewer than [`STRENGTH`] bits by its length and the
/// alphabet it is written in (hex 16 symbols, base64 64, else the 69 a key may hold), or
/// too few different characters to be random. The alphabet, not the characters a key
/// happens to use: `openssl rand -hex 16` rarely uses all 16 hex digits, and must pass.
fn weak(key: &str) -> Option<String> {
    let alphabet: f64 = if key.bytes().all(|b| b.is_ascii_hexdigit()) {
        16.0
    } else if key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"+/=-_".contains(&b))
    {
        64.0
    } else {
        69.0
    };
    let symbols = key.trim_end_matches('=').len() as f64;
    let bits = symbols * alphabet.log2();
    let distinct = key.bytes().collect::<std::collections::HashSet<u8>>().len();
    if distinct < 8 {
        Some(format!(
            "it uses {distinct} different characters: it is not random"
        ))
    } else if bits < STRENGTH {
        Some(format!("it holds about {bits:.0} bits, fewer than 128"))
    } else {
        None
    }
}

/// What a key may hold: base64 and hex, and nothing HAProxy's log-format would expand (`%`)
/// or split (spaces, quotes).
fn key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._~+/=-".contains(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0123456789abcdef0123456789abcdef";

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

    /// What the README tells users to run passes; a key that is long but not random, or
    /// short for its alphabet, does not.
    #[test]
    fn a_key_must_hold_128_bits_by_its_length_and_alphabet() {
        for made in [
            "0f1e2d3c4b5a69788796a5b4c3d2e1f0", // openssl rand -hex 16
            "0f0f0f0f1e1e1e1e2d2d2d2d3c3c3c3c4b4b4b4b5a5a5a5a69696969787878ff", // -hex 32
            "q3J0bS9wbWNoZWNrL2tleS9iYXNlNjQvMzJieXRlcz0=", // -base64 32
        ] {
            assert_eq!(weak(made), None, "{made}");
        }
        assert_eq!(
            parse_keys(&format!("{}\n", "a".repeat(32))).unwrap_err(),
            (1, "it uses 1 different characters: it is not random".into())
        );
        let hex_short_alphabet = "0123456789abcdef0123456789abcdef";
        assert_eq!(weak(hex_short_alphabet), None);
        assert_eq!(
            weak("0123456789abcdef0123456789abcde"),
            Some("it holds about 124 bits, fewer than 128".into())
        );
    }
}
