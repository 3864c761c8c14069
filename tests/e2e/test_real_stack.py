"""pmcheck against the real stack: Puppet Server, HAProxy and xinetd (Debian 12's 7.9 and 2.6, or
Debian 13's 8.7 and 3.0: e2e_stack/versions.py).

Run through scripts/e2e (as root).  Every number HAProxy-related is read from its
admin socket (`show stat`, `show servers state`), never inferred.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import time

import pytest

import e2e_stack as st
from conftest import record

# CI runs it on Debian 13, where one Puppet Server serves all of these (conftest.py).
pytestmark = pytest.mark.ci_on("debian13")

# the short check timing used where the suite does not measure the shipped one
FAST = "inter 300ms rise 2 fall 2"


def parse_config(out: str) -> dict[str, tuple[str, str]]:
    """`pmcheck config`: one line per setting, `name  value  (source)`."""
    table = {}
    for line in out.splitlines():
        if not line.strip():
            continue
        m = re.match(r"^(\S+)\s+(.*?)\s+\((.+)\)\s*$", line)
        assert m, f"`pmcheck config` line without `name value (source)`: {line!r}\n{out}"
        table[m[1]] = (m[2], m[3])
    return table


def start_shipped_haproxy(haproxy, shipped_haproxy, check_port: int, timing: str | None, name: str):
    front = st.free_port()
    cfg, backend, servers = st.render_haproxy(shipped_haproxy, front, check_port, timing=timing)
    h = haproxy(name, cfg, "packaging/haproxy/pmcheck.cfg")
    return h, front, backend, servers


def wait_all(h: st.HAProxy, backend: str, servers: list[str], want, what: str, timeout: float) -> float:
    """Wait until every server of the backend matches; returns the seconds until the last did."""
    start = time.monotonic()
    for s in servers:
        row, _ = h.wait_server(backend, s, want, what, timeout)
        print(f"[e2e] HAProxy {backend}/{s}: {st.summary(row)}")
    return time.monotonic() - start


# ---------------------------------------------------------------------------
# zero configuration


@pytest.mark.usefixtures("puppetserver")
def test_zero_configuration_answers_ok(pmcheck, puppet_cfg, testdir):
    """Only --listen and --state-dir: pmcheck finds puppet.conf, certname and Debian's ssldir."""
    # (pmcheck.run/serve give children our environment minus every PMCHECK_* variable)
    conf = "/etc/puppet/puppet.conf"
    assert os.path.exists(conf), "the Debian puppet package ships /etc/puppet/puppet.conf"
    assert not os.path.exists("/etc/puppetlabs/puppet/puppet.conf"), (
        "an AIO puppet.conf exists and would win; this test is about the Debian layout"
    )

    # `pmcheck config` shows each value and where it came from
    cp = pmcheck.run("config")
    assert cp.returncode == 0, cp.stderr
    table = parse_config(cp.stdout)
    want = {
        "puppet-conf": conf,
        "certname": puppet_cfg.certname,
        "ssldir": puppet_cfg.ssldir,
        "hostcert": puppet_cfg.hostcert,
        "hostprivkey": puppet_cfg.hostprivkey,
        "localcacert": puppet_cfg.localcacert,
        "puppet-addr": "127.0.0.1:8140",
    }
    for name, value in want.items():
        assert name in table, f"`pmcheck config` has no {name} line:\n{cp.stdout}"
        assert table[name][0] == value, f"{name}: pmcheck says {table[name][0]!r}, Puppet says {value!r}"
    # /etc/puppet/puppet.conf sets nothing: everything is a default, and says so
    for name in want:
        assert table[name][1].lower().startswith("default"), f"{name} source: {table[name][1]!r}"

    # ... and each other origin is named too: flag, environment, a puppet.conf section
    alt = testdir / "puppet.conf"
    alt.write_text(f"[main]\nssldir = {puppet_cfg.ssldir}\n[server]\nserverport = 8140\n")
    cp = pmcheck.run(
        "config", "--puppet-conf", str(alt), "--timeout", "1200ms",
        env=st.clean_env(PMCHECK_CERTNAME=puppet_cfg.certname),
    )  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    t2 = parse_config(cp.stdout)
    conf_value, conf_source = t2["puppet-conf"]
    assert conf_value == str(alt) and "command line" in conf_source, t2
    timeout_value, timeout_source = t2["timeout"]
    assert "command line" in timeout_source and timeout_value in ("1200ms", "1s 200ms", "1.2s"), t2["timeout"]
    assert "PMCHECK_CERTNAME" in t2["certname"][1], t2["certname"]
    assert str(alt) in t2["ssldir"][1] and "[main]" in t2["ssldir"][1], t2["ssldir"]
    assert t2["hostcert"][0] == puppet_cfg.hostcert, t2["hostcert"]

    # the daemon, with nothing but a listen address and a state dir
    d = pmcheck.serve(testdir / "state")
    r, took = d.wait_verdict(200, timeout=30)
    print(f"[e2e] first 200 after {took:.2f}s: {r.body.strip()}")
    assert r.body.startswith("OK"), r.body
    assert "\n" not in r.body.strip(), "the body is one line"

    j = d.get(headers={"Accept": "application/json"})
    assert j.status == 200
    assert j.headers.get("content-type", "").startswith("application/json"), j.headers
    data = j.json()
    assert data["verdict"].lower() in ("ok", "up", "healthy"), data
    assert not data["drain"], data
    assert data["probe"]["ok"] is True, data
    # the probe goes to Puppet Server's port, with the certname as the TLS name
    endpoint = str(data["probe"]["endpoint"])
    assert "8140" in endpoint and puppet_cfg.certname in endpoint, data
    assert isinstance(data["probe"]["latency_ms"], (int, float)), data

    # HAProxy's exact default check bytes, HEAD, and any path
    raw = st.raw_http(d.port, b"OPTIONS / HTTP/1.0\r\n\r\n")
    assert re.match(rb"HTTP/1\.[01] 200 ", raw), raw[:200]
    head = d.get("/anything", method="HEAD")
    assert head.status == 200 and head.body == "", head

    # one-shot check, Nagios style
    cp = pmcheck.run("check", "--state-dir", str(testdir / "state"))
    assert cp.returncode == 0, cp
    assert cp.stdout.startswith("PMCHECK OK"), cp.stdout
    assert re.search(r"\| time=\d+(\.\d+)?s", cp.stdout), cp.stdout

    cp = pmcheck.run("status", "--url", d.url)
    assert cp.returncode == 0, cp


