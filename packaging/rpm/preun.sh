# shellcheck shell=sh
# pmcheck %preun ($1: 0 on removal, 1 or more on upgrade): on removal, stop and disable the
# service and the socket. The drain record (/var/lib/pmcheck) stays: RPM has no purge;
# delete it by hand if the node is gone for good.
if [ "$1" -eq 0 ]; then
  # The drain-on-stop helper's stop drains nothing while Puppet Server keeps running.
  systemctl --no-reload disable --now pmcheck-drain-on-stop@puppetserver.service \
    pmcheck.socket pmcheck.service >/dev/null 2>&1 || :
fi
exit 0
