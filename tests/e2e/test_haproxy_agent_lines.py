"""How the real HAProxy (2.6 or 3.0) reads each agent line pmcheck writes, with the HTTP answer that goes
with it: the shipped backend (`option httpchk`, `http-check disable-on-404`, `agent-check`,
`weight 100`, rise 3 fall 3) with its intervals shortened, its check and agent ports served by
stand-ins (e2e_stack/stubs.py: HttpStatusStub, AgentLineStub) that answer exactly the bytes
given here.

No Puppet Server and no pmcheck: this pins down HAProxy's side of the contract (the lines are
those of src/responder/agent.rs), so that a change of HAProxy's reading shows up here and not
as a puzzling capacity test.  Every step waits for five new HTTP checks and five agent lines
per server (more than rise/fall 3), then records what `show stat` and `show servers state` display.
"""

from __future__ import annotations

import re
import time

import pytest

import e2e_stack as st
from conftest import record

# CI runs it on both stacks: it needs no Puppet Server (conftest.py).
pytestmark = pytest.mark.ci_on("debian12", "debian13")

INTER = "250ms"
TIMING = f"inter {INTER} rise 3 fall 3 agent-inter {INTER}"

DRAIN = "e2e planned work (by root since 2026-11-23T06:00:00Z)"
REFUSED = "connection to 127.0.0.1:8140 refused: Puppet Server is not listening (stopped, restarting or ..."


def admin_drain(s: dict[str, str]) -> bool:
    return bool(int(s["srv_admin_state"]) & 0x08)


def up(weight: int):
    def want(s: dict[str, str]) -> bool:
        return s["status"] == "UP" and s["srv_op_state"] == "2" and s["weight"] == str(weight)

    return want


def down(s: dict[str, str]) -> bool:
    # `DOWN`, or `DOWN (agent)` when the agent's `down`/`fail` took it out
    return s["status"].startswith("DOWN") and "/" not in s["status"] and s["srv_op_state"] == "0"


def drained_not_down(s: dict[str, str]) -> bool:
    return ("DRAIN" in s["status"] or s["status"] == "NOLB") and admin_drain(s) and not down(s)


# (what pmcheck's state is, HTTP status, reason phrase, agent line, what HAProxy must show)
STEPS = [
    ("STARTING (first probe pending)", 503, "Starting", "#STARTING - no probe of Puppet Server has finished yet", down),
    ("OK, warming (ramp)", 200, "OK", "up ready 50% #OK - warming: 1 of 2 JRubies ready", up(50)),
    ("OK, warm", 200, "OK", "up ready 100% #OK - Puppet Server is running, 2 of 2 JRubies free", up(100)),
    ("OK, busy", 200, "OK",
     "up ready 10% #OK - busy: 0 of 2 JRubies free, 1 request waiting, average wait 850 ms", up(10)),
    ("DRAINED, Puppet Server healthy (404)", 404, f"Drained: {DRAIN}",
     f"up drain #DRAINED - {DRAIN}; Puppet Server is running, 2 of 2 JRu...", drained_not_down),
    ("DRAINED, Puppet Server down (404)", 404, f"Drained: {DRAIN}",
     f"up drain #DRAINED - {DRAIN}; Puppet Server is down: connection to...", drained_not_down),
    ("undrained: OK, ramp starts", 200, "OK", "up ready 10% #OK - Puppet Server is running, 2 of 2 JRubies free",
     up(10)),
    ("DOWN (refused)", 503, "Down", f"down ready 10% #DOWN - {REFUSED}", down),
    ("STARTING while DOWN (pmcheck restarted)", 503, "Starting",
     "#STARTING - no probe of Puppet Server has finished yet", down),
    ("OK, paused (a deploy's lock, within --pause-grace)", 200, "OK",
     "up ready 10% #OK - paused: JRuby pool locked since 12:00:01Z (3s)", up(10)),
    ("NOTREADY (pool locked, never ready since start)", 503, "Not ready",
     "down ready 10% #NOTREADY - Puppet Server's JRuby pool is locked: nothing compiles", down),
    ("UNKNOWN (probe cannot tell)", 503, "Unknown",
     "fail ready 10% #UNKNOWN - no answer from Puppet Server within 5s", down),
    ("DRAINED while DOWN (404)", 404, f"Drained: {DRAIN}",
     f"up drain #DRAINED - {DRAIN}; Puppet Server is down: connection to...",
     lambda s: down(s) and admin_drain(s)),
    ("UNKNOWN, drain state unreadable", 503, "Unknown",
     "fail #UNKNOWN - cannot tell whether this node is drained: cannot read drain record /var/lib/pmcheck/drain:...",
     lambda s: down(s) and admin_drain(s)),
    ("back: OK, ramp starts", 200, "OK", "up ready 10% #OK - Puppet Server is running, 2 of 2 JRubies free",
     up(10)),
]  # fmt: skip

SHOWN = [
    "status", "weight", "srv_op_state", "srv_admin_state", "srv_uweight", "srv_iweight",
    "check_status", "check_code", "last_chk", "check_desc",
    "agent_status", "agent_code", "last_agt", "agent_desc",
]  # fmt: skip


def shown(s: dict[str, str]) -> str:
    return " ".join(f"{k}={s.get(k)!r}" for k in SHOWN)