# ---------------------------------------------------------------------------
# HAProxy's default check, with the shipped config


@pytest.mark.usefixtures("puppetserver")
@pytest.mark.every_haproxy("3.2")
@pytest.mark.parametrize("timing", ["shipped", "fast"])
def test_haproxy_check_follows_drain_and_undrain(pmcheck, haproxy, shipped_haproxy, testdir, timing):
    """packaging/haproxy/pmcheck.cfg as shipped: UP, DOWN with 503 after a drain, UP after undrain."""
    # the shipped file has the shape this test (and the issue) promises
    assert re.search(r"(?m)^\s*option\s+httpchk\s*$", shipped_haproxy), "`option httpchk` without arguments"
    assert re.search(r"(?m)^\s*balance\s+leastconn\s*$", shipped_haproxy)
    assert len(re.findall(r"(?m)^\s*mode\s+tcp\s*$", shipped_haproxy)) >= 2, (
        "frontend and backend in mode tcp"
    )
    assert re.search(
        r"(?m)^\s*server\s+\S+\s+\S+\s+check port 9200 inter 2s rise 3 fall 3"
        rf' agent-check agent-port 9201 agent-inter 2s agent-send "puppetserver_compilers/\S+ {st.LB_KEY_PLACEHOLDER}\\n" weight 100\s*$',
        shipped_haproxy,
    )
    # the http-check lines: drains (404) as NOLB, pmcheck's default 503 still fails the check;
    # HAProxy's own view of each server sent with every check, for pmcheck's waits; and the
    # load balancers' key (a placeholder to replace), the proof that the checks are HAProxy's
    assert re.findall(r"(?m)^[ \t]*http-check.*$", shipped_haproxy) == [
        "    http-check disable-on-404",
        "    http-check send-state",
        f'    http-check send hdr X-Pmcheck-Key "{st.LB_KEY_PLACEHOLDER}"',
    ]
    assert not re.search(r"(?m)^[ \t]*option[ \t]+httpchk[ \t]+[^ \t#]", shipped_haproxy)

    state = testdir / "state"
    d = pmcheck.serve(state)
    d.wait_verdict(200)
    h, _front, backend, servers = start_shipped_haproxy(
        haproxy, shipped_haproxy, d.port, None if timing == "shipped" else FAST, "lb"
    )
    up = wait_all(h, backend, servers, st.is_up_checked, "UP after a passed check (L7OK/200)", 30)
    print(f"[e2e] first passed checks after {up:.2f}s")

    reason = f"e2e check ({timing}): kernel upgrade"
    cp = pmcheck.run("drain", "--reason", reason, "--state-dir", str(state))
    assert cp.returncode == 0, cp
    t_drain = time.monotonic()
    # The daemon hears of the record through inotify (a 250 ms look besides): a second is ample.
    r, seen = d.wait_verdict(503, timeout=1)
    print(f"[e2e] pmcheck answered 503 {seen:.3f}s after `drain` returned")
    assert r.body.startswith("DRAINED"), r.body
    assert reason in r.body, r.body
    j = d.get(headers={"Accept": "application/json"}).json()
    assert j["drain"] and reason in json.dumps(j["drain"]), j

    budget = 20 if timing == "shipped" else 10
    for s in servers:
        row, _ = h.wait_server(backend, s, st.is_down_503, "DOWN with L7STS/503", budget)
        print(f"[e2e] HAProxy {backend}/{s}: {st.summary(row)}")
    react_down = time.monotonic() - t_drain
    for s in servers:
        # what an operator sees on HAProxy's stats page: the 503's reason phrase, with the reason
        last_chk = h.server(backend, s)["last_chk"]
        assert last_chk.startswith("Drained: ") and reason in last_chk, st.summary(h.server(backend, s))
    assert all(h.server(backend, s)["status"] == "DOWN" for s in servers)

    cp = pmcheck.run("undrain", "--state-dir", str(state))
    assert cp.returncode == 0, cp
    t_undrain = time.monotonic()
    d.wait_verdict(200, timeout=1)
    wait_all(h, backend, servers, st.is_up_checked, "UP again (L7OK/200)", budget)
    react_up = time.monotonic() - t_undrain

    srv = servers[0]
    rows = h.servers_state(backend)
    assert all(r["srv_op_state"] == "2" for r in rows), rows
    t = "inter 2s rise 3 fall 3 (as shipped)" if timing == "shipped" else FAST
    record(
        f"HAProxy reaction to `pmcheck drain`, {t}",
        f"{react_down:.2f}s until DOWN ({len(servers)} server lines)",
    )
    record(f"HAProxy reaction to `pmcheck undrain`, {t}", f"{react_up:.2f}s until UP")
    assert h.server(backend, srv)["chkdown"] != "0", "HAProxy counted the UP->DOWN transition"


