"""A wedged JRuby pool on the real Puppet Server is out until a borrow can succeed again.

Trust round two, defect 6: "busy is never out" must have a bound. On the fleet's master B alone
(A stopped), with `max-active-instances` 1 and a `borrow-timeout` of BORROW_TIMEOUT: a real
agent's catalog blocks (`generate('/bin/sleep', ...)` holds the one JRuby for BLOCK seconds)
while a client asks B for node definitions every 0.5 s with another agent's certificate, as
agents that do not wait would: each waits for the JRuby and times out, and no borrow succeeds.
pmcheck answers OK (busy) at first, then NOTREADY once that has lasted `--wedged-after`, and
HAProxy takes B out; once the blocking compile ends, the next borrow succeeds and B is back.

Two facts of Puppet Server 7.9.5 shaped it. The borrow timeout cannot be short: its config
service borrows a JRuby while it starts, with the same timeout, before the first instance
exists, so a 3 s timeout makes Puppet Server exit at start ("Attempt to borrow a JRubyInstance
from the pool timed out"). And `max-queued-requests` 1 did not refuse node requests here (36
waited; only a report was refused), so it cannot stand in for the timeouts. The rule counts
timeouts and refusals alike (tests of src/puppet/wedge.rs).
"""

from __future__ import annotations

import threading
import time

import pytest

import e2e_stack as st
from conftest import record

BLOCK = 80  # seconds the blocking catalog holds the one JRuby: past the borrow timeout
BORROW_TIMEOUT = 45  # seconds: longer than the pool's first instance takes to start here
WEDGED_AFTER = 6  # seconds, pmcheck's --wedged-after


class Asker(st.Sampler):
    """GET /puppet/v3/node/<certname> on the master every 0.5 s, as ``ident``, each on a
    thread of its own (a request that waits for a JRuby must not stop the others)."""

    every = 0.5  # enough to keep borrows timing out; more starves Puppet Server's status API

    def __init__(self, master: st.PuppetServer, ident: st.Identity):
        super().__init__("asker")
        self.master, self.ident = master, ident
        self.ctx = st.tls_context(str(ident.localcacert), str(ident.hostcert), str(ident.hostprivkey))
        self.statuses: list[int] = []

    def sample(self) -> None:
        threading.Thread(target=self._ask, daemon=True).start()

    def _ask(self) -> None:
        path = f"/puppet/v3/node/{self.ident.certname}?environment=production"
        try:
            r = st.https_request(
                st.PUPPET_PORT, self.master.ident.certname, self.ctx, path, host=self.master.host, timeout=5
            )
            self.statuses.append(r.status)
        except OSError:
            pass


@pytest.mark.ci_on("debian12")
@pytest.mark.fleet(5)
def test_a_wedged_pool_is_out_until_its_jruby_is_free(fleet, agent_loops, testdir):
    tuning = st.master_tuning().with_jruby(borrow_timeout=BORROW_TIMEOUT * 1000)
    assert tuning.instances == 1
    did = fleet.ensure(
        tunings={"b": tuning},
        down=["a"],
        serve_flags=["--slow-start", "0s", "--wedged-after", f"{WEDGED_AFTER}s"],
    )
    record("wedged pool: the stack", did)
    h = fleet.h
    assert h is not None
    srv = fleet.srv["b"]
    with fleet.slow_environment("pmcheck_e2e_wedged", BLOCK) as env:
        with st.HAProxyWatch(h, fleet.backend) as ha, st.NodeWatch(fleet, ["b"]) as node:
            t0 = time.monotonic()
            # one agent whose catalog holds the JRuby
            loop = agent_loops(*fleet.agent_loop_args(testdir, environment=env)[0])
            st.wait_until("the blocking compile", lambda: st.compile_in_flight(fleet.b), 60, interval=0.2)
            asker = Asker(fleet.b, fleet.agents[1])
            with asker:
                try:
                    wedged, _ = st.wait_until(
                        "pmcheck of b to answer NOTREADY for a wedged pool",
                        lambda: next(
                            (s for s in node.answers("b", t0, time.monotonic()) if s.verdict == "NOTREADY"),
                            None,
                        ),
                        BORROW_TIMEOUT + WEDGED_AFTER + 20,
                        interval=0.2,
                    )
                    st.wait_until(
                        "HAProxy to take b out",
                        lambda: h.server(fleet.backend, srv)["status"].startswith("DOWN"),
                        15,
                    )
                finally:
                    # no new run: the blocking compile under way ends
                    loop.finish()
                ended = time.monotonic()
                back, _ = st.wait_until(
                    "pmcheck of b to answer OK again",
                    lambda: next(
                        (s for s in node.answers("b", ended - 1, time.monotonic()) if s.verdict == "OK"), None
                    ),
                    30,
                    interval=0.2,
                )
            st.wait_until(
                "HAProxy to take b back", lambda: h.server(fleet.backend, srv)["status"] == "UP", 30
            )
            t1 = time.monotonic()

    said = node.answers("b", t0, t1)
    turns = [s for i, s in enumerate(said) if i == 0 or s.verdict != said[i - 1].verdict]
    record(
        "wedged pool: pmcheck of b's verdicts",
        "; ".join(f"+{s.t - t0:.1f}s {s.verdict} {s.reason!r}" for s in turns)[:1500],
    )
    record("wedged pool: HAProxy's view of b", ha.changes(srv, t0, t1)[:600])
    refused = sum(1 for x in asker.statuses if x == 503)  # timed out waiting for the JRuby
    record(
        "wedged pool: timing",
        f"NOTREADY {wedged.t - t0:.1f}s after the start, OK again {back.t - ended:.1f}s after the "
        f"blocking run ended; node requests: {len(asker.statuses)} answered in time, {refused} of them 503",
    )
    # busy first: a full pool is not out by itself, for as long as borrows had not failed
    # for --wedged-after (under load, a probe may also time out on the way: DOWN, not OK)
    first_out = next(i for i, s in enumerate(said) if s.verdict != "OK")
    assert any(s.load == "busy" for s in said[:first_out]), node.changes("b", t0, t1)
    assert said[first_out].t >= said[0].t + BORROW_TIMEOUT, node.changes("b", t0, t1)
    assert "JRuby pool is wedged: none free and no borrow succeeded since" in wedged.reason, wedged.reason
    assert f"longer than --wedged-after {WEDGED_AFTER}s" in wedged.reason, wedged.reason
    pool = wedged.pool or {}
    assert pool.get("free") == 0 and pool.get("borrow_timeouts", 0) > 0, pool
    assert ha.out_of_service(srv, t0, t1) > 0, ha.changes(srv, t0, t1)
    assert back.pool and (back.pool["free"] >= 1 or back.pool["borrows"] > pool["borrows"]), (back, pool)
