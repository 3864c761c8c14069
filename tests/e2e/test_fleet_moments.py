"""Moments that happen on every compile master at once must not empty the backend.

On the session's two-master stack (the ``fleet`` fixture, e2e_stack/fleet.py: A and B behind
one HAProxy running the shipped backend, a `pmcheck serve` each), with three real agents running
through the load balancer all along against a catalog that takes seconds to compile:

1. Both JRuby pools flushed at the same moment through the admin API (`DELETE
   /puppet-admin-api/v1/jruby-pool`, the suite's admin certificate): pmcheck answers each a
   *pause* (200 `OK - paused: ...`, weight at the floor) while its pool refills, so HAProxy keeps
   at least one server UP in every sample and no agent run under way fails.
2. The baseline: the same with both pmchecks restarted with `--pause-grace 0s` (a flush is
   NOTREADY at once, as before the pause existed): HAProxy takes the servers out, so the zero
   above means something. What it costs is recorded.
3. B in multithreaded mode (one JRuby, three borrow slots, flushed internally every five
   borrows), A stopped (the rolling restart, which runs before, leaves it so): pmcheck speaks of
   borrow slots, its weight follows the free slots, and each internal flush is a pause, never
   NOTREADY, with no failed agent run.

HAProxy is sampled every 0.2 s (`show stat`); a server counts as taking agents only while its
status is UP (NOLB, DRAIN and DOWN take none).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import pytest

import e2e_stack as st
from conftest import record

# after both pools are back and HAProxy has both servers UP again, runs that begin within this
# long still count for the moment
MARGIN = 5
# the JSON's reason, and the first line of the plain-text answer HAProxy's HTTP check reads
PAUSED_REASON = re.compile(r"^paused: ")
PAUSED_BODY = re.compile(r"^200 OK - paused: ")
SLOTS = re.compile(r"(\d+) of (\d+) borrow slots (free|ready)")
# B in multithreaded mode: three borrow slots of one JRuby, flushed after five borrows (an agent
# run borrows about five times: node, plugin and locale metadata, catalog, report)
MT_SLOTS = 3
MT_MAX_REQUESTS = 5


@dataclass
class FlushMoment:
    """Both pools flushed at once under agents, and what was seen around it."""

    runs: list[st.AgentRunRecord]  # every run of the test
    judged: list[st.AgentRunRecord]  # those under way in [t_flush, t_end]
    sent: dict[str, st.Flush]  # master: its flush
    refill: dict[str, float | None]  # master: seconds from its DELETE until its log said refilled
    t_flush: float
    t_back: float  # both pools refilled and HAProxy had both UP
    t_end: float
    ha: st.HAProxyWatch
    node: st.NodeWatch

    @property
    def failed(self) -> list[st.AgentRunRecord]:
        return [r for r in self.judged if not r.ok]

    def spread(self) -> float:
        times = [f.t for f in self.sent.values()]
        return max(times) - min(times)

    def refill_text(self) -> str:
        return "; ".join(
            f"{n}: {'no refill logged' if r is None else f'refilled {r:.1f}s after its DELETE'}"
            for n, r in self.refill.items()
        )


def failures(runs: list[st.AgentRunRecord]) -> str:
    return "\n\n".join(
        f"{r.agent} run {r.number} (exit {r.code}, {r.log}):\n{st.tail(r.log, 25)}" for r in runs
    )


def flush_both_under_agents(fleet: st.Fleet, agent_loops, testdir, environment: str) -> FlushMoment:
    """Agents running; once a compile is under way, both pools flushed at the same moment; then
    until both masters logged their pool refilled, HAProxy has both servers UP, MARGIN more
    seconds, and every run begun by then has ended."""
    assert fleet.h is not None
    with fleet.slow_environment(environment) as env:
        loops = [agent_loops(*args) for args in fleet.agent_loop_args(testdir, environment=env)]

        def runs() -> list[st.AgentRunRecord]:
            return sorted((r for loop in loops for r in loop.runs), key=lambda r: r.start)

        def no_failure_yet() -> None:
            bad = [r for r in runs() if not r.ok]
            if bad:
                raise AssertionError(f"an agent run failed before the flush:\n{failures(bad[:1])}")

        served = fleet.served_catalogs()
        st.wait_until(
            "a successful run of every agent, catalogs from both masters",
            lambda: all(loop.runs for loop in loops)
            and all(n > served[m] for m, n in fleet.served_catalogs().items()),
            240, interval=0.5, alive=no_failure_yet,
        )  # fmt: skip
        try:
            with st.HAProxyWatch(fleet.h, fleet.backend) as ha, st.NodeWatch(fleet) as node:
                st.wait_until(
                    "a catalog compile in flight on a master, another agent's run under way",
                    lambda: any(st.compile_in_flight(m) for m in fleet.masters.values())
                    and sum(loop.in_flight() for loop in loops) >= 2,
                    120, interval=0.2,
                )  # fmt: skip
                t_flush = time.monotonic()
                sent = fleet.flush_at_once()
                st.wait_until(
                    "both pools refilled (their logs say), and HAProxy both servers UP",
                    lambda: all(fleet.refilled(f) is not None for f in sent.values())
                    and all(fleet.up(n) for n in fleet.masters),
                    180, interval=0.2,
                )  # fmt: skip
                t_back = time.monotonic()
                t_end = t_back + MARGIN
                st.wait_until(
                    "the runs under way at the end of the moment to end",
                    lambda: time.monotonic() > t_end
                    and all(loop.current_start is None or loop.current_start > t_end for loop in loops),
                    180, interval=0.2,
                )  # fmt: skip
        finally:
            # the runs under way now began after the judged window: cut short, not recorded
            for loop in loops:
                loop.kill()
    all_runs = runs()
    judged = [r for r in all_runs if r.overlaps(t_flush, t_end)]
    refill = {n: fleet.refilled(f) for n, f in sent.items()}
    return FlushMoment(all_runs, judged, sent, refill, t_flush, t_back, t_end, ha, node)


def record_moment(label: str, fleet: st.Fleet, fm: FlushMoment) -> None:
    record(
        f"{label}: agent runs",
        f"{len(fm.judged)} under way between the flush and {MARGIN}s after both were back "
        f"({fm.t_end - fm.t_flush:.1f}s), {len(fm.failed)} failed; run times {st.run_times(fm.judged)} "
        f"(before the flush: {st.run_times([r for r in fm.runs if r.end < fm.t_flush])})",
    )
    record(
        f"{label}: the two DELETEs",
        f"{', '.join(f'{n} {f.status}' for n, f in fm.sent.items())}, sent {fm.spread() * 1000:.0f} ms apart",
    )
    record(f"{label}: pools refilled", fm.refill_text())
    worst = fm.ha.worst(fm.t_flush, fm.t_end)
    record(
        f"{label}: HAProxy's worst moment", f"{worst} (+{worst.fewest_at - fm.t_flush:.1f}s after the flush)"
    )
    for name, server in fleet.srv.items():
        record(
            f"{label}: HAProxy's view of {name}",
            f"{fm.ha.changes(server, fm.t_flush, fm.t_end)}; out of service "
            f"{fm.ha.out_of_service(server, fm.t_flush, fm.t_end):.1f}s",
        )
        record(f"{label}: pmcheck of {name} answered", fm.node.changes(name, fm.t_flush - 0.5, fm.t_end))
    for r in fm.failed:
        record(f"{label}: failed run, {r.agent} run {r.number}", st.errors_of(r))


def agent_lines_seen(ha: st.HAProxyWatch, server: str, t0: float, t1: float) -> list[str]:
    """The agent check's texts HAProxy showed (last_agt), each once."""
    seen = [s[server]["last_agt"] for _, s in ha.between(t0, t1) if s.get(server, {}).get("last_agt")]
    return list(dict.fromkeys(seen))


