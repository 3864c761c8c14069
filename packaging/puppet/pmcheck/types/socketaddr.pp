# @summary An address to listen on, as pmcheck's `--listen` and `--agent-listen` take it:
#   an IP address and a port, IPv6 in brackets (`0.0.0.0:9200`, `[::]:9201`, `127.0.0.1:9200`).
type Pmcheck::SocketAddr = Pattern[
  /\A(\d{1,3}\.){3}\d{1,3}:\d{1,5}\z/,
  /\A\[[0-9A-Fa-f:.]+\]:\d{1,5}\z/,
]