@pytest.mark.usefixtures("puppetserver")
@pytest.mark.ci_on("debian12", "debian13")  # Debian 12: that HAProxy 2.6 refuses the keyword
@pytest.mark.every_haproxy("3.2", "3.4")
def test_init_state_down_keeps_a_fresh_server_out_until_pmcheck_says_ok(
    pmcheck, haproxy, haproxy_bin, shipped_haproxy, testdir
):
    """packaging/haproxy/pmcheck.cfg's advice for HAProxy 3.1+: with `init-state down` on its
    server lines a freshly started HAProxy sends no agent to a drained master, where without it
    the master counts UP until its first check fails (HAProxy spreads the first checks over
    `inter`). 2.6 and 3.0 refuse the keyword."""
    assert "add `init-state down` to each server line" in shipped_haproxy

    def rendered(check_port: int) -> tuple[str, str, str, list[str]]:
        cfg, backend, servers = st.render_haproxy(shipped_haproxy, st.free_port(), check_port)
        with_init, n = re.subn(r"(?m)^([ \t]*server[ \t].*\S)[ \t]*$", r"\1 init-state down", cfg)
        assert n == len(servers), with_init
        return cfg, with_init, backend, servers

    release = st.release_of(haproxy_bin)
    if release < (3, 1):
        _, with_init, _, _ = rendered(st.free_port())
        h = st.HAProxy(testdir, "init-refused", with_init, "packaging/haproxy/pmcheck.cfg + init-state down",
                       binary=haproxy_bin)  # fmt: skip
        with pytest.raises(st.StackError) as refused:
            h.validate()
        h.stop()  # never started: only its files go
        said = str(refused.value).split("--- config:")[0]
        assert "init-state" in said, said
        record(
            f"HAProxy {release[0]}.{release[1]} and `init-state down`",
            "refused by `haproxy -c`, as the file says",
        )
        return

    state = testdir / "state"
    d = pmcheck.serve(state)
    d.wait_verdict(200)
    cp = pmcheck.run("drain", "--reason", "e2e: init-state", "--state-dir", str(state))
    assert cp.returncode == 0, cp
    d.wait_verdict(503, timeout=1)
    cfg, with_init, backend, servers = rendered(d.port)
    # Without it, as shipped: a fresh HAProxy counts the drained master UP until its first
    # check fails, and sends agents there meanwhile.
    plain = haproxy("plain", cfg, "packaging/haproxy/pmcheck.cfg")
    # With it: out from the start; sampled for 7 s, over three rounds of checks (`inter 2s`).
    h = haproxy("init", with_init, "packaging/haproxy/pmcheck.cfg + init-state down")
    seen: set[str] = set()
    until = time.monotonic() + 7
    while time.monotonic() < until:
        seen |= {h.server(backend, s)["status"] for s in servers}
        time.sleep(0.1)
    # HAProxy's own count of UP -> DOWN transitions (`chkdown`): each server of the plain
    # one was UP after its start; none of the other ever was.
    went_down = {
        s: plain.wait_server(backend, s, lambda r: r["status"] == "DOWN", "DOWN", 10)[0]["chkdown"]
        for s in servers
    }
    never = {s: h.server(backend, s)["chkdown"] for s in servers}
    record(
        f"{h.label}: a fresh HAProxy and a drained master",
        f"as shipped UP first, then DOWN (chkdown {went_down}); with init-state down {sorted(seen)} for 7 s (chkdown {never})",
    )
    assert all(v != "0" for v in went_down.values()), went_down
    assert not any(v.startswith("UP") for v in seen), seen
    assert all(v == "0" for v in never.values()), never
    # Undrained, it comes in as any server that was DOWN: after `rise` passed checks.
    cp = pmcheck.run("undrain", "--state-dir", str(state))
    assert cp.returncode == 0, cp
    d.wait_verdict(200, timeout=1)
    took = wait_all(h, backend, servers, st.is_up_checked, "UP after `rise` passed checks", 15)
    record(f"{h.label} with init-state down: UP after the undrain", f"{took:.1f}s (inter 2s, rise 3)")