@pytest.mark.ci_on("debian12")  # Debian 13 runs the HAProxy releases instead (docs/testing.md)
@pytest.mark.fleet(1)
def test_both_pools_flushed_at_once_leave_a_server_up(fleet, agent_loops, testdir):
    fleet.ensure()
    fm = flush_both_under_agents(fleet, agent_loops, testdir, "pmcheck_e2e_flush")
    record_moment("flush", fleet, fm)

    assert all(f.status == 204 for f in fm.sent.values()), f"the admin API refused a flush: {fm.sent}"
    assert fm.spread() < 0.1, f"the two flushes were {fm.spread():.3f}s apart"
    missing = [n for n, r in fm.refill.items() if r is None]
    assert not missing, f"no flush seen in the pool of {missing}: {fm.refill_text()}"

    # the mechanism, not luck: each pmcheck said paused while its pool refilled, never NOTREADY
    for name in fleet.masters:
        said = fm.node.answers(name, fm.t_flush, fm.t_end)
        paused = [s for s in said if s.paused]
        assert paused, f"pmcheck of {name} never said paused: {fm.node.changes(name, fm.t_flush, fm.t_end)}"
        for s in paused:
            assert s.verdict == "OK" and PAUSED_REASON.match(s.reason) and s.weight == 10, s
        not_ok = [s for s in said if s.verdict != "OK"]
        assert not not_ok, f"pmcheck of {name} answered {not_ok[0]} during the flush"
    record("flush: pmcheck's plain-text answer while paused", repr(fm.node.paused_body))
    for name in fleet.masters:
        assert PAUSED_BODY.match(fm.node.paused_body.get(name, "")), fm.node.paused_body
    lines = {n: agent_lines_seen(fm.ha, srv, fm.t_flush, fm.t_end) for n, srv in fleet.srv.items()}
    record("flush: agent check texts HAProxy showed", repr(lines))
    assert any("paused" in line for seen in lines.values() for line in seen), lines

    # HAProxy had a server to send agents to in every sample
    rows = fm.ha.between(fm.t_flush, fm.t_end)
    assert rows, "no HAProxy sample during the flush"
    empty = [round(t - fm.t_flush, 1) for t, servers in rows if not any(map(st.serving, servers.values()))]
    assert not empty, f"HAProxy had no server UP {len(empty)} times, at +{empty[:10]}s after the flush"

    assert fm.judged, "no agent run under way during the flush"
    assert not fm.failed, "agent runs failed during the flush:\n" + failures(fm.failed)


