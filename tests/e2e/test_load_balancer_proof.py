"""Only HAProxy's own checks move pmcheck's waits and its last-server guard.

Trust round two, defects 2 and 3: anything that reaches port 9200 can send
X-Haproxy-Server-State. Two compile masters' pmcheck daemons (A, B) sit behind the real HAProxy
(2.6 or 3.0) with packaging/haproxy/pmcheck.cfg as shipped, its key placeholder replaced by the stack's
key, so that HAProxy's HTTP checks (`http-check send hdr X-Pmcheck-Key`) and agent checks
(`agent-send`) carry it. Forgers poll the same daemons from HAProxy's own address (127.0.0.1,
as a monitoring check or a user's curl on the load balancer's host would), without a key and
with a wrong one, sending made-up and malformed headers. Every HAProxy value is read from its
admin socket.
"""

from __future__ import annotations

import socket
import subprocess
import time

import pytest
from test_load_balancer_state import Watch, two_masters

import e2e_stack as st
from conftest import record

# CI runs it on Debian 13, where one Puppet Server serves all of these (conftest.py).
pytestmark = pytest.mark.ci_on("debian13")

WRONG_KEY = "0" * 48


class Forger(st.Sampler):
    """HTTP checks from ``source`` to ``port`` every 50 ms with ``header`` as the load
    balancer's state, and ``key`` (or none)."""

    every = 0.05

    def __init__(self, port: int, header: str, key: str | None = None, source: str = st.LOOPBACK):
        super().__init__("forger")
        self.port, self.header, self.key, self.source = port, header, key, source
        self.sent = 0

    def sample(self) -> None:
        lines = ["OPTIONS / HTTP/1.0", f"X-Haproxy-Server-State: {self.header}"]
        if self.key is not None:
            lines.append(f"X-Pmcheck-Key: {self.key}")
        payload = ("\r\n".join(lines) + "\r\n\r\n").encode()
        try:
            st.raw_http(self.port, payload, timeout=2, source=self.source)
            self.sent += 1
        except OSError:
            pass


def proven_checks(d: st.PmcheckServe) -> dict | None:
    """The poller of 127.0.0.1 that proved itself with the key, if it has made both kinds of
    check."""
    answer = d.get("/status", headers={"User-Agent": "pmcheck/e2e"}).json()
    for p in answer.get("pollers") or []:
        if p["address"] == st.LOOPBACK and p.get("proof") == "key" and p.get("http") and p.get("agent"):
            return p
    return None


def run(pm, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return pm.run(*args, timeout=timeout)


@pytest.mark.usefixtures("puppetserver")
@pytest.mark.every_haproxy()
def test_forged_states_move_no_wait_and_no_guard(pmcheck, haproxy, shipped_haproxy, testdir):
    assert "http-check send hdr X-Pmcheck-Key" in shipped_haproxy and "agent-send" in shipped_haproxy
    a, b, h, backend, servers, front = two_masters(pmcheck, haproxy, shipped_haproxy, testdir)

    # 1. HAProxy's HTTP and agent checks both prove themselves with the key
    for d in (a, b):
        p, _ = st.wait_until(
            f"{d.listen}: HAProxy's checks proven by the key", lambda d=d: proven_checks(d), 15
        )
        record(
            f"{h.label}'s checks as pmcheck sees them",
            f"proof={p['proof']}, http and agent from {p['address']}",
        )

    # 2. an agent's session through HAProxy on one server (X); forgers on HAProxy's address tell
    # X's pmcheck that HAProxy took X out with no session left
    with Watch(h, backend) as watch:
        with socket.create_connection((st.LOOPBACK, front), timeout=5):
            (x, _), _ = st.wait_until(
                "the session on a server",
                lambda: next(((s["svname"], s) for s in h.servers(backend) if s["scur"] == "1"), None),
                10,
            )
            dx, dy = (a, b) if x == servers[0] else (b, a)
            y = servers[1] if x == servers[0] else servers[0]
            lie = f"NOLB; name={backend}/{x}; node=lb; weight=100/100; scur=0/0; qcur=0"
            drain_x = ("drain", "--wait", "--state-dir", str(dx.state_dir), "--url", dx.url)
            with Forger(dx.port, lie), Forger(dx.port, lie, key=WRONG_KEY):
                t0 = time.monotonic()
                cp = run(pmcheck, *drain_x, "--max-wait", "6s")
            # the session is still open: HAProxy's own view keeps the wait going to its end
            assert cp.returncode == 75, (cp.returncode, cp.stdout, cp.stderr)
            assert f"for {backend}/{x}" in cp.stderr and "sessions still open" in cp.stderr, cp.stderr
            nolb = watch.first(x, lambda s, _t: s["srv_op_state"] == "3" and s["scur"] == "1", t0)
            assert nolb is not None, "HAProxy never showed the drained server NOLB with its session"
            record("drain --wait with forged NOLB scur=0 from HAProxy's address, a session open", "exit 75")

    # 3. Y is now the last server taking agents: forgers on HAProxy's address say it is not
    # (a made-up header, a malformed one of the same server line): the guard refuses all the same
    st.wait_until(
        "Y to hear from HAProxy that it is the last server",
        lambda: any(
            (s.get("seen") or {}).get("weight") == (s.get("seen") or {}).get("total_weight", -1) > 0
            for p in dy.get("/status", headers={"User-Agent": "pmcheck/e2e"}).json()["pollers"]
            if p.get("proof") == "key"
            for s in p.get("states", [])
        ),
        10,
    )
    not_last = f"UP; name={backend}/{y}; node=lb; weight=100/200; scur=0/0; qcur=0"
    malformed = f"UP; name={backend}/{y}; weight=1/2; weight=1/1; scur=0/0; qcur=0"
    with Forger(dy.port, not_last), Forger(dy.port, malformed, key=WRONG_KEY):
        time.sleep(0.5)  # several forged polls after HAProxy's last check
        cp = run(pmcheck, "drain", "--state-dir", str(dy.state_dir), "--url", dy.url)
    assert cp.returncode == 77, (cp.returncode, cp.stdout, cp.stderr)
    assert f"says {y} is the only server taking new agents in backend {backend}" in cp.stderr, cp.stderr
    assert not (dy.state_dir / "drain").exists(), "a refused drain wrote a record"
    record("drain of the last server with forged headers from HAProxy's address", "refused, exit 77")

    cp = run(pmcheck, "undrain", "--wait", "--state-dir", str(dx.state_dir), "--url", dx.url)
    assert cp.returncode == 0, cp.stderr
