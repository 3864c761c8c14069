"""pmcheck's waits against HAProxy's own view (`http-check send-state`).

Two compile masters' pmcheck daemons (A for server line 1, B for server line 2 of the shipped
backend, both in front of the session's Puppet Server) behind the real HAProxy (2.6 or 3.0) with
packaging/haproxy/pmcheck.cfg as shipped. Every HAProxy value is read from its admin socket.
"""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

import e2e_stack as st
from conftest import record

# CI runs it on Debian 13, where one Puppet Server serves all of these (conftest.py).
pytestmark = pytest.mark.ci_on("debian13")

INTER = 2.0  # the shipped `inter 2s`
# `show servers state` srv_op_state -> the word of X-Haproxy-Server-State
OP_WORD = {"0": "DOWN", "1": "UP", "2": "UP", "3": "NOLB"}
OWN = {"User-Agent": "pmcheck/e2e"}


class Watch(st.Sampler):
    """HAProxy's view of each server and the backend's total weight, every 50 ms."""

    every = 0.05

    def __init__(self, h: st.HAProxy, backend: str):
        super().__init__("haproxy state watch")
        self.h, self.backend = h, backend
        self.rows: list[tuple[float, dict[str, dict[str, str]], int]] = []

    def sample(self) -> None:
        try:
            servers = {s["svname"]: s for s in self.h.servers(self.backend)}
            total = next(
                int(r["weight"])
                for r in self.h.stat()
                if r["pxname"] == self.backend and r["svname"] == "BACKEND"
            )
            self.rows.append((time.monotonic(), servers, total))
        except (OSError, st.StackError, StopIteration, ValueError):
            pass

    def first(self, server: str, want, after: float) -> float | None:
        """When HAProxy first showed ``server`` as ``want(row, total)`` after ``after``."""
        for t, servers, total in self.rows:
            if t >= after and server in servers and want(servers[server], total):
                return t
        return None


def takes_new(s: dict[str, str], total: int) -> bool:
    """HAProxy sends new agents to it: running, not admin-drained, its weight counted."""
    return s["srv_op_state"] == "2" and not int(s["srv_admin_state"]) & 0x18 and int(s["weight"]) > 0 < total


def out_and_empty(s: dict[str, str], total: int) -> bool:
    return not takes_new(s, total) and s["scur"] == "0"


def states_of(d: st.PmcheckServe, server: str) -> list[dict]:
    """What ``d`` recorded of HAProxy's view of ``server`` (from 127.0.0.1, HAProxy's checks)."""
    answer = d.get("/status", headers=OWN).json()
    found = []
    for p in answer.get("pollers", []):
        for s in p.get("states", []):
            seen = s.get("seen")
            if seen and seen["server"] == server:
                found.append({**seen, "last_ms_ago": s["last_ms_ago"]})
    return found


def agrees(h: st.HAProxy, backend: str, d: st.PmcheckServe, server: str):
    """pmcheck's record of ``server`` equal to `show stat` read just before and after it (the
    header is up to one check old: retried until HAProxy held still across the read)."""
    before = {s["svname"]: s for s in h.servers(backend)}
    states = states_of(d, server)
    after = {s["svname"]: s for s in h.servers(backend)}
    total = next(int(r["weight"]) for r in h.stat() if r["pxname"] == backend and r["svname"] == "BACKEND")
    keys = ("srv_op_state", "weight", "scur", "qcur")
    if not states or any(before[server][k] != after[server][k] for k in keys):
        return None
    seen, s = states[0], after[server]
    ours = (seen["health"], seen["weight"], seen["total_weight"], seen["scur"], seen["qcur"])
    theirs = (OP_WORD[s["srv_op_state"]], int(s["weight"]), total, int(s["scur"]), int(s["qcur"] or 0))
    return (ours, theirs) if ours == theirs else None