@pytest.mark.every_haproxy()
def test_haproxy_reads_each_agent_line(haproxy, shipped_haproxy):
    with st.HttpStatusStub(503, "Starting") as http, st.AgentLineStub(STEPS[0][3]) as agent:
        cfg, backend, servers = st.render_haproxy(
            shipped_haproxy, st.free_port(), http.port,
            backend_addr=f"{st.LOOPBACK}:{st.free_port()}", timing=TIMING, agent_port=agent.port,
        )  # fmt: skip
        assert "disable-on-404" in cfg and f"agent-inter {INTER}" in cfg and "weight 100" in cfg, cfg
        h = haproxy("agent-lines", cfg, "packaging/haproxy/pmcheck.cfg with stand-in check and agent ports")
        srv = servers[0]
        # every server line checks the same stand-ins: 5 answers each (one may have been in
        # flight when the answer changed, then rise/fall 3 and one more)
        enough = 5 * len(servers)
        failures = []
        for what, status, reason, line, want in STEPS:
            log_from = h.log.stat().st_size
            http.status, http.reason, agent.line = status, reason, line
            h0, a0 = http.count(), agent.count()
            t0 = time.monotonic()
            seen: list[str] = []

            def settled(h0=h0, a0=a0, seen=seen, t0=t0) -> dict[str, str] | None:
                s = h.server(backend, srv)
                now = f"{s['status']} w={s['weight']} admin={s['srv_admin_state']}"
                if not seen or seen[-1].split(" @")[0] != now:
                    seen.append(f"{now} @{time.monotonic() - t0:.2f}s")
                # While a check runs, `show stat` prefixes its status with "* " and HAProxy has
                # cleared its description (check.c, HCHK_STATUS_START): last_agt reads empty (seen
                # once in CI). Read between checks.
                if s["agent_status"].startswith("*") or s["check_status"].startswith("*"):
                    return None
                return s if http.count() >= h0 + enough and agent.count() >= a0 + enough else None

            s, _ = st.wait_until(
                f"HAProxy to take in {line!r}", settled, 20, interval=0.05, alive=h.check_alive
            )
            logged = [
                x for x in h.log.read_bytes()[log_from:].decode(errors="replace").splitlines() if srv in x
            ]
            print(f"[e2e] {what}: HTTP {status} + {line!r}\n[e2e]   {shown(s)}\n[e2e]   seen: {seen}")
            for x in logged:
                print(f"[e2e]   log: {x}")
            record(
                f"{h.label} reading HTTP {status} + agent {line!r} ({what})",
                f"{shown(s)}; transitions {seen}; log {logged[:3]}",
            )
            if not want(s):
                failures.append(f"{what}: HTTP {status} + {line!r}: {shown(s)}")
            # The drain's reason stays on the stats page whatever Puppet Server does.
            if line.startswith("up drain") and DRAIN not in s["last_agt"]:
                failures.append(f"{what}: the reason is not in last_agt: {shown(s)}")
        assert not failures, "HAProxy did not read these as the contract says:\n" + "\n".join(failures)


@pytest.mark.every_haproxy("3.2", "3.4")
def test_haproxy_exports_an_unreachable_agent_check_as_the_alert_reads_it(haproxy, shipped_haproxy):
    """packaging/prometheus's PmcheckAgentCheckUnreachable reads HAProxy's own exporter:
    `haproxy_server_agent_status{proxy, server, state}`, 1 for the current state, L4CON for an
    agent port that refuses. 3.2 added the series; 2.6 and 3.0 export none."""
    with st.HttpStatusStub(200, "OK") as http:
        # The agent port: a free port nothing listens on, so every agent check is refused.
        cfg, backend, servers = st.render_haproxy(shipped_haproxy, st.free_port(), http.port, timing=TIMING)
        prom = st.free_port()
        cfg += (
            "\nfrontend prometheus\n    mode http\n"
            f"    bind {st.LOOPBACK}:{prom}\n    http-request use-service prometheus-exporter\n"
        )
        h = haproxy("exporter", cfg, "packaging/haproxy/pmcheck.cfg and HAProxy's prometheus-exporter")

        def scrape() -> str:
            return st.http_request(prom, "/metrics?scope=server", timeout=5).body

        srv = servers[0]
        refused = f'haproxy_server_agent_status{{proxy="{backend}",server="{srv}",state="L4CON"}} 1'
        if h.release < (3, 2):
            text, _ = st.wait_until(
                f"HAProxy's exporter to show {srv}",
                lambda: (t := scrape()) and f'server="{srv}"' in t and t,
                10,
            )
            assert "haproxy_server_agent_status" not in text, text
            record(f"{h.label}'s exporter and agent checks", "no haproxy_server_agent_status series")
            return
        text, took = st.wait_until(
            f"HAProxy's exporter to say {srv}'s agent check is refused",
            lambda: (t := scrape()) and refused in t and t,
            10,
            alive=h.check_alive,
        )
        states = re.findall(
            rf'haproxy_server_agent_status{{proxy="{backend}",server="{srv}",state="(\w+)"}} 1', text
        )
        assert states == ["L4CON"], states
        record(f"{h.label}'s exporter, an agent port that refuses", f"{refused} after {took:.1f}s")
