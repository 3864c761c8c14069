# @summary A network for `--allow`: an IPv4 or IPv6 address with an optional prefix length
#   (`192.0.2.10/32`, `10.0.0.0/8`, `2001:db8::/32`, `192.0.2.7`).
type Pmcheck::Cidr = Variant[
  Stdlib::IP::Address::V4::CIDR,
  Stdlib::IP::Address::V4::Nosubnet,
  Stdlib::IP::Address::V6::CIDR,
  Stdlib::IP::Address::V6::Nosubnet,
]
