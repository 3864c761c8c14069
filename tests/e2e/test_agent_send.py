"""pmcheck's agent port as the real HAProxy (2.6 or 3.0) reads it, with and without `agent-send`.

pmcheck writes its line at once, shuts down its sending side, then reads what the client sends
(at most 16 KiB, for at most 2 s) before it closes: closing with HAProxy's `agent-send` string
unread would send a reset, which can destroy the line before HAProxy reads it. The shipped
backend sends nothing; a site that adds `agent-send` must get every line all the same. Each
case runs the shipped backend with short intervals against a real pmcheck (which probes the
session's Puppet Server) and samples `show stat` for a few seconds: every agent check must be
read (`L7OK`, `up (OK - ...)` in `last_agt`), none lost to a reset.
"""

from __future__ import annotations

import re
import time

import pytest

import e2e_stack as st
from conftest import record

# CI runs it on Debian 13, where one Puppet Server serves all of these (conftest.py).
pytestmark = pytest.mark.ci_on("debian13")

INTER = "250ms"
TIMING = f"inter {INTER} rise 3 fall 3 agent-inter {INTER}"


def agent_read(s: dict[str, str]) -> bool:
    return s["agent_status"] == "L7OK" and "(OK - " in s.get("last_agt", "")


@pytest.mark.usefixtures("puppetserver")
@pytest.mark.parametrize(
    "send",
    [None, "hello pmcheck\\n", "x" * 1000 + "\\n"],
    ids=["none", "short", "1k"],
)
def test_agent_lines_read_with_agent_send(pmcheck, haproxy, shipped_haproxy, testdir, send):
    agent_port = st.free_port()
    serve = pmcheck.serve(
        testdir / "state",
        "--agent-listen", f"{st.LOOPBACK}:{agent_port}",
        "--interval", "500ms",
    )  # fmt: skip
    cfg, backend, servers = st.render_haproxy(
        shipped_haproxy, st.free_port(), serve.port, timing=TIMING, agent_port=agent_port
    )
    # The shipped lines send their server line and the load balancers' key; the other cases
    # send their own string.
    shipped = r'agent-send\s+"[^"]*"'
    if send is None:
        cfg, n = re.subn(r"\s+" + shipped, "", cfg)
    else:
        cfg, n = re.subn(r"(?<=\s)" + shipped, lambda _: f'agent-send "{send}"', cfg)
    assert n >= 1, cfg
    h = haproxy("lb", cfg, f"packaging/haproxy/pmcheck.cfg, agent-send {send!r}")
    srv = servers[0]
    h.wait_server(backend, srv, lambda s: st.is_up_checked(s) and agent_read(s), "UP, agent line read", 60)
    # About a dozen more agent checks per server line, each of which must be read.
    # A sample taken while a check runs ("* " before its status) shows an empty last_agt, since
    # HAProxy clears the description when a check starts: it tells nothing, so it is not kept.
    # For 3 s, and on until ten are kept, within 30 s (each `show stat` takes longer on a loaded
    # machine).
    samples = []
    start = time.monotonic()
    while ((elapsed := time.monotonic() - start) < 3 or len(samples) < 10) and elapsed < 30:
        s = h.server(backend, srv)
        if not s["agent_status"].startswith("*"):
            samples.append((s["agent_status"], s.get("last_agt", "")))
        time.sleep(0.1)
    missed = [x for x in samples if not (x[0] == "L7OK" and "(OK - " in x[1])]

    def told_ok() -> int:
        told = serve.get("/status").json()
        return sum((p.get("agent") or {}).get("times", 0) for p in told.get("pollers") or [])

    # Counted until ten, within 30 s: HAProxy's agent checks come every agent-inter, later when loaded.
    agent_checks, _ = st.wait_until(
        "ten agent lines told OK in a row", lambda: (n := told_ok()) >= 10 and n, 30
    )
    told = serve.get("/status").json()
    record(
        f"HAProxy agent checks with agent-send {'(none)' if send is None else len(send)}",
        f"{len(samples)} samples, {len(missed)} not read; {agent_checks} agent lines told OK in a row",
    )
    assert len(samples) >= 10, samples
    assert not missed, f"agent checks not read: {missed[:5]}"
    assert agent_checks >= 10, told
