"""Two masters drained, or cycled, at the same instant never both leave the backend.

Trust round two, defect 4: on e5ddf73 two drains within about a second of each other both passed
the last-server guard and HAProxy showed both NOLB, and two cycles at once both let go. On the
fleet's two masters (each with its own Puppet Server and pmcheck, behind HAProxy running the
shipped backend with the stack's key), with no agents running:

1. `pmcheck drain` on A and on B started at the same instant, DRAINS times: one stands (exit
   0), the other backs off (exit 77): held by the load balancer's own checks and undone, or,
   when it asked a moment after the other went out, refused by the guard; HAProxy shows a
   server taking agents in every sample.
2. `pmcheck cycle` on A and on B started at the same instant, CYCLES times, each running a
   command that takes seconds: both succeed, their commands run one after the other (the
   second waits its turn), and HAProxy shows a server taking agents in every sample.
"""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

import e2e_stack as st
from conftest import record

DRAINS = 4
CYCLES = 2
COMMAND_SECONDS = 3


def at_once(calls: dict[str, object]) -> dict[str, object]:
    """Runs each call on a thread of its own, all released at the same instant; their results."""
    barrier = threading.Barrier(len(calls))
    results: dict[str, object] = {}

    def run(name: str, call) -> None:
        barrier.wait()
        results[name] = call()

    threads = [threading.Thread(target=run, args=item) for item in calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return results


@pytest.mark.ci_on()  # by hand: CI leaves it out to fit the booted fleet in its time
@pytest.mark.fleet(6)
def test_colliding_drains_and_cycles_take_turns(fleet, testdir):
    did = fleet.ensure(serve_flags=["--slow-start", "0s"])
    record("colliding drains: the stack", did)
    h = fleet.h
    assert h is not None
    pm = fleet.pm
    with st.HAProxyWatch(h, fleet.backend) as ha:
        # 1. drains
        stood_counts = {name: 0 for name in fleet.masters}
        backed_off = {"undone": 0, "guard": 0}
        for rep in range(DRAINS):
            fleet.wait_serving(fleet.masters, 60)
            t0 = time.monotonic()

            def drain(name: str, rep: int = rep):
                serve = fleet.serves[name]
                return subprocess.run(
                    [pm.binary, "drain", "--reason", f"collide {rep}", "--url", serve.url,
                     "--state-dir", str(serve.state_dir)],
                    capture_output=True, text=True, timeout=60, env=st.clean_env(), stdin=subprocess.DEVNULL,
                )  # fmt: skip

            done = at_once({name: (lambda name=name: drain(name)) for name in fleet.masters})
            codes = {name: cp.returncode for name, cp in done.items()}
            for name, cp in done.items():
                print(f"[e2e] drain {name}: exit {cp.returncode}\n{cp.stdout}{cp.stderr}")
            assert sorted(codes.values()) == [0, 77], (codes, {n: cp.stderr for n, cp in done.items()})
            stood = next(name for name, code in codes.items() if code == 0)
            backed = next(name for name, code in codes.items() if code == 77)
            stood_counts[stood] += 1
            # backed off: held by the load balancer's checks and undone, or, started a moment
            # after the other went out, refused by the guard before writing anything
            how = "undone" if "This drain was undone" in done[backed].stderr else "guard"
            assert how == "undone" or "is the only server taking new agents" in done[backed].stderr, done[
                backed
            ].stderr
            backed_off[how] += 1
            assert not (fleet.serves[backed].state_dir / "drain").exists(), "the held drain stayed"
            # HAProxy takes the one that stood out, and never the other
            st.wait_until(
                f"HAProxy to take {stood} out",
                lambda stood=stood: not st.serving(h.server(fleet.backend, fleet.srv[stood])),
                15,
            )
            t1 = time.monotonic()
            worst = ha.worst(t0, t1)
            assert worst.zero == 0, f"drains {rep}: {worst}; {ha.changes(fleet.srv[backed], t0, t1)}"
            cp = pm.run(
                "undrain", "--wait", "--url", fleet.serves[stood].url,
                "--state-dir", str(fleet.serves[stood].state_dir), timeout=60,
            )  # fmt: skip
            assert cp.returncode == 0, cp.stderr
        record(
            "colliding drains: which one stood",
            f"{stood_counts} over {DRAINS} pairs started at once; the other {backed_off}",
        )

        # 2. cycles
        for rep in range(CYCLES):
            fleet.wait_serving(fleet.masters, 60)
            t0 = time.monotonic()

            def cycle(name: str, rep: int = rep) -> st.Cycle:
                marks = testdir / f"cycle-{rep}-{name}.txt"
                command = [
                    "sh",
                    "-c",
                    f"date +%s.%N > {marks}; sleep {COMMAND_SECONDS}; date +%s.%N >> {marks}",
                ]
                log = testdir / f"cycle-{rep}-{name}.log"
                return st.run_cycle(
                    pm.binary,
                    fleet.masters[name],
                    fleet.serves[name],
                    log,
                    command=command,
                    reason=f"collide {rep}",
                )

            done = at_once({name: (lambda name=name: cycle(name)) for name in fleet.masters})
            t1 = time.monotonic()
            for name, c in done.items():
                assert c.code == 0, (name, c.stdout, c.stderr)
            windows = {}
            for name in fleet.masters:
                start, end = (float(x) for x in (testdir / f"cycle-{rep}-{name}.txt").read_text().split())
                windows[name] = (start, end)
            (a0, a1), (b0, b1) = windows["a"], windows["b"]
            assert a1 <= b0 or b1 <= a0, f"the commands overlapped: {windows}"
            worst = ha.worst(t0, t1)
            assert worst.zero == 0, f"cycles {rep}: {worst}"
            first = min(windows, key=lambda n: windows[n][0])
            second = max(windows, key=lambda n: windows[n][0])
            waited = [
                line for line in done[second].stderr.splitlines() if "held" in line or "its turn" in line
            ]
            record(
                f"colliding cycles {rep + 1}: took turns",
                f"{first}'s command, then {second}'s {windows[second][0] - windows[first][1]:.1f}s after it "
                f"ended; {t1 - t0:.1f}s in all; HAProxy: {worst}; the second waited: {waited[:1]}",
            )
