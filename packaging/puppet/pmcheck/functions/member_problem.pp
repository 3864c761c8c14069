# @summary What HAProxy would reject in a balancer member (class pmcheck's export, or one
#   pmcheck::haproxy collects), or undef: the one rule both sides apply.
#
# A server name is what HAProxy's `server` line takes (letters, digits, `.`, `_`, `-`, `:`),
# the address an IP address (the line is written before anything resolves a name), the ports
# TCP ports.
#
# @param member
#   `server`, `address`, `port`, `check_port` and, optionally, `agent_port`.
# @return [Optional[String]]
#   The first field at fault and what it holds, or undef.
function pmcheck::member_problem(Hash $member) >> Optional[String] {
  $port = [Stdlib::Port, 'a TCP port']
  $rules = {
    'server'     => [Pattern[/\A[A-Za-z0-9._:-]{1,64}\z/], 'a server name HAProxy takes (letters, digits, ., _, -, :)'],
    'address'    => [Stdlib::IP::Address::Nosubnet, 'an IP address'],
    'port'       => $port,
    'check_port' => $port,
    'agent_port' => [Optional[Stdlib::Port], 'a TCP port'],
  }
  $rules.filter |$field, $rule| { $member[$field] !~ $rule[0] }.map |$field, $rule| {
    "${field} '${member[$field]}' is not ${rule[1]}"
  }[0]
}
