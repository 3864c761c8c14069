# shellcheck shell=bash
# Helpers shared by scripts/e2e and scripts/demo: install the real stack (Puppet Server,
# HAProxy, xinetd) and run pieces of it by hand, as plain processes (no systemd needed).
# Source it; it defines functions only.

STACK_PYTHON=/usr/bin/python3 # Debian's python3 (the one python3-pytest installs into)
STACK_PS_JAR=/usr/share/puppetserver/puppetserver.jar
STACK_PS_CONFD=/etc/puppet/puppetserver/conf.d
STACK_PS_SERVICES=/etc/puppet/puppetserver/services.d
STACK_JAVA_ARGS=${PMCHECK_E2E_JAVA_ARGS:--Xms1g -Xmx1g -XX:TieredStopAtLevel=1 -Djruby.logger.class=com.puppetlabs.jruby_utils.jruby.Slf4jLogger}

stack_loud() {
	local bar='!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!'
	printf '\n%s\n!!! %s\n%s\n\n' "$bar" "$*" "$bar" >&2
}

# Which of the packages named are not installed (dpkg's view).
stack_missing_packages() {
	local p missing=()
	for p in "$@"; do
		dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
	done
	echo "${missing[*]}"
}

# Install the packages named, when missing. apt-get update only when the install needs it
# (no package lists yet, or the first attempt failed). Returns 1 when it cannot install.
stack_install() {
	local missing
	missing=$(stack_missing_packages "$@")
	[[ -z $missing ]] && return 0
	if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
		echo "cannot install ($missing): needs root and apt-get" >&2
		return 1
	fi
	echo "+ apt-get install -y --no-install-recommends $missing" >&2
	export DEBIAN_FRONTEND=noninteractive
	# wait for another apt/dpkg (unattended-upgrades, a parallel job) instead of failing at once
	local lock=(-o DPkg::Lock::Timeout=300)
	# shellcheck disable=SC2086 # word splitting of the package list is intended
	if compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null &&
		apt-get "${lock[@]}" install -y --no-install-recommends $missing; then
		return 0
	fi
	echo "+ apt-get update (the package lists are missing or stale)" >&2
	apt-get "${lock[@]}" update || return 1
	# shellcheck disable=SC2086
	apt-get "${lock[@]}" install -y --no-install-recommends $missing
}

