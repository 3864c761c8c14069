# @summary On the load balancer: an HAProxy frontend for Puppet agents and a backend of
#   compile masters, each health-checked by its pmcheck (HTTP check on 9200, agent check on 9201).
#
# The same frontend and backend as the package's example
# (/usr/share/doc/pmcheck/examples/haproxy/pmcheck.cfg), built with puppetlabs-haproxy's
# haproxy::frontend, haproxy::backend and haproxy::balancermember. Everything is `mode tcp`:
# agents' mutual TLS passes through untouched. Declare `class { 'haproxy': }` yourself (its
# global and defaults sections are yours). The frontend is named after the title and the
# backend "${title}_compilers", unless `frontend_name` and `backend_name` say otherwise. A
# define rather than a class: one load balancer may front several pools (compile masters, a
# CA) on different ports, or write the same sections into several instances.
#
# The compile masters need pmcheck's packaged settings (class pmcheck's defaults): the agent
# check on 9201 and 404 for drains, which `http-check disable-on-404` shows as NOLB.
# `http-check send-state` tells pmcheck what HAProxy does with each server, which
# `pmcheck drain --wait` waits for and `pmcheck drain` reads to refuse draining the last one.
#
# @example
#   class { 'haproxy': }
#   pmcheck::haproxy { 'puppetserver':
#     compile_masters => ['compile01.example.com', 'compile02.example.com'],
#   }
#
# @param compile_masters
#   The compile masters: an Array of host names (each is both the server's name and its
#   address), or a Hash of server name => address (name or IP). May be empty with `collect`.
# @param collect
#   Also the compile masters that joined by themselves (class pmcheck's `export_to` naming
#   this backend), read from PuppetDB with `puppetdb_query` (puppetdb-termini): only active
#   nodes' latest catalogs, so a master deactivated in PuppetDB leaves at once. A member
#   HAProxy would reject (pmcheck::member_problem), one named as a server of
#   `compile_masters`, or a second of one name is left out with a warning, never a duplicate
#   that fails this catalog. Each uses the ports it exported, and this backend's other settings.
# @param keep_state
#   HAProxy keeps each server's state across a reload or a restart (class
#   pmcheck::server_state saves it, this backend loads it: `load-server-state-from-file local`):
#   a drained master stays out, a busy one keeps its weight. On HAProxy 3.1 and later (the fact
#   haproxy_version), a server it has no state of (a master that just joined) also starts down
#   (`init-state down`) and enters at its first healthy check. Default: `collect`.
# @param puppet_port
#   Puppet Server's port on the compile masters.
# @param frontend
#   Whether to declare the frontend; false for a backend only, used by a frontend of yours.
# @param bind_address
#   Address of the frontend's bind line; '' (the default) is every address.
# @param frontend_port
#   Port the agents connect to.
# @param frontend_name
#   Name of the frontend section. Default: the title.
# @param backend_name
#   Name of the backend section. Default: "${title}_compilers".
# @param check_port
#   pmcheck's HTTP check port on each compile master (PMCHECK_LISTEN).
# @param agent_port
#   pmcheck's agent check port (PMCHECK_AGENT_LISTEN); undef leaves the agent check out.
# @param inter
#   Interval of the HTTP check.
# @param rise
#   Successful checks in a row that put a server back.
# @param fall
#   Failed checks in a row that take a server out.
# @param agent_inter
#   Interval of the agent check.
# @param weight
#   Configured weight of each server: the agent's percentages are of this (100: they count).
# @param timeout_client
#   Frontend's client timeout: a catalog compile may take minutes.
# @param timeout_connect
#   Backend's connect timeout.
# @param timeout_server
#   Backend's server timeout.
# @param timeout_check
#   Backend's check timeout: pmcheck answers at once, a slow answer is a failure.
# @param lb_key
#   The load balancers' key (class pmcheck's `lb_key` on the compile masters): sent by the HTTP
#   check (`http-check send hdr X-Pmcheck-Key`) and the agent check (`agent-send`), so that
#   pmcheck believes what they say of HAProxy's view. Default: none (`pmcheck status` then shows
#   this load balancer as UNVERIFIED).
# @param instance
#   The puppetlabs-haproxy instance ('haproxy': the class haproxy).
# @param config_file
#   HAProxy configuration file to write the sections into. Default: the instance's.
define pmcheck::haproxy (
  Variant[Array[String[1]], Hash[String[1], String[1]]] $compile_masters = [],
  Boolean $collect = false,
  Boolean $keep_state = $collect,
  Stdlib::Port $puppet_port = 8140,
  Boolean $frontend = true,
  String $bind_address = '',
  Stdlib::Port $frontend_port = 8140,
  String[1] $frontend_name = $title,
  Pattern[/\A[A-Za-z0-9_.:-]+\z/] $backend_name = "${title}_compilers",
  Stdlib::Port $check_port = 9200,
  Optional[Stdlib::Port] $agent_port = 9201,
  Pmcheck::Duration $inter = '2s',
  Integer[1] $rise = 3,
  Integer[1] $fall = 3,
  Pmcheck::Duration $agent_inter = '2s',
  Integer[1, 256] $weight = 100,
  Pmcheck::Duration $timeout_client = '10m',
  Pmcheck::Duration $timeout_connect = '5s',
  Pmcheck::Duration $timeout_server = '10m',
  Pmcheck::Duration $timeout_check = '2s',
  Optional[Sensitive[Pattern[/\A[A-Za-z0-9._~+\/=-]{32,128}\z/]]] $lb_key = undef,
  String[1] $instance = 'haproxy',
  Optional[Stdlib::Absolutepath] $config_file = undef,
) {
  if $frontend {
    haproxy::frontend { $title:
      section_name     => $frontend_name,
      mode             => 'tcp',
      bind             => { "${bind_address}:${frontend_port}" => [] },
      collect_exported => false,
      instance         => $instance,
      config_file      => $config_file,
      options          => [
        { 'option' => 'tcplog' },
        { 'timeout' => "client ${timeout_client}" },
        { 'default_backend' => $backend_name },
      ],
    }
  }

  $key_header = $lb_key.then |$key| { ["send hdr X-Pmcheck-Key \"${key.unwrap}\""] }.lest || { [] }

  if $keep_state {
    include pmcheck::server_state
    $state_options = [
      { 'load-server-state-from-file' => 'local' },
      { 'server-state-file-name' => "${pmcheck::server_state::dir}/${backend_name}" },
    ]
  } else {
    $state_options = []
  }

  # Resource titles come from this define's title, so that two of them may write sections of
  # the same names into two instances.
  haproxy::backend { "${title} backend":
    section_name     => $backend_name,
    mode             => 'tcp',
    collect_exported => false,
    instance         => $instance,
    config_file      => $config_file,
    # An Array keeps this order (a Hash would be sorted by option name).
    options          => [
      { 'balance' => 'leastconn' },
      { 'option' => 'httpchk' },
      { 'http-check' => ['disable-on-404', 'send-state'] + $key_header },
      # A connect refused before the checks act is retried on another server.
      { 'retries' => '3' },
      { 'option' => 'redispatch 1' },
      { 'timeout' => ["connect ${timeout_connect}", "server ${timeout_server}", "check ${timeout_check}"] },
    ] + $state_options,
  }

  $static = $compile_masters ? {
    Hash    => $compile_masters,
    default => Hash($compile_masters.map |$host| { [$host, $host] }),
  }
  # The members compile masters exported to this backend, first by certname.
  $exported = $collect ? {
    true    => puppetdb_query(@("PQL"/L)
      resources[certname, parameters] { type = 'Pmcheck::Member' and exported = true \
      and parameters.backend = '${backend_name}' order by certname }
      | PQL
    ),
    default => [],
  }
  $collected = $exported.reduce({}) |$kept, $row| {
    $m = $row['parameters']
    $why = pmcheck::member_problem($m).lest || {
      if $m['server'] in $static {
        'compile_masters has a server of that name'
      } elsif $m['server'] in $kept {
        "${kept[$m['server']]['certname']} exported a member of that name first"
      }
    }
    if $why =~ String {
      warning("pmcheck::haproxy ${title}: left out the member ${m['server']} that ${row['certname']} exported to ${backend_name}: ${why}")
      $kept
    } else {
      $kept + { $m['server'] => $m + { 'certname' => $row['certname'] } }
    }
  }
  if $static.empty and $collected.empty and !$collect {
    fail("pmcheck::haproxy ${title}: no compile_masters, and collect is false: ${backend_name} would have no server")
  }
  # Without this backend's agent check (agent_port undef), no server has one, whatever it exported.
  $servers = ($static.map |$server, $address| {
    [$server, { 'address' => $address, 'port' => $puppet_port, 'check_port' => $check_port, 'agent_port' => $agent_port }]
  }.convert_to(Hash) + $collected).map |$server, $member| {
    [$server, $member + { 'agent_port' => $agent_port.then |$_| { $member['agent_port'] } }]
  }.convert_to(Hash)
  $init_state = ($keep_state and versioncmp(String($facts['haproxy_version']), '3.1') >= 0) ? {
    true    => ' init-state down',
    default => '',
  }
  # The ports of each server line, which the save step compares with the state it saves:
  # HAProxy restores a server's ports from its state file over the configuration (its address
  # it takes from the configuration), so a master exported anew with other ports would keep its
  # old ones. Written before the backend, whose change reloads HAProxy. (Two instances writing
  # a backend of one name share its state file and this list: the first declared writes it.)
  if $keep_state {
    $ports_list = "${pmcheck::server_state::dir}/${backend_name}.ports"
    unless defined(File[$ports_list]) {
      file { $ports_list:
        ensure  => file,
        owner   => 'root',
        group   => 'root',
        mode    => '0600',
        content => $servers.map |$server, $m| {
          "${server} ${m['port']} ${m['check_port']} ${m['agent_port'].lest || { 0 }}\n"
        }.join(''),
        before  => Haproxy::Backend["${title} backend"],
      }
    }
  }
  $servers.each |$server, $member| {
    # The agent check names its server line (BACKEND/SERVER) and sends the key: a drain is held
    # or takes effect per server line.
    $agent_send = $lb_key.then |$key| {
      " agent-send \"${backend_name}/${server} ${key.unwrap}\\n\""
    }.lest || { " agent-send \"${backend_name}/${server}\\n\"" }
    $agent = $member['agent_port'].then |$port| {
      " agent-check agent-port ${port} agent-inter ${agent_inter}${agent_send}"
    }.lest || { '' }
    # One String: haproxy::balancermember sorts the words of an Array.
    $server_options = "check port ${member['check_port']} inter ${inter} rise ${rise} fall ${fall}${agent}${init_state}"
    haproxy::balancermember { "${title} ${server}":
      listening_service => $backend_name,
      server_names      => $server,
      ipaddresses       => $member['address'],
      ports             => $member['port'],
      options           => $server_options,
      weight            => $weight,
      instance          => $instance,
      config_file       => $config_file,
    }
  }
}
