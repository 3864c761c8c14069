# @summary Installs pmcheck on a Puppet Server compile master, writes its settings file and
#   runs its service.
#
# The settings file is /etc/default/pmcheck (Debian family) or /etc/sysconfig/pmcheck (RedHat
# family), read by pmcheck.service through EnvironmentFile=. Each setting parameter is one
# `pmcheck serve` option, written as its `PMCHECK_*` variable; `undef` leaves the variable
# unset (a commented-out line), so pmcheck uses its built-in default. The defaults here are
# exactly the package's own file: everything unset but the agent check on [::]:9201 and 404
# for drains, which the shipped HAProxy backend (pmcheck::haproxy) expects.
#
# @example On a compile master, from the package repository
#   class { 'pmcheck':
#     allow => ['192.0.2.10/32', '192.0.2.11/32', '127.0.0.1/32'],
#   }
#
# @example From a package file, without systemd (containers, chroots)
#   class { 'pmcheck':
#     package_source => '/tmp/pmcheck_0.1.0-1_amd64.deb',
#     manage_service => false,
#   }
#
# @param package_ensure
#   `installed`, `latest`, a version, `absent` or `purged`. With `absent` or `purged` the
#   settings file is removed and the service is not managed.
# @param package_source
#   Path of a local .deb (Debian family, installed with the dpkg provider) or .rpm (RedHat
#   family, rpm provider). `undef`: the package `pmcheck` from the configured repositories.
# @param manage_service
#   Whether to manage the service pmcheck. Turn it off where there is no systemd.
# @param service_ensure
#   `running` or `stopped`.
# @param service_enable
#   Whether pmcheck.service starts at boot.
# @param listen
#   PMCHECK_LISTEN (`--listen`). Default: `[::]:9200`, or `0.0.0.0:9200` without IPv6.
# @param allow
#   PMCHECK_ALLOW (`--allow`): networks allowed to poll. Default: from anywhere. List the
#   load balancers (and 127.0.0.1/32 for the operator's commands): then no other host can
#   crowd them out of the pollers `pmcheck drain --wait` waits for.
# @param lb_key
#   The load balancers' key (`openssl rand -hex 32`, the same as pmcheck::haproxy's `lb_key`):
#   written to `lb_key_file` (root:pmcheck 0640) and set as PMCHECK_LB_KEY_FILE, so that only
#   checks that send it count as a load balancer's word for `drain --wait`, `cycle`, the
#   last-server guard and `status`. Default: none (see `lb_address`).
# @param lb_key_addresses
#   The load balancers' addresses (`10.0.0.5`, or networks) the key is bound to, written after
#   it on its line: a key captured and replayed from any other address proves nothing. Without
#   them the key is accepted from anywhere, which pmcheck warns of. Needs `lb_key`.
# @param lb_keys
#   One key per load balancer: the keys of the other load balancers, each with its addresses
#   (`[{ key => Sensitive('...'), addresses => ['10.0.0.6'] }]`), written after `lb_key`'s line,
#   at most 15. pmcheck tells load balancers apart by their keys, not their addresses: two
#   HAProxy processes on one host, or behind one NAT, need a key each. Needs `lb_key`. A
#   changed key file is read at a reload of pmcheck (keys rotate without a restart).
# @param lb_key_file
#   Where `lb_key` is written. The default's directory, /etc/pmcheck, is managed too (root:pmcheck
#   0750); another file's directory must exist.
# @param lb_address
#   PMCHECK_LB_ADDRESS (`--lb-address`): without `lb_key`, the load balancers' networks, whose
#   polls count as theirs (weaker: anything on those hosts passes). Default: none.
# @param max_connections
#   PMCHECK_MAX_CONNECTIONS (`--max-connections`). Default: 1024.
# @param max_connections_per_source
#   PMCHECK_MAX_CONNECTIONS_PER_SOURCE (`--max-connections-per-source`). Default: 256.
# @param agent_listen
#   PMCHECK_AGENT_LISTEN (`--agent-listen`): HAProxy's agent check. Packaged: `[::]:9201`;
#   `undef`: no agent check (pmcheck's built-in default).
# @param drained_status
#   PMCHECK_DRAINED_STATUS (`--drained-status`): 503 or 404. Packaged: 404, for
#   `http-check disable-on-404`; `undef`: 503 (built in).
# @param slow_start
#   PMCHECK_SLOW_START (`--slow-start`): the agent weight's ramp, `0s` for none. Default: 60s.
# @param interval
#   PMCHECK_INTERVAL (`--interval`). Default: 1s.
# @param timeout
#   PMCHECK_TIMEOUT (`--timeout`): deadline of one probe. Default: 1500ms.
# @param pause_grace
#   PMCHECK_PAUSE_GRACE (`--pause-grace`): how long a JRuby pool paused by a code deploy's lock
#   or a flush is answered OK at the floor weight; `0s`: NOTREADY at once. Default: 60s.
# @param wedged_after
#   PMCHECK_WEDGED_AFTER (`--wedged-after`): how long a JRuby pool with none free may only time
#   out or refuse its borrows before it is NOTREADY; `0s`: never. Default: 60s.
# @param puppetserver_confd
#   PMCHECK_PUPPETSERVER_CONFD (`--puppetserver-confd`): Puppet Server's conf.d (webserver.conf,
#   puppetserver.conf). Default: that of the Puppet AIO or Debian layout.
# @param code_environment
#   PMCHECK_CODE_ENVIRONMENT (`--code-environment`): the environments whose deploy record
#   (.r10k-deploy.json) is shown and exported, at most 16. Default: production.
# @param puppet_conf
#   PMCHECK_PUPPET_CONF (`--puppet-conf`). Default: the first that exists of
#   /etc/puppetlabs/puppet/puppet.conf and /etc/puppet/puppet.conf.
# @param certname
#   PMCHECK_CERTNAME (`--certname`). Default: certname from puppet.conf, else the FQDN.
# @param hostcert
#   PMCHECK_HOSTCERT (`--hostcert`). Default: hostcert from puppet.conf.
# @param hostprivkey
#   PMCHECK_HOSTPRIVKEY (`--hostprivkey`). Default: hostprivkey from puppet.conf.
# @param localcacert
#   PMCHECK_LOCALCACERT (`--localcacert`). Default: localcacert from puppet.conf.
# @param hostcrl
#   PMCHECK_HOSTCRL (`--hostcrl`): the CRL whose nextUpdate check and /metrics watch.
#   Default: ssl-crl-path of Puppet Server's webserver.conf, else hostcrl from puppet.conf.
# @param puppet_addr
#   PMCHECK_PUPPET_ADDR (`--puppet-addr`). Default: from Puppet Server's webserver.conf, else
#   127.0.0.1 and serverport from puppet.conf, else 127.0.0.1:8140.
# @param status_path
#   PMCHECK_STATUS_PATH (`--status-path`). Default: /status/v1/services/jruby-metrics.
# @param state_dir
#   PMCHECK_STATE_DIR (`--state-dir`). Default: /var/lib/pmcheck. `pmcheck drain` and
#   `undrain` do not read the settings file: give them the same `--state-dir`.
# @param drain_on_stop
#   PMCHECK_DRAIN_ON_STOP: `false` writes `no`, and stops of puppetserver.service are no longer
#   drained first (pmcheck-drain-on-stop@puppetserver.service). Default: true.
# @param stop_max_wait
#   PMCHECK_MAX_WAIT: how long a stop of Puppet Server waits for the load balancers and the
#   agents; keep it under the helper's TimeoutStopSec= (150s). Default: 120s.
# @param export_to
#   The HAProxy backend (pmcheck::haproxy's `backend_name`, `puppetserver_compilers` by
#   default) this compile master joins by itself: exported through PuppetDB as a
#   `pmcheck::member`, which pmcheck::haproxy's `collect => true` reads back. Exported only
#   once the fact `pmcheck` shows this daemon answering 200 (PuppetDB stores a catalog's exports
#   when it is compiled, before it is applied, so an unconditional export would announce a
#   master before Puppet Server or pmcheck is installed); from then on it stays a member
#   (`/etc/pmcheck/member`) whatever pmcheck answers, drained or failing: HAProxy's checks take
#   it out, not the next compile. Needs storeconfigs (PuppetDB). Default: undef, nothing exported.
# @param member_name
#   Its server name on the load balancer's line. Default: the certname.
# @param member_address
#   The IP address the load balancer reaches it at. Default: the fact networking.ip.
# @param member_port
#   Puppet Server's port, for the server line. Default: 8140.
# @param retire
#   Leave the backend: drain with `pmcheck drain --wait` and keep exporting until the drain is
#   safe to stop (the fact `pmcheck`, at the next run), then withdraw the export; the load
#   balancer's next run removes the line. Removing the class instead would withdraw the export
#   at the next compile, before anything could drain. A retiring master that is not a member
#   never joins. Default: false.
# @param log_level
#   RUST_LOG: error, warn, info or debug (tracing EnvFilter syntax). Default: info.
class pmcheck (
  String[1] $package_ensure = 'installed',
  Optional[Stdlib::Unixpath] $package_source = undef,
  Boolean $manage_service = true,
  Stdlib::Ensure::Service $service_ensure = 'running',
  Boolean $service_enable = true,
  Optional[Array[Pmcheck::SocketAddr, 1]] $listen = undef,
  Optional[Array[Pmcheck::Cidr, 1]] $allow = undef,
  Optional[Sensitive[Pattern[/\A[A-Za-z0-9._~+\/=-]{32,128}\z/]]] $lb_key = undef,
  Optional[Array[Pmcheck::Cidr, 1]] $lb_key_addresses = undef,
  Optional[Array[Pmcheck::LbKey, 1, 15]] $lb_keys = undef,
  Stdlib::Unixpath $lb_key_file = '/etc/pmcheck/lb-key',
  Optional[Array[Pmcheck::Cidr, 1]] $lb_address = undef,
  Optional[Integer[1, 4294967295]] $max_connections = undef,
  Optional[Integer[1, 4294967295]] $max_connections_per_source = undef,
  Optional[Array[Pmcheck::SocketAddr, 1]] $agent_listen = ['[::]:9201'],
  Optional[Variant[Integer[404, 404], Integer[503, 503]]] $drained_status = 404,
  Optional[Pmcheck::DurationOrOff] $slow_start = undef,
  Optional[Pmcheck::Duration] $interval = undef,
  Optional[Pmcheck::Duration] $timeout = undef,
  Optional[Pmcheck::DurationOrOff] $pause_grace = undef,
  Optional[Pmcheck::DurationOrOff] $wedged_after = undef,
  Optional[Stdlib::Unixpath] $puppetserver_confd = undef,
  Optional[Array[Pattern[/\A[a-z0-9_]{1,64}\z/], 1, 16]] $code_environment = undef,
  Optional[Stdlib::Unixpath] $puppet_conf = undef,
  Optional[Pattern[/\A[A-Za-z0-9._-]+\z/]] $certname = undef,
  Optional[Stdlib::Unixpath] $hostcert = undef,
  Optional[Stdlib::Unixpath] $hostprivkey = undef,
  Optional[Stdlib::Unixpath] $localcacert = undef,
  Optional[Stdlib::Unixpath] $hostcrl = undef,
  Optional[Pmcheck::HostPort] $puppet_addr = undef,
  Optional[Pattern[/\A\/[^\s'"`$\\]*\z/]] $status_path = undef,
  Optional[Stdlib::Unixpath] $state_dir = undef,
  Optional[Pattern[/\A[A-Za-z0-9_:=,.\/-]+\z/]] $log_level = undef,
  Boolean $drain_on_stop = true,
  Optional[Pmcheck::Duration] $stop_max_wait = undef,
  Optional[Pattern[/\A[A-Za-z0-9_.:-]+\z/]] $export_to = undef,
  String[1] $member_name = $trusted['certname'],
  String[1] $member_address = String($facts.dig('networking', 'ip')),
  Stdlib::Port $member_port = 8140,
  Boolean $retire = false,
) {
  case $facts['os']['family'] {
    'Debian': {
      $settings_file = '/etc/default/pmcheck'
      $local_provider = 'dpkg'
    }
    'RedHat': {
      $settings_file = '/etc/sysconfig/pmcheck'
      $local_provider = 'rpm'
    }
    default: {
      fail("pmcheck: ${facts['os']['family']} is not supported (Debian and RedHat families only)")
    }
  }

  if $lb_key_addresses =~ NotUndef and $lb_key =~ Undef {
    fail('pmcheck: lb_key_addresses binds lb_key to the load balancers\' addresses: set lb_key too, or drop lb_key_addresses')
  }
  if $lb_keys =~ NotUndef and $lb_key =~ Undef {
    fail('pmcheck: lb_keys are the other load balancers\' keys, after lb_key\'s: set lb_key too, or drop lb_keys')
  }

  # Paths must stay free of whitespace and shell quoting: systemd and `. FILE` read them alike.
  [$puppet_conf, $hostcert, $hostprivkey, $localcacert, $hostcrl, $puppetserver_confd, $state_dir, $lb_key_file].each |$path| {
    if $path =~ String and $path !~ /\A[^\s'"`$\\]+\z/ {
      fail("pmcheck: ${path}: a path in the settings file cannot hold spaces, quotes, \$ or \\")
    }
  }

  # One line each, in the order of the packaged file: variable, value (undef: not set), and
  # what pmcheck uses when it is not set.
  $settings = [
    ['PMCHECK_LISTEN', $listen, '[::]:9200 (0.0.0.0:9200 without IPv6)'],
    ['PMCHECK_ALLOW', $allow, 'from anywhere'],
    ['PMCHECK_LB_KEY_FILE', $lb_key.then |$_| { $lb_key_file }, 'none'],
    ['PMCHECK_LB_ADDRESS', $lb_address, 'none'],
    ['PMCHECK_MAX_CONNECTIONS', $max_connections, '1024'],
    ['PMCHECK_MAX_CONNECTIONS_PER_SOURCE', $max_connections_per_source, '256'],
    ['PMCHECK_AGENT_LISTEN', $agent_listen, 'no agent check'],
    ['PMCHECK_DRAINED_STATUS', $drained_status, '503'],
    ['PMCHECK_SLOW_START', $slow_start, '60s'],
    ['PMCHECK_INTERVAL', $interval, '1s'],
    ['PMCHECK_TIMEOUT', $timeout, '1500ms'],
    ['PMCHECK_PUPPET_CONF', $puppet_conf, '/etc/puppetlabs/puppet/puppet.conf, else /etc/puppet/puppet.conf'],
    ['PMCHECK_CERTNAME', $certname, 'certname from puppet.conf, else the FQDN'],
    ['PMCHECK_HOSTCERT', $hostcert, 'hostcert from puppet.conf'],
    ['PMCHECK_HOSTPRIVKEY', $hostprivkey, 'hostprivkey from puppet.conf'],
    ['PMCHECK_LOCALCACERT', $localcacert, 'localcacert from puppet.conf'],
    ['PMCHECK_HOSTCRL', $hostcrl, "Puppet Server's ssl-crl-path, else hostcrl from puppet.conf"],
    ['PMCHECK_PUPPET_ADDR', $puppet_addr, "Puppet Server's webserver.conf, else 127.0.0.1:serverport"],
    ['PMCHECK_PAUSE_GRACE', $pause_grace, '60s'],
    ['PMCHECK_WEDGED_AFTER', $wedged_after, '60s'],
    ['PMCHECK_CODE_ENVIRONMENT', $code_environment, 'production'],
    ['PMCHECK_PUPPETSERVER_CONFD', $puppetserver_confd, "Puppet Server's conf.d of the AIO or Debian layout"],
    ['PMCHECK_STATUS_PATH', $status_path, '/status/v1/services/jruby-metrics'],
    ['PMCHECK_STATE_DIR', $state_dir, '/var/lib/pmcheck'],
    ['RUST_LOG', $log_level, 'info'],
    ['PMCHECK_DRAIN_ON_STOP', $drain_on_stop ? { true => undef, default => 'no' }, 'yes'],
    ['PMCHECK_MAX_WAIT', $stop_max_wait, '120s'],
  ]

  $removing = $package_ensure in ['absent', 'purged']
  $provider = $package_source ? {
    undef   => undef,
    default => $local_provider,
  }

  package { 'pmcheck':
    ensure   => $package_ensure,
    source   => $package_source,
    provider => $provider,
  }

  if $removing {
    file { $settings_file:
      ensure  => absent,
      require => Package['pmcheck'],
    }
  } else {
    file { $settings_file:
      ensure  => file,
      owner   => 'root',
      group   => 'root',
      mode    => '0644',
      content => epp('pmcheck/settings.epp', { 'settings' => $settings }),
      require => Package['pmcheck'],
    }

    if $lb_key =~ NotUndef {
      if $lb_key_file == '/etc/pmcheck/lb-key' {
        file { '/etc/pmcheck':
          ensure  => directory,
          owner   => 'root',
          group   => 'pmcheck',
          mode    => '0750',
          require => Package['pmcheck'],
          before  => File[$lb_key_file],
        }
      }
      # The key, then the addresses allowed to send it: `KEY ADDR...`, a line per load balancer.
      $more_keys = ($lb_keys.lest || { [] }).map |$more| { ([$more['key'].unwrap] + $more['addresses']).join(' ') }
      $key_line = ([([$lb_key.unwrap] + $lb_key_addresses.lest || { [] }).join(' ')] + $more_keys).join("\n")
      file { $lb_key_file:
        ensure    => file,
        owner     => 'root',
        group     => 'pmcheck',
        mode      => '0640',
        content   => Sensitive("${key_line}\n"),
        show_diff => false,
        require   => Package['pmcheck'],
      }
      $key_files = [File[$lb_key_file]]
    } else {
      $key_files = []
    }

    if $manage_service {
      service { 'pmcheck':
        ensure    => $service_ensure,
        enable    => $service_enable,
        subscribe => [Package['pmcheck'], File[$settings_file]],
      }
      # A changed key file is read at a reload: keys rotate with no restart, no check failed.
      unless $key_files.empty {
        exec { 'pmcheck: read the load balancer key file again':
          command     => 'systemctl try-reload-or-restart pmcheck.service',
          path        => ['/usr/bin', '/bin'],
          refreshonly => true,
          subscribe   => $key_files,
          require     => Service['pmcheck'],
        }
      }
    }
  }

  # Joining and leaving the load balancers' backend through PuppetDB (pmcheck::haproxy's
  # `collect`): pmcheck::member_problem is the rule the load balancer applies too.
  if $export_to =~ NotUndef and !$removing {
    $member = {
      'backend'    => $export_to,
      'server'     => $member_name,
      'address'    => $member_address,
      'port'       => $member_port,
      'check_port' => $listen.then |$l| { Integer($l[0].split(':')[-1]) }.lest || { 9200 },
      'agent_port' => $agent_listen.then |$a| { Integer($a[0].split(':')[-1]) },
    }
    $problem = pmcheck::member_problem($member)
    if $problem =~ String {
      fail("pmcheck: ${trusted['certname']} cannot join ${export_to}: ${problem}: set member_name, member_address or member_port")
    }
    # What this node's pmcheck answered when the run began (the fact pmcheck).
    $seen = $facts['pmcheck'].lest || { {} }
    # A member stays one whatever it answers; a master retiring never joins anew.
    $joined = $seen['member'] == $export_to or ($seen['status'] == 200 and !$retire)
    $left = $retire and $seen['drained'] == true and $seen['safe_to_stop'] == true
    $exporting = $joined and !$left
    if $exporting {
      @@pmcheck::member { "${export_to}/${member_name}":
        * => $member,
      }
    }
    file { '/etc/pmcheck/member':
      ensure  => if $exporting { 'file' } else { 'absent' },
      owner   => 'root',
      group   => 'root',
      mode    => '0644',
      content => "${export_to}\n",
      require => Package['pmcheck'],
    }
    if $retire and $exporting {
      $state_option = $state_dir.then |$d| { " --state-dir ${d}" }.lest || { '' }
      exec { "pmcheck: drain ${member_name} before it leaves ${export_to}":
        command => "pmcheck drain --reason 'retiring: class pmcheck, retire => true' --wait${state_option}",
        path    => ['/usr/bin', '/bin'],
        timeout => 900,
        require => Package['pmcheck'],
      }
    }
  }
}
