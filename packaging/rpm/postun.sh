# shellcheck shell=sh
# pmcheck %postun ($1: 0 on removal, 1 or more on upgrade): on upgrade, restart the running
# service so the new binary answers. An active pmcheck.socket keeps listening meanwhile.
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || :
  if [ "$1" -ge 1 ]; then
    systemctl try-restart pmcheck.service >/dev/null 2>&1 || :
  fi
fi
exit 0
