# shellcheck shell=sh
# pmcheck %pre: the system user the service runs as (as %sysusers_create_compat would;
# /usr/lib/sysusers.d/pmcheck.conf describes the same user for systemd-sysusers). A pmcheck
# user created earlier by hand (e.g. for the xinetd example, in group puppet) is kept.
if ! getent passwd pmcheck >/dev/null; then
  getent group pmcheck >/dev/null || groupadd -r pmcheck
  useradd -r -g pmcheck -d /var/lib/pmcheck -M -s /sbin/nologin \
    -c "pmcheck health responder" pmcheck
fi
exit 0
