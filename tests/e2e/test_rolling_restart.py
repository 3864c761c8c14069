"""A rolling restart of two compile masters behind HAProxy, with real agents running all along.

The session's two-master stack (the ``fleet`` fixture, e2e_stack/fleet.py): A on 127.0.0.2:8140
holds a throwaway CA made by `puppetserver ca setup`; B on 127.0.0.3:8140 runs with the CA
service disabled and a certificate signed by A's CA. Both certificates carry the load balancer's
name, `localhost` (127.0.0.1 in /etc/hosts), in their alt names. Each has its own `pmcheck serve`
(HTTP check and agent check, `--drained-status 404` as packaged) on its own address. One HAProxy
frontend on 127.0.0.1:8140 runs the shipped backend (`mode tcp`, `balance leastconn`, the shipped
timings), its two server lines pointing at the two masters and their pmchecks. Three `puppet
agent -t` loops, each with its own certname signed by the CA and its own ssldir and vardir, run
through the frontend against an environment whose catalog takes seconds to compile (in a code
dir the masters share, in the temp dir: the host's /etc/puppet/code is left alone).

0. The shipped Ansible playbook (packaging/ansible/rolling-restart.yml, run by Debian's
   ansible-core) refuses a batch that would take every master out, before touching any.
1. The rolling restart by that playbook over A and B (e2e_stack/ansible.py): each master through
   `pmcheck cycle -- puppetserver_ctl.py restart M`, begun while a catalog compile is under way on
   A: zero failed agent runs, HAProxy never without a master UP, B's cycle only once A is back.
1c. A play whose command fails on its first master, A: the play stops, A stays drained with the
   play's reason, B is not touched; the playbook's pre-check then refuses to begin while A is
   drained.
2. The baseline: A restarted by the same program without pmcheck, while a compile is under way
   on it: the agents see failed runs, so the zero above means something. The runs judged are
   those under way from the restart's start until 5 s after its stop; the test does not wait
   for the new JVM, and leaves A stopped (a later fleet test that needs it starts it again).

The restart program (puppetserver_ctl.py) stops the JVM as `systemctl stop puppetserver` does
with Debian's unit (default KillMode=control-group): SIGTERM to the JVM and everything it forked,
here its process group.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time

import pytest

import e2e_stack as st
from conftest import record

AGENTS = st.fleet.AGENTS
COMPILE_SECONDS = st.COMPILE_SECONDS
# how long after the baseline's stop a run that begins still counts for it: HAProxy's agent check
# (agent-inter 2s) takes A out within about 2 s of the stop
BASELINE_AFTER_STOP = 5
STEPS = ["drain", "wait-drained", "command", "wait-healthy", "undrain", "wait-undrained"]
CONNECTIONS = re.compile(r"up to (\d+) agent connection\(s\) in flight, the last closed after ([0-9.]+)s")


@pytest.mark.ci_on()  # CI: tests/fleet, the same roll, baseline and failing play on 3 booted masters
@pytest.mark.fleet(3)
def test_rolling_restart_zero_failed_runs(fleet, agent_loops, pmcheck_bin, testdir):
    t_test = time.monotonic()
    cycle_help = fleet.pm.run("cycle", "--help")
    assert cycle_help.returncode == 0, f"this pmcheck has no `cycle`:\n{cycle_help.stderr}"

    # -- both masters as made, both UP in HAProxy; each pmcheck believes what HAProxy, polling
    # from 127.0.0.1, says of it (the playbook believes only a load balancer that proves itself)
    fleet.ensure(serve_flags=["--lb-address", "127.0.0.1/32"])
    a, b = fleet.a, fleet.b
    serves, h, backend, srv = fleet.serves, fleet.h, fleet.backend, fleet.srv
    assert h is not None

    # -- 0. a batch of both masters is refused before anything is touched
    refused = st.ansible_roll(
        st.local_hosts(fleet, pmcheck_bin, ["a", "b"]), testdir / "roll-batch", extra={"pmcheck_batch": 2}
    )
    assert refused.code != 0 and not refused.cycles, refused.describe()
    assert "batches of 1 to 1" in refused.failed.get("a", ""), refused.describe()
    assert not any((serves[n].state_dir / "drain").exists() for n in ("a", "b")), "a refused play drained"

    # -- the agents, all along
    with fleet.slow_environment("pmcheck_e2e_rolling") as env:
        loops = [agent_loops(*args) for args in fleet.agent_loop_args(testdir, env)]

        def runs() -> list[st.AgentRunRecord]:
            return sorted((r for loop in loops for r in loop.runs), key=lambda r: r.start)

        def no_failure_yet() -> None:
            bad = [r for r in runs() if not r.ok]
            if bad:
                raise AssertionError(
                    f"agent run failed before the cycle (exit {bad[0].code}):\n{st.tail(bad[0].log, 30)}"
                )

        served_before = fleet.served_catalogs()

        def served_catalogs(m: st.PuppetServer) -> int:
            return fleet.served_catalogs()[m.name] - served_before[m.name]

        # warm: every agent has had a good run, and both masters have compiled (in this test)
        t0 = time.monotonic()
        st.wait_until(
            "a successful run of every agent, catalogs from both masters",
            lambda: all(loop.runs for loop in loops) and all(served_catalogs(m) for m in (a, b)),
            240, interval=0.5, alive=no_failure_yet,
        )  # fmt: skip
        first = runs()
        record(
            "rolling: agent runs before the cycle",
            f"{len(first)} ok; first runs took {', '.join(f'{r.end - r.start:.1f}s' for r in first[:AGENTS])}"
            f" (compile {COMPILE_SECONDS}s); warm after {time.monotonic() - t0:.1f}s",
        )

        with st.HAProxyWatch(h, backend) as watch:
            # -- 1. the rolling restart by the shipped playbook: A, then B, begun during a compile
            # on A
            st.wait_until(
                "a catalog compile in flight on a, b taking agents",
                lambda: st.compile_in_flight(a) and st.others_take_agents(serves["a"]),
                120,
                0.2,
            )
            roll = st.ansible_roll(st.local_hosts(fleet, pmcheck_bin, ["a", "b"]), testdir / "roll")
            t_cycles, t_cycles_end = roll.start, roll.end
            assert roll.code == 0, roll.describe() + "\n" + roll.output[-4000:]
            assert list(roll.cycles) == ["a", "b"], roll.describe()
            cycles = list(roll.cycles.values())
            for c in cycles:
                assert c.code == 0, (
                    f"pmcheck cycle of {c.master} exited {c.code}:\n" + "\n".join(c.stdout) + c.stderr
                )
                assert list(c.steps) == STEPS, c.stdout
            assert cycles[0].end <= cycles[1].start, "B's cycle began before A's had ended"
            # per master, the playbook printed the pre-check's word and the word after its cycle:
            # what HAProxy itself says
            for name in ("a", "b"):
                ups = [line for line in roll.said.get(name, []) if " says UP (weight" in line]
                assert len(ups) >= 2, f"{name}: {roll.said.get(name)}"
            worst_roll = watch.worst(t_cycles, t_cycles_end)
            assert worst_roll.fewest >= 1, f"HAProxy had no master UP during the roll: {worst_roll}"
            record("rolling: HAProxy during the Ansible roll", str(worst_roll))

            # -- 1b. two cycles on B at once: its restart, and a short one begun once the first
            # holds the drain. Neither may put B back while the other's command runs.
            results: dict[str, st.Cycle] = {}

            def cycle_in_thread(name: str, command: list[str] | None) -> threading.Thread:
                def go():
                    results[name] = st.run_cycle(
                        pmcheck_bin, b, serves["b"], testdir / f"cycle-b-{name}.stderr", command
                    )

                t = threading.Thread(target=go, name=f"cycle {name}")
                t.start()
                return t

            drain_b = serves["b"].state_dir / "drain"

            def held_by_cycles(n: int) -> bool:
                try:
                    held = json.loads(drain_b.read_text()).get("holders", [])
                except (OSError, ValueError):
                    return False
                return sum(1 for h in held if h.get("kind") == "cycle") >= n

            st.wait_until("A to take agents again", lambda: st.others_take_agents(serves["b"]), 120, 0.2)
            t_double = time.monotonic()
            restart_b = cycle_in_thread("restart", None)
            st.wait_until("the restart's cycle to hold B", lambda: held_by_cycles(1), 60, 0.1)
            short_b = cycle_in_thread("short", ["sleep", "3"])
            st.wait_until(
                "both cycles to hold B", lambda: held_by_cycles(2) or not short_b.is_alive(), 60, 0.1
            )
            for t in (restart_b, short_b):
                t.join(timeout=400)
                assert not t.is_alive(), f"{t.name} still runs"
            t_double_end = time.monotonic()
            double = [results["restart"], results["short"]]
            for c in double:
                assert c.code == 0, f"a cycle of two exited {c.code}:\n" + "\n".join(c.stdout) + c.stderr
            let_go = [c.steps["undrain"][2] for c in double]
            assert sum("removed " in d for d in let_go) == 1, let_go
            assert (
                sum("this cycle let go; the node stays drained, held by cycle pid" in d for d in let_go) == 1
            ), let_go
            # from the first command's start to the last one's end, HAProxy never had B UP
            c0 = min(c.window("command")[0] for c in double)
            c1 = max(c.window("command")[1] for c in double)
            seen = [s[srv["b"]]["status"] for _, s in watch.between(c0, c1)]
            assert seen and "UP" not in seen, f"B was UP during a cycle's command: {seen}"
            record(
                "rolling: two cycles on B at once",
                f"{t_double_end - t_double:.1f}s; HAProxy's view of B: {watch.changes(srv['b'], t_double, t_double_end)}; "
                f"let go: {let_go}",
            )

            # -- 1c. a play whose command fails on A: the play stops there, A stays drained with
            # the play's reason, B is untouched; the pre-check then refuses to begin
            b_jvm = b.pid()
            reason = "e2e: a play whose command fails"
            failing = st.ansible_roll(
                st.local_hosts(fleet, pmcheck_bin, ["a", "b"], "echo 'e2e: the upgrade failed' >&2; exit 3"),
                testdir / "roll-fails", extra={"pmcheck_reason": reason},
            )  # fmt: skip
            assert failing.code != 0 and list(failing.cycles) == ["a"], failing.describe()
            assert failing.cycles["a"].code != 0, failing.cycles["a"]
            assert "the roll stops here" in failing.failed.get("a", ""), failing.describe()
            assert "e2e: the upgrade failed" in failing.cycles["a"].stderr, failing.cycles["a"]
            held = json.loads((serves["a"].state_dir / "drain").read_text())["holders"]
            stopped = {"kind": "stopped-cycle", "what": f"{reason}; cycle stopped: the command exited with 3"}
            assert [{k: h[k] for k in stopped} for h in held] == [stopped], held
            verdict = serves["a"].get(headers={"User-Agent": st.fleet.USER_AGENT}).body
            assert verdict.startswith("DRAINED"), verdict
            assert not (serves["b"].state_dir / "drain").exists(), "the play touched B"
            assert b.pid() == b_jvm, "B's Puppet Server was restarted"
            again = st.ansible_roll(st.local_hosts(fleet, pmcheck_bin, ["a", "b"]), testdir / "roll-refused")
            assert again.code != 0 and not again.cycles, again.describe()
            assert "a is not taking agents" in again.failed.get("a", ""), again.describe()
            assert reason in again.failed["a"], again.describe()
            undo = fleet.pm.run("undrain", "--state-dir", str(serves["a"].state_dir))
            assert undo.returncode == 0, undo
            back = fleet.wait_serving(["a"])
            t_fail_end = time.monotonic()
            record(
                "rolling: a play whose command fails on A",
                f"{failing.end - failing.start:.1f}s; {failing.failed['a']}; the pre-check then: "
                f"{again.failed['a']}; A UP {back:.1f}s after `pmcheck undrain`",
            )

            # every run that overlapped the rolling restart, the two cycles and the failed play has
            # ended before the baseline begins (its restart of A fails the runs under way there)
            st.wait_until(
                "the runs under way at the end of the failed play to end",
                lambda: all(loop.current_start is None or loop.current_start > t_fail_end for loop in loops),
                120, interval=0.2,
            )  # fmt: skip

            jvm_cost = ", ".join(f"{m.name} RSS {st.rss_mib(m.pid())}" for m in (a, b))

            # -- 2. the baseline: A restarted by the same program, without pmcheck, during a
            # compile on it. What fails, fails within seconds of the stop: the test judges every
            # run under way from the restart's start until BASELINE_AFTER_STOP after the stop,
            # and does not wait the minute the new JVM takes (the fixture stops it by its PID).
            st.wait_until("a catalog compile in flight on a", lambda: st.compile_in_flight(a), 120, 0.2)
            t_base, wall_base = time.monotonic(), time.time()
            restart = subprocess.Popen(
                a.ctl_argv("restart"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            try:
                assert restart.stdout is not None
                stopped = restart.stdout.readline().strip()
                t_stopped = time.monotonic()
                assert "stopped in" in stopped, f"the baseline restart did not stop A: {stopped!r}"
                print(f"[e2e] baseline: {stopped}")
                t_judge = t_stopped + BASELINE_AFTER_STOP
                st.wait_until(
                    "every run under way during the baseline's stop to end",
                    lambda: time.monotonic() > t_judge
                    and all(loop.current_start is None or loop.current_start > t_judge for loop in loops),
                    120, interval=0.2,
                )  # fmt: skip
                t_base_end, wall_base_end = time.monotonic(), time.time()
            finally:
                # the runs under way now began after the judged window: cut short, not recorded
                for loop in loops:
                    loop.kill()
                st.stop_pid(restart, "puppetserver_ctl.py restart (baseline)", term_timeout=10)
                a.stop()
        base_watch = watch.changes(srv["a"], t_base, t_base_end)

    # -- what happened
    all_runs = runs()
    rolling = [r for r in all_runs if r.overlaps(t_cycles, t_cycles_end)]
    baseline = [r for r in all_runs if r.overlaps(t_base, t_base_end)]
    failed_rolling = [r for r in rolling if not r.ok]
    during_double = [r for r in all_runs if r.overlaps(t_double, t_double_end)]
    failed_double = [r for r in during_double if not r.ok]
    record(
        "rolling: agent runs during the two cycles on B",
        f"{len(during_double)} overlapped them, {len(failed_double)} failed",
    )
    assert during_double, "no agent run during the two cycles on B"
    assert not failed_double, "agent runs failed during the two cycles on B:\n" + "\n\n".join(
        f"{r.agent} run {r.number} (exit {r.code}, {r.log}):\n{st.tail(r.log, 25)}" for r in failed_double
    )
    failed_base = [r for r in baseline if not r.ok]
    record(
        "rolling: agent runs",
        f"{len(all_runs)} in all ({AGENTS} agents); {len(rolling)} overlapped the rolling restart "
        f"({t_cycles_end - t_cycles:.1f}s), {len(failed_rolling)} failed; {len(baseline)} overlapped the "
        f"baseline restart ({t_base_end - t_base:.1f}s), {len(failed_base)} failed",
    )
    waited_for_agents: list[bool] = []
    for c in cycles:
        m = a if c.master == "a" else b
        ctl = [line.split(": ", 2)[2] for line in c.stdout if line.startswith("puppetserver_ctl: ")]
        record(
            f"rolling: pmcheck cycle of {c.master} ({m.addr})",
            ", ".join(f"{name} {took:.1f}s" for name, (_, took, _) in c.steps.items())
            + f"; {c.end - c.start:.1f}s in all; the restart: {', '.join(ctl)}",
        )
        wd = c.steps["wait-drained"][2]
        conn = CONNECTIONS.search(wd)
        record(
            f"rolling: drain of {c.master} waited for in-flight runs",
            f"{c.steps['wait-drained'][1]:.1f}s: {wd}",
        )
        waited_for_agents.append(bool(conn and int(conn[1]) >= 1))
        # while its Puppet Server was restarted, HAProxy had no session on it
        c0, c1 = c.window("command")
        during = [int(s[srv[c.master]]["scur"]) for _, s in watch.between(c0, c1)]
        assert during and max(during) == 0, f"HAProxy sessions on {c.master} during its restart: {during}"
        record(
            f"rolling: HAProxy's view of {c.master} during its cycle",
            watch.changes(srv[c.master], c.start, c.end),
        )
        # runs were in flight during every step
        for name in STEPS:
            t0, t1 = c.window(name)
            busy = [r for r in all_runs if r.start <= t1 and r.end >= t0]
            assert busy, f"no agent run in flight during step {name} of {c.master}'s cycle"

    # the roll began during a compile on A: a drain had agents to wait for
    assert any(waited_for_agents), "no drain of the roll found an agent connection to wait for"
    assert not failed_rolling, "agent runs failed during the rolling restart:\n" + "\n\n".join(
        f"{r.agent} run {r.number} (exit {r.code}, {r.log}):\n{st.tail(r.log, 25)}" for r in failed_rolling
    )

    # the baseline: the harness does see failures
    assert failed_base, (
        f"no agent run failed while A restarted without a drain ({len(baseline)} runs overlapped it): "
        "the harness cannot see failures, so the rolling restart's zero means nothing"
    )
    record(
        "rolling: baseline (A restarted without pmcheck)",
        f"{len(failed_base)} of {len(baseline)} runs failed, exit codes "
        f"{sorted(r.code for r in failed_base)}; the restart program: {stopped}; "
        f"HAProxy's view of A: {base_watch}",
    )
    for r in failed_base:
        record(f"rolling: baseline failure, {r.agent} run {r.number}", st.errors_of(r))
    record(
        "rolling: HAProxy sessions on A that ended during the baseline restart (termination state: count)",
        repr(st.sessions_ended(h.log, srv["a"], wall_base, wall_base_end)),
    )
    record(
        "rolling: catalogs compiled in this test (access logs)",
        ", ".join(f"{m.name}: {served_catalogs(m)}" for m in (a, b)),
    )
    record("rolling: JVM cost after the rolling restart", f"{jvm_cost} (JAVA_ARGS {' '.join(a.java_args)})")
    record("rolling: the whole test", f"{time.monotonic() - t_test:.1f}s")
