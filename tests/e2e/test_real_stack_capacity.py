"""Capacity and the agent check against the real stack: Puppet Server's JRuby pool (two
instances, MAX_ACTIVE_INSTANCES in e2e_stack/puppetserver.py), real `puppet agent` runs, and
HAProxy running the shipped backend with pmcheck's agent check and `http-check disable-on-404`.

One test, in the order an operator lives it, so that Puppet Server is HUPed, stopped and
started once: a drain that HAProxy shows as a drain, the weight ramping back, busy under real
agents and still UP, a reload, a stop (DOWN with its cause), a start (out until the pool can
compile, then a ramp). It runs after test_real_stack.py and leaves Puppet Server running.
Every HAProxy state is read from its admin socket; the timings use the shipped
`inter 2s rise 3 fall 3 agent-inter 2s`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest

import e2e_stack as st
from conftest import record

# CI runs it on Debian 13, where one Puppet Server serves all of these (conftest.py).
pytestmark = pytest.mark.ci_on("debian12")  # Debian 13 runs the HAProxy releases instead (docs/testing.md)

SLOW_START = 10  # seconds: short enough to watch, long enough to see several steps


class Timeline(st.Sampler):
    """Samples pmcheck's JSON answer and HAProxy's view of one server every 0.25 s."""

    def __init__(self, serve: st.PmcheckServe, h: st.HAProxy, backend: str, server: str):
        super().__init__("timeline")
        self.serve, self.h, self.backend, self.server = serve, h, backend, server
        self.rows: list[dict] = []
        self._t0 = time.monotonic()

    def sample(self) -> None:
        row: dict = {"t": round(time.monotonic() - self._t0, 2)}
        try:
            a = json.loads(self.serve.get(headers={"Accept": "application/json"}).body)
            pool = a.get("pool") or {}
            row.update(
                verdict=a["verdict"],
                weight=a["weight"],
                load=a.get("load"),
                **{k: pool.get(k) for k in ("size", "free", "borrowed", "waiting")},
            )
        except (OSError, ValueError, KeyError) as e:
            row["pmcheck"] = repr(e)
        try:
            s = self.h.server(self.backend, self.server)
            row.update(status=s["status"], ha_weight=s["weight"], last_agt=s.get("last_agt"))
        except (OSError, st.StackError) as e:
            row["haproxy"] = repr(e)
        self.rows.append(row)


def agent_line(port: int) -> str:
    """What the agent port says to a client that sends nothing."""
    with socket.create_connection((st.LOOPBACK, port), timeout=5) as s:
        chunks = []
        while b := s.recv(4096):
            chunks.append(b)
    return b"".join(chunks).decode()


def test_capacity_through_drain_reload_stop_and_start(
    pmcheck, puppetserver, puppet_cfg, haproxy, shipped_haproxy, testdir
):
    agent_port = st.free_port()
    serve = pmcheck.serve(
        testdir / "state",
        "--agent-listen", f"{st.LOOPBACK}:{agent_port}",
        "--drained-status", "404",
        "--slow-start", f"{SLOW_START}s",
        "--interval", "500ms",
    )  # fmt: skip
    front = st.free_port()
    cfg, backend, servers = st.render_haproxy(shipped_haproxy, front, serve.port, agent_port=agent_port)
    assert "agent-check" in cfg and "disable-on-404" in cfg, cfg
    h = haproxy("lb", cfg, "packaging/haproxy/pmcheck.cfg")
    srv = servers[0]

    def up_full(s):
        return st.is_up_checked(s) and s["weight"] == "100" and s["agent_status"].lstrip("* ") == "L7OK"

    h.wait_server(backend, srv, up_full, "UP at full weight, agent L7OK", 30)
    line = agent_line(agent_port)
    assert line.startswith("up ready 100% #OK - Puppet Server is running, 2 of 2 JRubies free"), line

    with Timeline(serve, h, backend, srv) as tl:
        # (d) a planned drain: DRAIN with the reason, never DOWN
        t0 = time.monotonic()
        assert (
            pmcheck.run(
                "drain", "--reason", "e2e planned work", "--state-dir", str(testdir / "state")
            ).returncode
            == 0
        )
        row, took = h.wait_server(
            backend, srv, lambda s: s["status"] in ("NOLB", "DRAIN", "DRAIN (agent)"), "NOLB/DRAIN", 15
        )
        record(
            "drain -> HAProxy NOLB/DRAIN (shipped inter/agent-inter 2s)",
            f"{took:.2f}s: status {row['status']!r}",
        )
        row, took = h.wait_server(
            backend,
            srv,
            lambda s: int(s["srv_admin_state"]) & 0x08,
            "the agent's drain (admin state 0x08)",
            15,
        )
        print(
            f"[e2e] drained: {st.summary(row)} last_agt={row.get('last_agt')!r} agent_status={row.get('agent_status')!r}"
        )
        row, took = h.wait_server(
            backend, srv,
            lambda s: "e2e planned work" in s.get("last_agt", "") and s["check_code"] == "404",
            "the drain's reason in the agent's info and the check's 404", 10,
        )  # fmt: skip
        record("drain reason visible in HAProxy (last_agt)", repr(row["last_agt"]))
        record(
            "drain: HTTP check as HAProxy shows it",
            f"{row['check_status']} {row['check_code']} {row['last_chk']!r}",
        )
        assert not any(r.get("status", "").startswith("DOWN") for r in tl.rows), tl_changes(tl.rows)
        drained_at = time.monotonic() - t0

        # undrain: back UP, the weight ramps from the floor over --slow-start
        assert pmcheck.run("undrain", "--state-dir", str(testdir / "state")).returncode == 0
        _, took = h.wait_server(backend, srv, st.is_up_checked, "UP after undrain", 20)
        record("undrain -> HAProxy UP (rise 3 x inter 2s)", f"{took:.2f}s")
        h.wait_server(
            backend, srv, lambda s: s["weight"] == "100", "full weight after the ramp", SLOW_START + 10
        )
        ramp = [int(r["ha_weight"]) for r in tl.rows if r.get("status") == "UP" and r["t"] > drained_at]
        record("HAProxy weights while ramping after undrain", " ".join(map(str, dict.fromkeys(ramp))))
        # (the sampler may miss the last step: wait_server above saw 100)
        assert ramp and min(ramp) < 60, ramp
        assert len(set(ramp)) >= 3, f"a ramp, not a jump: {ramp}"

        # (b) busy under real agents: weight drops, the server stays UP
        busy_from = len(tl.rows)
        with st.slow_environment("pmcheck_e2e_slow", 4) as env:
            runs = [st.agent_run(puppet_cfg, front, env, testdir / f"agent{i}") for i in range(3)]
            try:
                codes = [p.wait(timeout=240) for p in runs]
            finally:
                for p in runs:
                    st.stop_pid(p, "puppet agent", term_timeout=5)
        during = tl.rows[busy_from:]
        logs = {i: (testdir / f"agent{i}" / "agent.log").read_text()[-1500:] for i in range(3)}
        assert all(c in (0, 2) for c in codes), f"agent runs failed: {codes}\n{logs}"
        record("busy: pool during 3 concurrent agent runs", tl_changes(during))
        assert any(r.get("load") == "busy" for r in during), tl_changes(during)
        assert any(r.get("ha_weight") not in (None, "100") for r in during), tl_changes(during)
        assert all(r.get("status") == "UP" for r in during if "status" in r), tl_changes(during)

        # (c) reload: kill -HUP of the JVM takes the node out, then back
        reload_from = len(tl.rows)
        t0 = time.monotonic()
        os.kill(puppetserver.pid(), signal.SIGHUP)
        _, took = h.wait_server(
            backend, srv, lambda s: s["status"].startswith("DOWN"), "DOWN during the reload", 30
        )
        record("kill -HUP -> HAProxy DOWN", f"{took:.2f}s")
        _, took = h.wait_server(backend, srv, st.is_up_checked, "UP after the reload", 180)
        record("kill -HUP -> HAProxy UP again", f"{time.monotonic() - t0:.2f}s")
        record("reload: pmcheck and HAProxy", tl_changes(tl.rows[reload_from:]))

        # (e) Puppet Server stopped: DOWN with the cause, from the agent at once
        h.wait_server(
            backend, srv, lambda s: s["weight"] == "100", "full weight after the reload", SLOW_START + 30
        )
        stop_from = len(tl.rows)
        t0 = time.monotonic()
        puppetserver.stop()
        row, took = h.wait_server(backend, srv, lambda s: s["status"].startswith("DOWN"), "DOWN", 30)
        record(
            "Puppet Server stopped -> HAProxy DOWN",
            f"{took:.2f}s after the stop returned: status {row['status']!r}",
        )
        row, _ = h.wait_server(
            backend, srv, lambda s: "refused" in s.get("last_agt", "") and "refused" in s.get("last_chk", ""),
            "the cause in both checks' info", 15,
        )  # fmt: skip
        record("stopped: HAProxy's check info", f"last_chk={row['last_chk']!r} last_agt={row['last_agt']!r}")

        # (a) start: out until the pool can compile, then UP and a ramp
        start_from = len(tl.rows)
        t0 = time.monotonic()
        took_start = puppetserver.start()
        row, took = h.wait_server(backend, srv, st.is_up_checked, "UP after the start", 60)
        record(
            "Puppet Server start",
            f"{took_start:.1f}s until ready; HAProxy UP {time.monotonic() - t0:.1f}s after the start began",
        )
        h.wait_server(
            backend, srv, lambda s: s["weight"] == "100", "full weight after the start", SLOW_START + 30
        )
        record("stop and start: pmcheck and HAProxy", tl_changes(tl.rows[stop_from:]))
        start_rows = tl.rows[start_from:]
        # HAProxy never had the node UP while pmcheck was not OK
        for r in start_rows:
            if r.get("status") == "UP" and r.get("verdict") not in (None, "OK"):
                raise AssertionError(
                    f"UP while pmcheck said {r.get('verdict')}: {r}\n{tl_changes(start_rows)}"
                )
        ups = [int(r["ha_weight"]) for r in start_rows if r.get("status") == "UP"]
        assert ups and ups[0] < 100, f"a ramp after the start: {ups}"


def tl_changes(rows: list[dict]) -> str:
    keys = ("verdict", "load", "weight", "size", "free", "borrowed", "waiting", "status", "ha_weight")
    out, last = [], None
    for r in rows:
        now = tuple(r.get(k) for k in keys)
        if now != last:
            out.append(f"{r['t']:>6.2f}s " + " ".join(f"{k}={r.get(k)}" for k in keys))
            last = now
    return "\n" + "\n".join(out)