@pytest.mark.ci_on()  # by hand: CI leaves it out to fit the booted fleet in its time
@pytest.mark.fleet(2)
def test_flush_baseline_without_pause_takes_servers_out(fleet, agent_loops, testdir):
    fleet.ensure(serve_flags=["--pause-grace", "0s"])
    fm = flush_both_under_agents(fleet, agent_loops, testdir, "pmcheck_e2e_flush_baseline")
    record_moment("flush baseline (--pause-grace 0s)", fleet, fm)

    assert all(f.status == 204 for f in fm.sent.values()), f"the admin API refused a flush: {fm.sent}"
    for name in fleet.masters:
        said = fm.node.answers(name, fm.t_flush, fm.t_end)
        assert not any(s.paused for s in said), f"pmcheck of {name} paused with --pause-grace 0s"
    assert any(
        s.verdict == "NOTREADY" for n in fleet.masters for s in fm.node.answers(n, fm.t_flush, fm.t_end)
    ), "no pmcheck said NOTREADY for a flush with --pause-grace 0s"
    # HAProxy took servers out: what the pause in the test above spares
    out = {n: fm.ha.out_of_service(srv, fm.t_flush, fm.t_end) for n, srv in fleet.srv.items()}
    assert any(out.values()), f"HAProxy kept both servers UP without the pause: {out}"


