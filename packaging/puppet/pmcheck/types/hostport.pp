# @summary Where Puppet Server listens, HOST:PORT (`--puppet-addr`): a name, an IPv4 address or
#   a bracketed IPv6 address, then a port (`127.0.0.1:8140`, `[::1]:8140`, `localhost:8140`).
type Pmcheck::HostPort = Pattern[
  /\A[A-Za-z0-9][A-Za-z0-9.-]*:\d{1,5}\z/,
  /\A\[[0-9A-Fa-f:.]+\]:\d{1,5}\z/,
]
