# @summary On the load balancer: HAProxy keeps what it knew of each server across a reload or a
#   restart (a drained master stays out, a busy one keeps its agent weight).
#
# HAProxy reads a server-state file at start (`load-server-state-from-file`) but never writes
# one. This class ships the step that writes it, `pmcheck-haproxy-save-state`, and a drop-in
# for haproxy.service that runs it after the configuration check of each reload and before
# the signal, and at each stop: one file per backend under `dir`, root 0600, which
# pmcheck::haproxy's `keep_state` names in its backend. A failed save is said in the journal
# (`journalctl -u haproxy`) and the reload goes on: each server then starts from its
# configuration, as without this class (a drained master is UP until its first check). Declared
# by pmcheck::haproxy when `keep_state` is true; declare it yourself to change a parameter.
#
# @param dir
#   Where the state files go, one per backend.
# @param socket
#   HAProxy's master socket (`-S` in Debian's unit) or a stats socket at level admin.
# @param script
#   Where the save step is installed.
# @param dropin_dir
#   haproxy.service's drop-in directory; undef writes no drop-in (HAProxy not run by systemd:
#   run the script before each reload yourself).
# @param reload
#   haproxy.service's own ExecReload= commands, which the drop-in repeats with the save before
#   the last: Debian's unit by default (systemd can append to ExecReload=, not insert).
class pmcheck::server_state (
  Stdlib::Absolutepath $dir = '/var/lib/haproxy/pmcheck-state',
  Stdlib::Absolutepath $socket = '/run/haproxy-master.sock',
  Stdlib::Absolutepath $script = '/usr/local/sbin/pmcheck-haproxy-save-state',
  Optional[Stdlib::Absolutepath] $dropin_dir = '/etc/systemd/system/haproxy.service.d',
  Array[String[1], 2] $reload = ['/usr/sbin/haproxy -Ws -f $CONFIG -c -q $EXTRAOPTS', '/bin/kill -USR2 $MAINPID'],
) {
  ensure_packages(['socat'])
  file { $dir:
    ensure => directory,
    owner  => 'root',
    group  => 'root',
    mode   => '0700',
  }
  file { $script:
    ensure  => file,
    owner   => 'root',
    group   => 'root',
    mode    => '0755',
    source  => 'puppet:///modules/pmcheck/haproxy-save-state',
    require => Package['socat'],
  }
  if $dropin_dir =~ NotUndef {
    $save = "-${script} ${socket} ${dir}"
    $lines = ['ExecReload='] + ($reload[0, -2] + [$save, $reload[-1]]).map |$c| { "ExecReload=${c}" } + ["ExecStop=${save}"]
    file { $dropin_dir:
      ensure => directory,
    }
    file { "${dropin_dir}/pmcheck-server-state.conf":
      ensure  => file,
      mode    => '0644',
      content => @("DROPIN"),
        # Managed by Puppet (class pmcheck::server_state): saves HAProxy's server state
        # before each reload and at each stop.
        [Service]
        ${lines.join("\n")}
        | DROPIN
      require => File[$script],
      notify  => Exec['pmcheck: systemctl daemon-reload for haproxy.service'],
    }
    exec { 'pmcheck: systemctl daemon-reload for haproxy.service':
      command     => 'systemctl daemon-reload',
      onlyif      => 'test -d /run/systemd/system',
      path        => ['/usr/bin', '/bin'],
      refreshonly => true,
    }
  }
}
