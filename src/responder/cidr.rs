//! `--allow` networks: an address with an optional prefix length (`10.0.0.0/8`, `2001:db8::/32`,
//! `192.0.2.7`). Checked at accept, before a byte is read, against the peer's address with an
//! IPv4-mapped IPv6 address (`::ffff:10.0.0.5`, from a dual-stack socket) taken as IPv4.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is inside this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                mask(u32::from(ip).into(), self.prefix, 32) == u32::from(net).into()
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                mask(u128::from(ip), self.prefix, 128) == u128::from(net)
            }
            _ => false,
        }
    }
}

/// Whether `ip` may connect: always, when no network is given.
pub fn permits(allow: &[Cidr], ip: IpAddr) -> bool {
    allow.is_empty() || allow.iter().any(|net| net.contains(ip))
}

fn mask(bits: u128, prefix: u8, width: u8) -> u128 {
    match width - prefix.min(width) {
        shift if shift >= 128 => 0,
        shift => bits >> shift << shift,
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let network = addr
            .trim_matches(['[', ']'])
            .parse::<IpAddr>()
            .map_err(|_| format!("{addr:?} is not an IP address; write a network such as 10.0.0.0/8, 2001:db8::/32 or 192.0.2.7"))?
            .to_canonical();
        let width = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => width,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= width)
                .ok_or_else(|| format!("prefix length /{p} must be a number from 0 to {width}"))?,
        };
        // Host bits are cleared (10.1.2.3/8 is 10.0.0.0/8), as HAProxy's ACLs do.
        let network = match network {
            IpAddr::V4(v4) => IpAddr::V4((mask(u32::from(v4).into(), prefix, 32) as u32).into()),
            IpAddr::V6(v6) => IpAddr::V6(mask(u128::from(v6), prefix, 128).into()),
        };
        Ok(Self { network, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn net(text: &str) -> Cidr {
        text.parse().unwrap()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn networks_contain_their_addresses_only() {
        let lan = net("10.0.0.0/8");
        assert!(lan.contains(ip("10.200.3.4")));
        assert!(
            lan.contains(ip("::ffff:10.0.0.5")),
            "dual-stack peers are IPv4"
        );
        assert!(!lan.contains(ip("11.0.0.1")));
        assert!(!lan.contains(ip("::1")));
        assert!(net("192.0.2.7").contains(ip("192.0.2.7")));
        assert!(!net("192.0.2.7").contains(ip("192.0.2.8")));
        assert!(net("2001:db8::/32").contains(ip("2001:db8:1::1")));
        assert!(net("0.0.0.0/0").contains(ip("203.0.113.9")));
        assert!(!net("0.0.0.0/0").contains(ip("2001:db8::1")));
        assert!(net("::/0").contains(ip("2001:db8::1")));
    }

    #[test]
    fn host_bits_are_cleared_and_shown() {
        assert_eq!(net("10.1.2.3/8").to_string(), "10.0.0.0/8");
        assert_eq!(net("[::1]").to_string(), "::1/128");
    }

    #[test]
    fn bad_networks_say_what_to_write() {
        assert!("ten/8".parse::<Cidr>().unwrap_err().contains("10.0.0.0/8"));
        assert!(
            "10.0.0.0/33"
                .parse::<Cidr>()
                .unwrap_err()
                .contains("0 to 32")
        );
        assert!("::/129".parse::<Cidr>().unwrap_err().contains("0 to 128"));
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
            let cidr: Cidr = format!("{}/{prefix}", std::net::Ipv4Addr::from(a)).parse().unwrap();
            let same = prefix == 0 || (a ^ b) >> (32 - u32::from(prefix)) == 0;
            prop_assert_eq!(cidr.contains(IpAddr::V4(b.into())), same);
        }

        #[test]
        fn parsing_never_panics(text in ".{0,60}") {
            let _ = text.parse::<Cidr>();
        }
    }
}
