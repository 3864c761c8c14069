# shellcheck shell=sh
# pmcheck %post ($1: 1 on installation, 2 or more on upgrade): create the drain record's
# directory, enable pmcheck.service and start it on installation. pmcheck.socket is optional
# and left as the administrator set it. Upgrades restart the service in %postun.
# Group-writable: members of the service's group may drain without root. A directory an
# earlier version made 0755 is opened to the group; any other mode is the administrator's.
if [ ! -d /var/lib/pmcheck ]; then
  install -d -m 0775 -o pmcheck -g "$(id -gn pmcheck)" /var/lib/pmcheck
elif [ "$(stat -c %a /var/lib/pmcheck)" = 755 ]; then
  chmod 0775 /var/lib/pmcheck
fi
# Where the load balancers' key goes: readable by root and the service's group only.
[ -d /etc/pmcheck ] || install -d -m 0750 -o root -g "$(id -gn pmcheck)" /etc/pmcheck
# Drain on every stop of Puppet Server (PMCHECK_DRAIN_ON_STOP=no turns it off).
drain_on_stop=pmcheck-drain-on-stop@puppetserver.service
if [ "$1" -eq 1 ]; then
  systemctl --no-reload enable pmcheck.service "$drain_on_stop" >/dev/null 2>&1 || :
fi
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || :
  if [ "$1" -eq 1 ]; then
    systemctl start pmcheck.service >/dev/null 2>&1 || :
  fi
  # Active beside a running Puppet Server, or its next stop would not be drained; restarted
  # on upgrades, so the new binary guards the stops (a stop of the helper alone drains nothing).
  if systemctl --quiet is-enabled "$drain_on_stop" 2>/dev/null &&
    systemctl --quiet is-active puppetserver.service 2>/dev/null; then
    systemctl restart "$drain_on_stop" >/dev/null 2>&1 || :
  fi
else
  # A container or chroot: the unit is installed and enabled, but nothing started it.
  echo "pmcheck: systemd is not running here, so pmcheck.service was installed but not" \
    "(re)started: start it once systemd runs, or run pmcheck serve with the settings of" \
    "/etc/sysconfig/pmcheck" >&2
fi
exit 0
