# @summary One compile master as a server of an HAProxy backend: what class pmcheck exports
#   (`export_to`) through PuppetDB and pmcheck::haproxy (`collect => true`) reads back.
#
# Exported, it is only a record: pmcheck::haproxy queries PuppetDB for it, leaves out what it
# cannot use, and writes the server line itself with its own key. Declared directly (or
# collected with `<<| |>>`), it checks its fields and declares nothing.
#
# @param backend
#   The backend (pmcheck::haproxy's `backend_name`) this master joins.
# @param server
#   The server's name on its line.
# @param address
#   Its IP address.
# @param port
#   Puppet Server's port.
# @param check_port
#   pmcheck's HTTP check port.
# @param agent_port
#   pmcheck's agent check port; undef: the daemon has none.
define pmcheck::member (
  String[1] $backend,
  String[1] $server,
  String[1] $address,
  Integer $port,
  Integer $check_port,
  Optional[Integer] $agent_port = undef,
) {
  $problem = pmcheck::member_problem({
      'server'     => $server,
      'address'    => $address,
      'port'       => $port,
      'check_port' => $check_port,
      'agent_port' => $agent_port,
  })
  if $problem =~ String {
    fail("pmcheck::member ${title}: ${problem}")
  }
}