@pytest.mark.ci_on()  # by hand: CI leaves it out to fit the booted fleet in its time
@pytest.mark.fleet(4)
def test_multithreaded_master_pauses_for_its_internal_flush(fleet, agent_loops, testdir):
    mt = st.master_tuning().with_jruby(
        multithreaded=True, max_active_instances=MT_SLOTS, max_requests_per_instance=MT_MAX_REQUESTS
    )
    # A down (the rolling restart leaves it so: nothing to start), B alone in multithreaded mode;
    # no slow start, so that every weight is the pool's
    fleet.ensure(tunings={"b": mt}, down=["a"], serve_flags=["--slow-start", "0s"])
    b, h = fleet.b, fleet.h
    assert h is not None
    config = fleet.pm.run("config", *fleet.serve_args("b"))
    assert config.returncode == 0, config.stderr
    rows = [line for line in config.stdout.splitlines() if line.startswith("multithreaded ")]
    record("multithreaded: pmcheck config", repr(rows))
    assert rows and rows[0].split()[1] == "true", config.stdout
    jvm = b.pid()
    log_lines = len(b.log.read_text(errors="replace").splitlines())

    with fleet.slow_environment("pmcheck_e2e_multithreaded") as env:
        loops = [agent_loops(*args) for args in fleet.agent_loop_args(testdir, environment=env)]

        def runs() -> list[st.AgentRunRecord]:
            return sorted((r for loop in loops for r in loop.runs), key=lambda r: r.start)

        def healthy() -> None:
            bad = [r for r in runs() if not r.ok]
            if bad:
                raise AssertionError(f"an agent run failed:\n{failures(bad[:1])}")
            if b.pid() != jvm:
                raise AssertionError(f"B's JVM changed: {jvm} -> {b.pid()}")

        with st.HAProxyWatch(h, fleet.backend) as ha, st.NodeWatch(fleet, ["b"]) as node:
            t0 = time.monotonic()

            def paused_twice_and_four_runs() -> bool:
                return (
                    len(node.episodes("b", t0, time.monotonic(), lambda s: s.paused)) >= 2
                    and len(runs()) >= 4
                )

            try:
                st.wait_until(
                    "pmcheck to answer two internal flushes paused, four agent runs", paused_twice_and_four_runs,
                    240, interval=0.5, alive=healthy,
                )  # fmt: skip
            except TimeoutError as e:
                raise AssertionError(
                    f"{e}\npmcheck of b answered: {node.changes('b', t0, time.monotonic())}"
                ) from e
            # the runs under way end, and no other begins
            for loop in loops:
                loop.finish()
            t1 = time.monotonic()

    all_runs = runs()
    said = node.answers("b", t0, t1)
    paused = node.episodes("b", t0, t1, lambda s: s.paused)
    steady = [s for s in said if s.verdict == "OK" and not s.paused and s.pool]
    weights = [s.weight for s in steady]
    # each internal flush replaces the one JRuby: "Cleaned up old JRubyInstance with id N."
    replaced = [
        line
        for line in b.log.read_text(errors="replace").splitlines()[log_lines:]
        if "Cleaned up old JRubyInstance" in line
    ]
    record(
        "multithreaded: agent runs",
        f"{len(all_runs)} ({sum(not r.ok for r in all_runs)} failed) in {t1 - t0:.1f}s, run times "
        f"{st.run_times(all_runs)}; B alone, {MT_SLOTS} borrow slots, max-requests-per-instance {MT_MAX_REQUESTS}",
    )
    record(
        "multithreaded: internal flushes answered paused",
        f"{len(paused)}: " + ", ".join(f"+{p0 - t0:.1f}s for {p1 - p0:.1f}s" for p0, p1 in paused),
    )
    record("multithreaded: JRuby instances B replaced (its log)", str(len(replaced)))
    record("multithreaded: pmcheck's weights (when not paused)", " ".join(map(str, dict.fromkeys(weights))))
    record("multithreaded: HAProxy's view of b", ha.changes(fleet.srv["b"], t0, t1)[:600])
    record("multithreaded: pmcheck answered", node.changes("b", t0, t1)[:1500])
    record("multithreaded: pmcheck's plain-text answer while paused", repr(node.paused_body))
    record(
        "multithreaded: agent check texts HAProxy showed",
        repr(agent_lines_seen(ha, fleet.srv["b"], t0, t1)[:6]),
    )

    assert all(r.ok for r in all_runs), "agent runs failed:\n" + failures([r for r in all_runs if not r.ok])
    not_ok = [s for s in said if s.verdict != "OK"]
    assert not not_ok, f"pmcheck of b answered {not_ok[0]}:\n{node.changes('b', t0, t1)}"
    assert len(paused) >= 2, node.changes("b", t0, t1)
    assert len(replaced) >= 2, f"B replaced its JRuby {len(replaced)} times: no internal flush to judge"
    for s in [s for s in said if s.paused]:
        assert PAUSED_REASON.match(s.reason) and s.weight == 10, s
    assert PAUSED_BODY.match(node.paused_body.get("b", "")), node.paused_body
    # the words speak of borrow slots of one multithreaded JRuby, and the weight follows them
    assert steady, f"no steady answer: {node.changes('b', t0, t1)}"
    for s in steady:
        m = SLOTS.search(s.reason)
        assert m and int(m[2]) == MT_SLOTS and "(one multithreaded JRuby)" in s.reason, (
            f"not slots: {s.reason!r}"
        )
        pool = s.pool
        assert pool["size"] == MT_SLOTS and pool.get("multithreaded") is True, (s.reason, pool)
        assert m[3] == "ready" or int(m[1]) == pool["free"], (s.reason, pool)
        want = max(10, 100 * max(pool["free"] - pool["waiting"], 0) // pool["size"])
        assert s.weight == want, f"weight {s.weight} for {pool} (want {want}): {s.reason!r}"
    assert len(set(weights)) >= 2, f"the weight never moved with the free slots: {weights}"
    # HAProxy never lost B, its only server
    gone = [round(t - t0, 1) for t, servers in ha.between(t0, t1) if not st.serving(servers[fleet.srv["b"]])]
    assert not gone, f"HAProxy had B out at +{gone[:10]}s"