# ---------------------------------------------------------------------------
# Puppet Server failure


def test_stopped_puppet_server_is_down_with_its_cause(
    pmcheck, puppetserver, haproxy, shipped_haproxy, testdir
):
    """Stop Puppet Server: DOWN with `connection refused`; start it: UP again."""
    state = testdir / "state"
    d = pmcheck.serve(state)
    d.wait_verdict(200)
    h, _front, backend, servers = start_shipped_haproxy(haproxy, shipped_haproxy, d.port, FAST, "lb")
    wait_all(h, backend, servers, st.is_up_checked, "UP (L7OK/200)", 30)

    try:
        t_stop = time.monotonic()
        puppetserver.stop()
        print(f"[e2e] Puppet Server stopped in {time.monotonic() - t_stop:.1f}s")
        wait_all(h, backend, servers, st.is_down_503, "DOWN with L7STS/503 (Puppet Server stopped)", 20)
        record(
            "HAProxy reaction to Puppet Server stopping, " + FAST,
            f"{time.monotonic() - t_stop:.2f}s (incl. the stop)",
        )
        for s in servers:
            assert "down" in h.server(backend, s)["last_chk"].lower(), st.summary(h.server(backend, s))

        r = d.get()
        assert r.status == 503, r
        assert r.body.startswith("DOWN"), r.body
        assert "refused" in r.body.lower(), f"the 503 body must name the cause: {r.body!r}"
        j = d.get(headers={"Accept": "application/json"}).json()
        assert j["probe"]["ok"] is False, j
        assert "refused" in json.dumps(j).lower(), j

        cp = pmcheck.run("check", "--state-dir", str(state))
        assert cp.returncode == 2, cp
        assert "refused" in cp.stdout.lower(), cp.stdout

        t_start = time.monotonic()
        took = puppetserver.start()
        record("Puppet Server restart (after the failure)", f"{took:.1f}s")
        wait_all(h, backend, servers, st.is_up_checked, "UP again after Puppet Server restarted", 30)
        record("HAProxy back UP after Puppet Server was ready", f"{time.monotonic() - t_start - took:.2f}s")
        assert d.get().status == 200
    finally:
        if not puppetserver.running():
            puppetserver.start()  # leave it running for the tests after this one


