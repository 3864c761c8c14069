"""One load balancer, one compile master in two of its backends: the drain rule decides per server
line, and one backend's answer never steers the other's agent line.

The real HAProxy (2.6 or 3.0) with packaging/haproxy/pmcheck.cfg as shipped, its backend twice
(the second a copy named `second`, its agent checks naming their own server lines): A's pmcheck
is compile01 in both; compile02 is C's in the first backend and B's in the second. A is drained
and goes out of both; then C is drained too (forced: it was the first backend's last server),
which makes A the last server there: HAProxy must take agents to A in the first backend (HTTP
check 200, agent line `up ready`) and keep it out of the second (404, `up drain`), for as long
as it stays so. (An admin's `disable server` would not do: the other server's own agent check
says `ready`, which HAProxy reads as leaving maintenance.)
"""

from __future__ import annotations

import re
import time

import pytest

import e2e_stack as st
from conftest import record

# Both HAProxy versions: the agent check naming its server line is what they read differently
# from the HTTP check, and each must follow its own line.
pytestmark = pytest.mark.ci_on("debian12", "debian13")


def serving(s: dict[str, str]) -> bool:
    """HAProxy sends new agents: running, not drained by the agent or an admin."""
    return s["srv_op_state"] == "2" and not int(s["srv_admin_state"]) & 0x18


@pytest.mark.usefixtures("puppetserver")
@pytest.mark.every_haproxy("3.2")
def test_each_backend_follows_its_own_server_line(pmcheck, haproxy, shipped_haproxy, testdir):
    common = ("--drained-status", "404", "--interval", "500ms", "--slow-start", "0s")
    daemons, agents = {}, {}
    for name in "abc":
        agents[name] = st.free_port()
        daemons[name] = pmcheck.serve(
            testdir / f"state-{name}", "--agent-listen", f"{st.LOOPBACK}:{agents[name]}", *common, name=name
        )
    for d in daemons.values():
        d.wait_verdict(200)
    a, c = daemons["a"], daemons["c"]
    ps = f"{st.LOOPBACK}:{st.PUPPET_PORT}"

    def rendered(other: str):
        targets = [(ps, a.port, agents["a"]), (ps, daemons[other].port, agents[other])]
        return st.render_haproxy(shipped_haproxy, st.free_port(), a.port, targets=targets)

    cfg, first, (m1, m2) = rendered("c")
    with_b, _, _ = rendered("b")
    block = re.search(rf"(?ms)^backend {re.escape(first)}\n.*?(?=^\S|\Z)", with_b)
    assert block is not None, with_b
    second = "second"
    copy = block[0].replace(f"backend {first}", f"backend {second}", 1).replace(f'"{first}/', f'"{second}/')
    assert copy.count(f'"{second}/') == 2, copy
    h = haproxy("lb", cfg + "\n" + copy, "packaging/haproxy/pmcheck.cfg, its backend twice")
    for backend in (first, second):
        for srv in (m1, m2):
            h.wait_server(backend, srv, st.is_up_checked, "UP (L7OK/200)", 30)

    # A drained: out of both backends.
    state_a = str(testdir / "state-a")
    cp = pmcheck.run("drain", "--reason", "e2e two backends", "--state-dir", state_a, "--url", a.url)
    assert cp.returncode == 0, cp.stderr
    assert f"answered DRAINED for {first}/{m1}" in cp.stdout and f"{second}/{m1}" in cp.stdout, cp.stdout
    for backend in (first, second):
        h.wait_server(backend, m1, lambda s: not serving(s), "out", 10)

    # C leaves the first backend: A is its last server there, and is held in it.
    state_c = str(testdir / "state-c")
    cp = pmcheck.run("drain", "--force", "--reason", "e2e: the other", "--state-dir", state_c, "--url", c.url)
    assert cp.returncode == 0, cp.stderr
    h.wait_server(first, m2, lambda s: not serving(s), "out (C drained)", 10)
    _, took = h.wait_server(first, m1, serving, "taking agents again (the drain held)", 20)
    record("a drained master that became its backend's last server takes agents again", f"{took:.1f}s")
    held_at = {}

    def lines():
        answer = a.get("/status").json()
        for p in answer["pollers"]:
            for s in p.get("states", []):
                if s.get("seen"):
                    held_at[s["seen"]["backend"]] = s.get("held")
        return held_at.get(first) == "last_server" and held_at.get(second) is None

    st.wait_until("A's /status: held in the first backend only", lines, 15)
    record("held where A is the last server, out where it is not (A's /status)", str(held_at))
    # For ten seconds (five checks of each kind): each backend as its line decides.
    wrong: list[str] = []
    end = time.monotonic() + 10
    samples = 0
    while time.monotonic() < end:
        one, two = h.server(first, m1), h.server(second, m1)
        if not serving(one):
            wrong.append(f"{first}/{m1} out: {st.view(one)}")
        if serving(two):
            wrong.append(f"{second}/{m1} taking agents: {st.view(two)}")
        for s, want in ((one, "drain held"), (two, "DRAINED")):
            agt = s.get("last_agt", "")
            if agt and not s["agent_status"].startswith("*") and want not in agt:
                wrong.append(f"agent line {agt!r} where {want!r} belongs")
        samples += 1
        time.sleep(0.2)
    assert not wrong, "\n".join(wrong[:10])
    record(
        "one master in two backends, last server in one",
        f"{samples} samples over 10s: held in {first} (UP, agent `up ready`), out of {second} (agent `up drain`)",
    )
    shown = pmcheck.run("status", "--url", a.url).stdout
    assert "held:   drain held: load balancer 127.0.0.1 " in shown and f"in backend {first}" in shown, shown

    # C back: the drain takes effect in the first backend too.
    cp = pmcheck.run("undrain", "--state-dir", state_c, "--url", c.url)
    assert cp.returncode == 0, cp.stderr
    h.wait_server(first, m1, lambda s: not serving(s), "out again", 20)
    cp = pmcheck.run("undrain", "--wait", "--state-dir", state_a, "--url", a.url)
    assert cp.returncode == 0, cp.stderr