# A TCP port on 127.0.0.1 that was free a moment ago.
stack_free_port() {
	"$STACK_PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Does anything accept connections on 127.0.0.1:PORT?
stack_port_open() {
	"$STACK_PYTHON" -c 'import socket,sys; socket.create_connection(("127.0.0.1",int(sys.argv[1])),timeout=1)' "$1" 2>/dev/null
}

# puppet's own view of a setting, as Puppet Server sees it
stack_puppet_setting() {
	puppet config print "$1" --section server 2>/dev/null
}

# stack_puppetserver_start WORKDIR: start Puppet Server on 127.0.0.1:8140 as user puppet with a
# copy of the package's conf.d (only ssl-host and server-run-dir changed); sets STACK_PS_PID.
# Does not wait: see stack_puppetserver_wait.
stack_puppetserver_start() {
	local dir=$1
	mkdir -p "$dir"
	chmod 755 "$dir"
	rm -rf "$dir/conf.d"
	cp -r "$STACK_PS_CONFD" "$dir/conf.d"
	sed -i -E 's/^([[:space:]]*ssl-host[[:space:]]*:).*/\1 127.0.0.1/' "$dir/conf.d/webserver.conf"
	sed -i -E "s#^([[:space:]]*server-run-dir[[:space:]]*:).*#\1 $dir/run#" "$dir/conf.d/puppetserver.conf"
	chmod -R a+rX "$dir/conf.d"
	install -d -o puppet -g puppet -m 755 "$dir/run"
	printf 0 >"$dir/run/restart"
	chown puppet:puppet "$dir/run/restart"
	# shellcheck disable=SC2086 # JAVA_ARGS is a list of words
	setsid setpriv --reuid=puppet --regid=puppet --init-groups -- \
		env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/var/lib/puppet USER=puppet LANG="${LANG:-C.UTF-8}" \
		java $STACK_JAVA_ARGS -Djruby.lib=/usr/share/jruby/lib -XX:+CrashOnOutOfMemoryError \
		-jar "$STACK_PS_JAR" --config "$dir/conf.d" --bootstrap-config "$STACK_PS_SERVICES" \
		--restart-file "$dir/run/restart" </dev/null >>"$dir/puppetserver.log" 2>&1 &
	# shellcheck disable=SC2034 # read by the caller
	STACK_PS_PID=$!
}

# stack_puppetserver_wait DIR PID TIMEOUT: until the restart file says 1 and
# /status/v1/simple answers `running` over verified TLS; fails when the process dies.
stack_puppetserver_wait() {
	local dir=$1 pid=$2 timeout=${3:-300} certname cacert start=$SECONDS
	certname=$(stack_puppet_setting certname)
	while ((SECONDS - start < timeout)); do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "Puppet Server (pid $pid) died; last lines of $dir/puppetserver.log:" >&2
			tail -n 30 "$dir/puppetserver.log" >&2
			return 1
		fi
		cacert=$(stack_puppet_setting localcacert)
		if [[ $(head -c1 "$dir/run/restart" 2>/dev/null) == 1 ]] && [[ -r $cacert ]] &&
			[[ $(curl -s --max-time 5 --cacert "$cacert" --resolve "$certname:8140:127.0.0.1" \
				"https://$certname:8140/status/v1/simple" 2>/dev/null) == running ]]; then
			return 0
		fi
		sleep 1
	done
	echo "Puppet Server not ready after ${timeout}s" >&2
	return 1
}

# stack_stop PID [NAME]: SIGTERM the process group we started with setsid (pgid = pid), wait,
# then SIGKILL what is left. Only ever PIDs this script started.
stack_stop() {
	local pid=$1 name=${2:-process} i
	[[ -n $pid ]] || return 0
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 600; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		echo "$name (pid $pid) ignored SIGTERM for 60 s: SIGKILL" >&2
	fi
	kill -KILL -- "-$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

# stack_render_haproxy SHIPPED_CFG FRONT_PORT CHECK_PORT ADMIN_SOCKET: print a loopback-only
# HAProxy config: a global section with an admin socket, then the shipped file with every
# `bind` on 127.0.0.1:FRONT_PORT and every server on 127.0.0.1:8140 checked on CHECK_PORT.
stack_render_haproxy() {
	local shipped=$1 front=$2 check=$3 sock=$4
	cat <<EOF
global
    stats socket $sock mode 600 level admin
    log stderr format raw local0 info

defaults
    log global
    option log-health-checks
    timeout connect 2s
    timeout client 1m
    timeout server 1m

# ---- $shipped, with addresses and ports for this machine
EOF
	sed -E \
		-e "s/^([[:space:]]*bind[[:space:]]+)[^[:space:]]+/\\1127.0.0.1:$front/" \
		-e "s/^([[:space:]]*server[[:space:]]+[^[:space:]]+[[:space:]]+)[^[:space:]]+/\\1127.0.0.1:8140/" \
		-e "/^[[:space:]]*server[[:space:]]/s/ port [0-9]+/ port $check/" \
		"$shipped"
}

# stack_haproxy_admin SOCKET COMMAND...: one command on HAProxy's admin socket, answer on stdout.
stack_haproxy_admin() {
	"$STACK_PYTHON" - "$@" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
s.sendall(" ".join(sys.argv[2:]).encode() + b"\n")
out = b""
while chunk := s.recv(65536):
    out += chunk
sys.stdout.write(out.decode(errors="replace"))
EOF
}

# stack_haproxy_view SOCKET BACKEND: HAProxy's view of the backend's servers, one line each:
# status, last check (status/code/text) from `show stat`, op/admin state from `show servers state`.
stack_haproxy_view() {
	local sock=$1 backend=$2 code
	code=$(
		cat <<'EOF'
import csv, io, sys
stat, state = sys.stdin.read().split("@@@\n")
backend = sys.argv[1]
rows = [r for r in csv.DictReader(io.StringIO(stat[2:]))
        if r["pxname"] == backend and r["svname"] not in ("FRONTEND", "BACKEND")]
lines = [l for l in state.splitlines() if l.strip()]
names = next(l for l in lines if l.startswith("# "))[2:].split()
states = [dict(zip(names, l.split())) for l in lines if not l.startswith("#") and len(l.split()) > 5]
by_name = {d["srv_name"]: d for d in states}
for r in rows:
    s = by_name.get(r["svname"], {})
    print("  %s/%-10s status=%-5s check=%s/%s %-28s op_state=%s admin_state=%s" % (
        backend, r["svname"], r["status"], r["check_status"], r["check_code"] or "-",
        '"%s"' % r["last_chk"], s.get("srv_op_state"), s.get("srv_admin_state")))
EOF
	)
	{
		stack_haproxy_admin "$sock" show stat
		echo "@@@"
		stack_haproxy_admin "$sock" show servers state "$backend"
	} | "$STACK_PYTHON" -c "$code" "$backend"
}

# stack_haproxy_statuses SOCKET BACKEND: `status check_status` of each server, one per line:
# `UP L7OK`, `DOWN L7STS`, `UP 2/3 L7STS` while a transition is under way... (the `* ` that
# marks a check in progress is dropped).
stack_haproxy_statuses() {
	local code
	code=$(
		cat <<'EOF'
import csv, io, sys
t = sys.stdin.read()
print("\n".join(r["status"] + " " + r["check_status"].lstrip("* ") for r in csv.DictReader(io.StringIO(t[2:]))
               if r["pxname"] == sys.argv[1] and r["svname"] not in ("FRONTEND", "BACKEND")))
EOF
	)
	stack_haproxy_admin "$1" show stat | "$STACK_PYTHON" -c "$code" "$2"
}