# ---------------------------------------------------------------------------
# mutual TLS passes through HAProxy


@pytest.mark.usefixtures("puppetserver")
def test_mutual_tls_passes_through_haproxy(pmcheck, puppet_cfg, haproxy, shipped_haproxy, testdir):
    d = pmcheck.serve(testdir / "state")
    d.wait_verdict(200)
    h, front, backend, servers = start_shipped_haproxy(haproxy, shipped_haproxy, d.port, FAST, "lb")
    wait_all(h, backend, servers, st.is_up_checked, "UP (L7OK/200)", 30)

    def sessions() -> int:
        return sum(int(h.server(backend, s)["stot"] or 0) for s in servers)

    before = sessions()
    with_cert = st.tls_context(puppet_cfg.localcacert, puppet_cfg.hostcert, puppet_cfg.hostprivkey)
    r = st.https_request(front, puppet_cfg.certname, with_cert, "/puppet/v3/environments")
    print(f"[e2e] with the host certificate through HAProxy: {r.status} {r.body[:200]}")
    assert r.status == 200, r
    assert "environments" in r.json(), r.body
    sans = [v for k, v in r.peer_cert.get("subjectAltName", ()) if k == "DNS"]
    assert puppet_cfg.certname in sans, (
        f"Puppet Server's certificate, verified as {puppet_cfg.certname}: {sans}"
    )

    without = st.tls_context(puppet_cfg.localcacert)
    r = st.https_request(front, puppet_cfg.certname, without, "/puppet/v3/environments")
    print(f"[e2e] without a client certificate through HAProxy: {r.status} {r.body[:200]}")
    assert r.status == 403, r
    assert "Forbidden" in r.body

    # verification is real: the wrong name fails (Puppet's cert has no IP/localhost SAN)
    with pytest.raises(ssl.SSLCertVerificationError):
        st.https_request(front, "localhost", with_cert, "/status/v1/simple")

    after = sessions()
    assert after - before >= 2, f"the requests went through HAProxy's backend (stot {before} -> {after})"


# ---------------------------------------------------------------------------
# xinetd mode