def run(pm, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return pm.run(*args, timeout=timeout)


# what `pmcheck status` says a load balancer did, by `show stat`'s srv_op_state
STATUS_WORDS = {"2": "sends it agents", "3": "took it out (NOLB): no new agents", "0": "took it out (DOWN)"}


def status_matches(pm, h: st.HAProxy, backend: str, d: st.PmcheckServe, server: str):
    """`pmcheck status` of ``d`` says, of ``server``, what `show stat` shows, read before and
    after it (retried until HAProxy held still across the read); its lines then."""
    before = {s["svname"]: s for s in h.servers(backend)}
    cp = run(pm, "status", "--url", d.url)
    after = {s["svname"]: s for s in h.servers(backend)}
    if before[server]["srv_op_state"] != after[server]["srv_op_state"]:
        return None
    s = after[server]
    said = [
        line for line in cp.stdout.splitlines() if line.startswith("lb:") and f"{backend}/{server}" in line
    ]
    sessions = "no session left" if s["scur"] == "0" else f"still {s['scur']} session(s)"
    want = f" {STATUS_WORDS[s['srv_op_state']]}, {sessions};"
    return (said, cp.stdout) if said and want in said[0] else None


def two_masters(pmcheck, haproxy, shipped_haproxy: str, testdir):
    """A's and B's `pmcheck serve` (agent checks, 404 for drains) behind the shipped backend
    rendered for loopback, both in front of the session's Puppet Server, both UP in HAProxy:
    (a, b, haproxy, backend, server names, frontend port)."""
    agent_a, agent_b = st.free_port(), st.free_port()
    common = ("--drained-status", "404", "--interval", "500ms", "--slow-start", "0s")
    a = pmcheck.serve(testdir / "state-a", "--agent-listen", f"{st.LOOPBACK}:{agent_a}", *common, name="a")
    b = pmcheck.serve(testdir / "state-b", "--agent-listen", f"{st.LOOPBACK}:{agent_b}", *common, name="b")
    a.wait_verdict(200)
    b.wait_verdict(200)
    ps = f"{st.LOOPBACK}:{st.PUPPET_PORT}"
    front = st.free_port()
    cfg, backend, servers = st.render_haproxy(
        shipped_haproxy, front, a.port, targets=[(ps, a.port, agent_a), (ps, b.port, agent_b)]
    )
    h = haproxy("lb", cfg, "packaging/haproxy/pmcheck.cfg: two masters' pmcheck, one Puppet Server")
    for srv in servers:
        h.wait_server(backend, srv, st.is_up_checked, "UP (L7OK/200)", 30)
    return a, b, h, backend, servers, front


@pytest.mark.usefixtures("puppetserver")
@pytest.mark.every_haproxy()
def test_waits_and_drains_follow_haproxys_own_view(pmcheck, haproxy, shipped_haproxy, testdir):
    assert "http-check send-state" in shipped_haproxy
    a, b, h, backend, servers, front = two_masters(pmcheck, haproxy, shipped_haproxy, testdir)
    m1, m2 = servers
    state_a, state_b = str(testdir / "state-a"), str(testdir / "state-b")

    # 1. what pmcheck records is what `show stat` says
    for d, srv in ((a, m1), (b, m2)):
        (ours, theirs), took = st.wait_until(
            f"{srv}: pmcheck's record = show stat", lambda d=d, srv=srv: agrees(h, backend, d, srv), 15
        )
        print(f"[e2e] {srv}: pmcheck recorded {ours}, show stat {theirs}")
        record(f"send-state of {srv} as pmcheck records it = show stat (UP)", f"{ours}")
    # ... and `pmcheck status` says it in words, with the next step
    (said, shown), _ = st.wait_until(
        "status says m1 = show stat", lambda: status_matches(pmcheck, h, backend, a, m1), 15
    )
    assert "next:   serving:" in shown, shown
    record("pmcheck status of a serving node, as HAProxy shows it", said[0])

    with Watch(h, backend) as watch:
        # 2. drain A: HAProxy takes m1 out; the record still agrees
        cp = run(pmcheck, "drain", "--reason", "e2e send-state", "--state-dir", state_a, "--url", a.url)
        assert cp.returncode == 0, cp.stderr
        h.wait_server(backend, m1, lambda s: s["srv_op_state"] == "3", "NOLB (404, disable-on-404)", 10)
        (ours, theirs), _ = st.wait_until(
            "m1 drained: record = show stat", lambda: agrees(h, backend, a, m1), 15
        )
        assert ours[0] == "NOLB", ours
        record("send-state of a drained server as pmcheck records it = show stat", f"{ours}")
        (said, shown), _ = st.wait_until(
            "status says m1 NOLB = show stat", lambda: status_matches(pmcheck, h, backend, a, m1), 15
        )
        assert "took it out (NOLB)" in said[0], said
        assert "weight: none sent while drained" in shown, shown
        record("pmcheck status of a drained node, as HAProxy shows it", said[0])

        # 3. B is now the last server taking agents: drain refuses, --force drains and says so
        st.wait_until(
            "B to hear that it is the last server",
            lambda: any(
                s["health"] == "UP" and s["weight"] == s["total_weight"] > 0 for s in states_of(b, m2)
            ),
            10,
        )
        cp = run(pmcheck, "drain", "--state-dir", state_b, "--url", b.url)
        assert cp.returncode == 77, (cp.returncode, cp.stdout, cp.stderr)
        assert f"says {m2} is the only server taking new agents in backend {backend}" in cp.stderr, cp.stderr
        assert "--force" in cp.stderr, cp.stderr
        assert not (testdir / "state-b" / "drain").exists(), "a refused drain wrote a record"
        cp = run(pmcheck, "drain", "--force", "--state-dir", state_b, "--url", b.url)
        assert cp.returncode == 0, cp.stderr
        assert "only server" in (testdir / "state-b" / "drain").read_text()
        h.wait_server(backend, m2, lambda s: s["srv_op_state"] == "3", "NOLB", 10)

        # 4. undrain --wait returns within one check of HAProxy taking B back, never before
        t0 = time.monotonic()
        cp = run(pmcheck, "undrain", "--wait", "--state-dir", state_b, "--url", b.url)
        back = time.monotonic()
        assert cp.returncode == 0, cp.stderr
        assert f"says UP for {backend}/{m2}" in cp.stdout and ": back" in cp.stdout, cp.stdout
        up = watch.first(m2, takes_new, t0)
        assert up is not None and up <= back, f"undrain --wait returned before HAProxy took {m2} back"
        assert back - up <= INTER + 0.5, f"undrain --wait returned {back - up:.2f}s after HAProxy's UP"
        record("undrain --wait after HAProxy took the server back (shipped inter 2s)", f"{back - up:.2f}s")

        # 5. B goes away (its Puppet Server probes would count as agent connections on A's):
        # m2 turns DOWN, and A comes back
        b.stop()
        h.wait_server(backend, m2, lambda s: s["srv_op_state"] == "0", "DOWN (B stopped)", 15)
        t0 = time.monotonic()
        cp = run(pmcheck, "undrain", "--wait", "--state-dir", state_a, "--url", a.url)
        back = time.monotonic()
        assert cp.returncode == 0, cp.stderr
        up = watch.first(m1, takes_new, t0)
        assert up is not None and up <= back and back - up <= INTER + 0.5, (up, back, cp.stdout)
        record("undrain --wait after HAProxy took the server back, again", f"{back - up:.2f}s")

        # 6. an agent's connection through HAProxy; A is the last server: --force, and
        # drain --wait returns only once HAProxy shows m1 NOLB with no session left
        with socket.create_connection((st.LOOPBACK, front), timeout=5):
            h.wait_server(backend, m1, lambda s: s["scur"] == "1", "one session", 10)
            t0 = time.monotonic()
            wait = subprocess.Popen(
                [a.pm.binary, "drain", "--wait", "--force", "--state-dir", state_a, "--url", a.url],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=st.clean_env(),
            )  # fmt: skip
            try:
                h.wait_server(
                    backend,
                    m1,
                    lambda s: s["srv_op_state"] == "3" and s["scur"] == "1",
                    "NOLB, 1 session",
                    10,
                )
                # two more checks carry NOLB with the session still open: the wait must go on
                time.sleep(2 * INTER + 0.5)
                assert wait.poll() is None, f"drain --wait returned with a session open: {wait.communicate()}"
            except BaseException:
                wait.kill()
                wait.communicate()
                raise
            closed = time.monotonic()
        out, err = wait.communicate(timeout=30)
        done = time.monotonic()
        assert wait.returncode == 0, (out, err)
        empty = watch.first(m1, out_and_empty, closed - 0.5)
        assert empty is not None and empty <= done, f"safe before HAProxy showed {m1} out with scur 0"
        assert f"says NOLB for {backend}/{m1}" in out and "out, no session left" in out, out
        assert "has no server taking new agents now (total weight 0)" in err, err
        record(
            "drain --wait after HAProxy showed NOLB and scur 0 (shipped inter 2s)",
            f"{done - empty:.2f}s (the session closed {empty - closed:.2f}s before HAProxy's view; "
            f"{done - t0:.1f}s in all)",
        )
