//! `--allow` networks: an address with an optional prefix length (`10.0.0.0/8`, `2001:db8::/32`,
//! `192.0.2.7`). Checked at accept, before a byte is read, against the peer's address with an
//! IPv4-mapped IPv6 address (`::ffff:10.0.0.5`, from a dual-stack socket) taken as IPv4.

use std::net::IpAddr;

use ipnet::IpNet;

/// A network for clap: a bare address is that one host, and host bits are cleared
/// (`10.1.2.3/8` is `10.0.0.0/8`), as HAProxy's ACLs do.
pub fn parse_network(text: &str) -> Result<IpNet, String> {
    let (addr, prefix) = (text.split_once('/')).map_or((text, None), |(a, p)| (a, Some(p)));
    let network = addr
        .trim_matches(['[', ']'])
        .parse::<IpAddr>()
        .map_err(|_| {
            format!(
                "{addr:?} is not an IP address; write a network such as 10.0.0.0/8, \
                 2001:db8::/32 or 192.0.2.7"
            )
        })?
        .to_canonical();
    let width = if network.is_ipv4() { 32 } else { 128 };
    // An IPv4-mapped network (`::ffff:10.0.0.0/104`) is its IPv4 network: a prefix of 96 or
    // more is counted in IPv6 bits, one of 32 or less in IPv4 bits.
    let mapped = |p: u8| match p {
        96..=128 if width == 32 => Some(p - 96),
        33..=95 if width == 32 => None,
        _ => Some(p),
    };
    let prefix = match prefix {
        None => width,
        Some(p) => p
            .parse::<u8>()
            .ok()
            .and_then(mapped)
            .filter(|p| *p <= width)
            .ok_or_else(|| format!("prefix length /{p} must be a number from 0 to {width}"))?,
    };
    IpNet::new(network, prefix)
        .map(|net| net.trunc())
        .map_err(|e| e.to_string())
}

/// Whether `ip` may connect: always, when no network is given. An IPv6 network holds the
/// IPv4 peers whose mapped form it holds (`::/0` is everyone).
pub fn permits(allow: &[IpNet], ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    let mapped = match ip {
        IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
        v6 => v6,
    };
    allow.is_empty()
        || (allow.iter())
            .any(|net| net.contains(&ip) || (net.addr().is_ipv6() && net.contains(&mapped)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn net(text: &str) -> IpNet {
        parse_network(text).unwrap()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn within(net: &str, address: &str) -> bool {
        permits(&[self::net(net)], ip(address))
    }

    #[test]
    fn networks_contain_their_addresses_only() {
        assert!(within("10.0.0.0/8", "10.200.3.4"));
        assert!(
            within("10.0.0.0/8", "::ffff:10.0.0.5"),
            "dual-stack peers are IPv4"
        );
        assert!(!within("10.0.0.0/8", "11.0.0.1"));
        assert!(!within("10.0.0.0/8", "::1"));
        assert!(within("192.0.2.7", "192.0.2.7"));
        assert!(!within("192.0.2.7", "192.0.2.8"));
        assert!(within("2001:db8::/32", "2001:db8:1::1"));
        assert!(within("0.0.0.0/0", "203.0.113.9"));
        assert!(!within("0.0.0.0/0", "2001:db8::1"));
        assert!(within("::/0", "2001:db8::1"));
        assert!(
            within("::/0", "203.0.113.9"),
            "every IPv4 peer is mapped into ::/0"
        );
        assert!(within("::ffff:0:0/96", "203.0.113.9"));
        assert!(!within("2001:db8::/32", "203.0.113.9"));
    }

    #[test]
    fn host_bits_are_cleared_and_shown() {
        assert_eq!(net("10.1.2.3/8").to_string(), "10.0.0.0/8");
        assert_eq!(net("[::1]").to_string(), "::1/128");
        assert_eq!(net("::ffff:10.1.2.3/8").to_string(), "10.0.0.0/8");
        assert_eq!(net("::ffff:10.0.0.5/128").to_string(), "10.0.0.5/32");
        assert_eq!(net("::ffff:10.1.2.3/120").to_string(), "10.1.2.0/24");
        assert!(parse_network("::ffff:10.1.2.3/64").is_err());
    }

    #[test]
    fn bad_networks_say_what_to_write() {
        assert!(parse_network("ten/8").unwrap_err().contains("10.0.0.0/8"));
        assert!(
            parse_network("10.0.0.0/33")
                .unwrap_err()
                .contains("0 to 32")
        );
        assert!(parse_network("::/129").unwrap_err().contains("0 to 128"));
    }

    #[test]
    fn no_allowlist_permits_everyone() {
        assert!(permits(&[], ip("203.0.113.9")));
        assert!(!permits(&[net("10.0.0.0/8")], ip("203.0.113.9")));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn a_network_contains_exactly_the_addresses_sharing_its_prefix(
            a in any::<u32>(), b in any::<u32>(), prefix in 0u8..=32
        ) {
            let net = net(&format!("{}/{prefix}", std::net::Ipv4Addr::from(a)));
            let same = prefix == 0 || (a ^ b) >> (32 - u32::from(prefix)) == 0;
            prop_assert_eq!(permits(&[net], IpAddr::V4(b.into())), same);
        }

        #[test]
        fn parsing_never_panics(text in ".{0,60}") {
            let _ = parse_network(&text);
        }
    }
}