@pytest.mark.usefixtures("puppetserver")
def test_xinetd_service_follows_drain_and_undrain(
    pmcheck, pmcheck_bin, haproxy, xinetd, shipped_haproxy, shipped_xinetd, testdir
):
    attrs = st.xinetd_attrs(shipped_xinetd)
    expect = {
        "per_source": ["= UNLIMITED"],
        "type": ["= UNLISTED"],
        "flags": ["= REUSE"],
        "wait": ["= no"],
        "socket_type": ["= stream"],
        "server": ["= /usr/bin/pmcheck"],
        "server_args": ["= inetd"],
        "port": ["= 9200"],
    }
    for k, v in expect.items():
        assert attrs.get(k) == v, f"packaging/xinetd/pmcheck: {k} is {attrs.get(k)}, expected {v}"
    assert any("USERID" in v for v in attrs.get("log_on_failure", [])), attrs
    cps = attrs["cps"][0].split()
    assert int(cps[1]) >= 200 and int(cps[2]) < 2, f"cps {cps}: must not disable the service under polling"
    user = attrs["user"][0].split()[1]
    assert user != "root", "never as root"
    group = attrs.get("group", ["= puppet"])[0].split()[1]
    assert group == "puppet", "the Puppet private key is readable by group puppet"
    assert re.search(r"(?m)^\s*#\s*only_from\s*=", shipped_xinetd), "only_from is documented with an example"

    if st.ensure_system_user(user):
        print(f"[e2e] created the system user {user}, as the pmcheck package does")

    # the service runs as that user: give it its own copy of the binary and a state dir it can read
    bindir = testdir / "bin"
    bindir.mkdir(mode=0o755)
    binary = bindir / "pmcheck"
    shutil.copy2(pmcheck_bin, binary)
    os.chmod(binary, 0o755)
    state = testdir / "state"
    state.mkdir(mode=0o755)

    port = st.free_port()
    service = st.render_xinetd(
        shipped_xinetd, port, str(binary), str(state), str(testdir / "xinetd-services.log")
    )
    x = xinetd(service)
    r, _ = st.wait_until(
        "xinetd to answer a poll with 200",
        lambda: (r := st.http_request(port, timeout=5)) and r.status == 200 and r,
        20, interval=0.2, alive=x.check_alive,
    )  # fmt: skip
    assert r.body.startswith("OK"), r.body
    raw = st.raw_http(port, b"OPTIONS / HTTP/1.0\r\n\r\n")
    assert re.match(rb"HTTP/1\.[01] 200 ", raw), raw[:300]

    # only_from (documented in the file, set to 127.0.0.1 here): another address is refused
    # by xinetd before pmcheck runs, and log_on_failure records it
    refused = st.raw_http(port, b"OPTIONS / HTTP/1.0\r\n\r\n", source="127.0.0.2")
    assert not refused.startswith(b"HTTP/"), f"a poll from 127.0.0.2 must be refused: {refused[:200]!r}"
    services_log = testdir / "xinetd-services.log"
    st.wait_until(
        "xinetd to log the refused poll",
        lambda: "127.0.0.2" in services_log.read_text(errors="replace") and "FAIL" in services_log.read_text(errors="replace"),
        10, alive=x.check_alive,
    )  # fmt: skip

    h, _front, backend, servers = start_shipped_haproxy(haproxy, shipped_haproxy, port, FAST, "lb")
    wait_all(h, backend, servers, st.is_up_checked, "UP through xinetd (L7OK/200)", 30)

    reason = "e2e xinetd drain"
    cp = pmcheck.run("drain", "--reason", reason, "--state-dir", str(state))
    assert cp.returncode == 0, cp
    r = st.http_request(port)
    assert r.status == 503 and r.body.startswith("DRAINED") and reason in r.body, (
        f"pmcheck inetd running as {user} must see the drain written by root: {r}"
    )
    took = wait_all(h, backend, servers, st.is_down_503, "DOWN with L7STS/503 through xinetd", 15)
    record("HAProxy reaction to a drain through xinetd, " + FAST, f"{took:.2f}s")

    cp = pmcheck.run("undrain", "--state-dir", str(state))
    assert cp.returncode == 0, cp
    wait_all(h, backend, servers, st.is_up_checked, "UP again through xinetd", 15)
    assert x.proc.poll() is None, "xinetd is still running (cps did not disable it either)"
    assert "Deactivating" not in (testdir / "xinetd.log").read_text(errors="replace")
