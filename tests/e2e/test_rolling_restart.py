"""A rolling restart of two compile masters behind HAProxy, with real agents running all along.

Two real Puppet Servers (e2e_stack.PuppetServer.master): A on 127.0.0.2:8140 holds a throwaway
CA made by `puppetserver ca setup`; B on 127.0.0.3:8140 runs with the CA service disabled and a
certificate signed by A's CA. Both certificates carry the load balancer's name, `localhost`
(127.0.0.1 in /etc/hosts), in their alt names. Each has its own `pmcheck serve` (HTTP check and
agent check, `--drained-status 404` as packaged) on its own address. One HAProxy frontend on
127.0.0.1:8140 runs the shipped backend (`mode tcp`, `balance leastconn`, the shipped timings),
its two server lines pointing at the two masters and their pmchecks. Three `puppet agent -t`
loops, each with its own certname signed by the CA and its own ssldir and vardir, run through
the frontend against an environment whose catalog takes seconds to compile (in a code dir the
masters share, in the temp dir: the host's /etc/puppet/code is left alone).

1. `pmcheck cycle -- puppetserver_ctl.py restart A`, then the same for B, each begun while a
   catalog compile is under way on that master: zero failed agent runs.
2. The baseline: A restarted by the same program without pmcheck, while a compile is under way
   on it: the agents see failed runs, so the zero above means something. The runs judged are
   those under way from the restart's start until 5 s after its stop; the test does not wait
   for the new JVM.

The restart program (puppetserver_ctl.py) stops the JVM as `systemctl stop puppetserver` does
with Debian's unit (default KillMode=control-group): SIGTERM to the JVM and everything it forked,
here its process group. It stops the session's Puppet Server, if this run started it:
127.0.0.1:8140 is the load balancer's here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

import e2e_stack as st
from conftest import record

A_HOST, B_HOST = "127.0.0.2", "127.0.0.3"
AGENTS = 3
COMPILE_SECONDS = 3
# how long after the baseline's stop a run that begins still counts for it: HAProxy's agent check
# (agent-inter 2s) takes A out within about 2 s of the stop
BASELINE_AFTER_STOP = 5
STEPS = ["drain", "wait-drained", "command", "wait-healthy", "undrain", "wait-undrained"]
STEP_LINE = re.compile(r"^pmcheck cycle: step (\S+) took ([0-9.]+)s: (.*)$")
CONNECTIONS = re.compile(r"up to (\d+) agent connection\(s\) in flight, the last closed after ([0-9.]+)s")
# HAProxy's tcplog: ... frontend backend/server Tw/Tc/Tt bytes TERMINATION-STATE ...
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TCPLOG = re.compile(r" (\S+)/(\S+) (-?\d+)/(-?\d+)/(\+?-?\d+) (\+?\d+) (\S\S) ")


class HAProxyWatch(st.Sampler):
    """Samples HAProxy's view of every server (status, current sessions, weight) every 0.2 s."""

    every = 0.2

    def __init__(self, h: st.HAProxy, backend: str):
        super().__init__("haproxy watch")
        self.h, self.backend = h, backend
        self.rows: list[tuple[float, dict[str, dict[str, str]]]] = []

    def sample(self) -> None:
        try:
            servers = {s["svname"]: s for s in self.h.servers(self.backend)}
            self.rows.append((time.monotonic(), servers))
        except (OSError, st.StackError):
            pass

    def between(self, t0: float, t1: float) -> list[tuple[float, dict[str, dict[str, str]]]]:
        return [r for r in self.rows if t0 <= r[0] <= t1]

    def changes(self, server: str, t0: float, t1: float) -> str:
        """The server's status and weight as they changed between t0 and t1, for people."""
        out, last = [], None
        for t, servers in self.between(t0, t1):
            s = servers.get(server)
            if s is None:
                continue
            now = (s["status"], s["weight"])
            if now != last:
                out.append(f"+{t - t0:.1f}s {s['status']} w{s['weight']}")
                last = now
        return ", ".join(out)


@dataclass
class Cycle:
    master: str
    code: int
    start: float
    end: float
    steps: dict[str, tuple[float, float, str]] = field(default_factory=dict)  # name: (t_end, took, detail)
    stdout: list[str] = field(default_factory=list)
    stderr: str = ""

    def window(self, name: str) -> tuple[float, float]:
        t_end, took, _ = self.steps[name]
        return t_end - took, t_end


def others_take_agents(serve: st.PmcheckServe) -> bool:
    """The load balancer's latest word to ``serve`` counts another server in the backend: a
    cycle's last-server guard lets it drain (a master whose pool is refilling is briefly out)."""
    answer = serve.get(headers={"User-Agent": "pmcheck/e2e", "Accept": "application/json"}).json()
    seen = [s["seen"] for p in answer.get("pollers", []) for s in p.get("states", []) if s.get("seen")]
    return bool(seen) and all(s["total_weight"] > s["weight"] for s in seen)


def run_cycle(
    pmcheck_bin: str, master: st.PuppetServer, serve: st.PmcheckServe, log, command: list[str] | None = None
) -> Cycle:
    """`pmcheck cycle ... -- puppetserver_ctl.py restart MASTER` (or ``command``), its stdout read
    line by line as it comes (each step's end is when its line arrived)."""
    cmd = [
        pmcheck_bin, "cycle", "--url", serve.url, "--state-dir", str(serve.state_dir),
        "--reason", "e2e rolling restart", "--max-wait", "5m", "--", *(command or master.ctl_argv("restart")),
    ]  # fmt: skip
    print(f"[e2e] $ {' '.join(cmd)}")
    lines: list[tuple[float, str]] = []
    start = time.monotonic()
    with open(log, "w+") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True,
            env=st.clean_env(), start_new_session=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append((time.monotonic(), line.rstrip("\n")))
                print(f"[e2e]   {line.rstrip()}")
            code = proc.wait(timeout=30)
        finally:
            st.stop_pid(proc, "pmcheck cycle", term_timeout=30)
        err.seek(0)
        stderr = err.read()
    c = Cycle(master.name, code, start, time.monotonic(), stdout=[line for _, line in lines], stderr=stderr)
    for t, line in lines:
        m = STEP_LINE.match(line)
        if m:
            c.steps[m[1]] = (t, float(m[2]), m[3])
    return c


def compile_in_flight(master: st.PuppetServer, within: float = 1.0) -> bool:
    """A catalog compile is under way on the master: one of its JRubies is borrowed for a catalog
    request, and the compile's `generate('/bin/sleep', ...)` began less than ``within`` seconds
    ago (a child of the master's JVM), so that it has seconds left."""
    jvm = master.pid()
    if jvm is None or not any(age < within for age in sleeping_children(jvm)):
        return False
    pool = master.pool()
    return bool(pool) and any("/puppet/v3/catalog/" in json.dumps(b) for b in pool["borrowed-instances"])


def sleeping_children(ppid: int) -> list[float]:
    """The age in seconds of each `/bin/sleep` whose parent is ``ppid``."""
    ticks = os.sysconf("SC_CLK_TCK")
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    ages = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) != ppid:
                continue
            if Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")[0] != b"/bin/sleep":
                continue
        except (OSError, IndexError, ValueError):
            continue
        ages.append(uptime - int(stat[19]) / ticks)
    return ages


def rss_mib(pid: int | None) -> str:
    if pid is None:
        return "?"
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return f"{int(line.split()[1]) // 1024} MiB"
    return "?"


def errors_of(run: st.AgentRunRecord) -> str:
    """The run's errors on one line (Facter's complaints about /proc/1/environ, which every run
    here has, left out)."""
    lines = [ANSI.sub("", line) for line in run.log.read_text(errors="replace").splitlines()]
    errs = [line for line in lines if line.startswith("Error:") and "Facter:" not in line]
    return " | ".join(errs[-4:] or lines[-4:])


def sessions_ended(log, server: str, t0: float, t1: float) -> dict[str, int]:
    """HAProxy's tcplog: how the sessions on ``server`` that ended between wall-clock times t0
    and t1 ended (termination state: count; ``--`` is a normal end)."""
    ended: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = TCPLOG.search(line)
        accepted = re.search(r"\[(\d+/\w+/\d+:\d+:\d+:\d+\.\d+)\]", line)
        if not m or not accepted or m[2] != server:
            continue
        start = datetime.strptime(accepted[1], "%d/%b/%Y:%H:%M:%S.%f").timestamp()
        end = start + int(m[5].lstrip("+")) / 1000
        if t0 <= end <= t1 + 1:
            ended[m[7]] = ended.get(m[7], 0) + 1
    return ended


@pytest.mark.usefixtures("loopback_8140")
def test_rolling_restart_zero_failed_runs(
    compile_masters, agent_loops, pmcheck, pmcheck_bin, haproxy, shipped_haproxy, testdir
):
    t_test = time.monotonic()
    cycle_help = pmcheck.run("cycle", "--help")
    assert cycle_help.returncode == 0, f"this pmcheck has no `cycle`:\n{cycle_help.stderr}"

    # -- certificates: A's CA by Puppet's own tool, the rest signed by it
    # one code dir for both masters, in the test's dir, as a shared code volume would be
    code = testdir / "code"
    a = compile_masters("a", A_HOST, "compile-a.pmcheck.test", ca=True, codedir=code)
    b = compile_masters("b", B_HOST, "compile-b.pmcheck.test", ca=False, codedir=code)
    t0 = time.monotonic()
    a.setup_ca()
    b.issue_own_cert(a)
    agents = [
        st.Identity(f"agent{i}.pmcheck.test", testdir / f"agent{i}" / "ssl") for i in range(1, AGENTS + 1)
    ]
    for ident in agents:
        a.issue(ident)
    record("rolling: CA, 2 master and 3 agent certificates", f"{time.monotonic() - t0:.1f}s")

    # -- both JVMs at once, and meanwhile the pmchecks and HAProxy
    t0 = time.monotonic()
    starting = {
        m.name: subprocess.Popen(
            m.ctl_argv("start"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        for m in (a, b)
    }
    try:
        serves, agent_ports = {}, {}
        for m in (a, b):
            agent_port = agent_ports[m.name] = st.free_port(m.host)
            serves[m.name] = pmcheck.serve(
                testdir / f"state-{m.name}",
                "--agent-listen", f"{m.host}:{agent_port}",
                "--drained-status", "404",
                "--certname", m.ident.certname,
                "--hostcert", str(m.ident.hostcert),
                "--hostprivkey", str(m.ident.hostprivkey),
                "--localcacert", str(m.ident.localcacert),
                "--puppet-addr", m.addr,
                name=m.name, host=m.host,
            )  # fmt: skip
        targets = [(m.addr, serves[m.name].port, agent_ports[m.name]) for m in (a, b)]
        cfg, backend, servers = st.render_haproxy(shipped_haproxy, st.PUPPET_PORT, 0, targets=targets)
        assert "balance leastconn" in cfg and "mode tcp" in cfg and "disable-on-404" in cfg, cfg
        h = haproxy("lb", cfg, "packaging/haproxy/pmcheck.cfg (two masters on 127.0.0.2, 127.0.0.3)")
        srv = dict(zip(("a", "b"), servers, strict=True))
        for name, p in starting.items():
            out, _ = p.communicate(timeout=400)
            assert p.returncode == 0, f"starting master {name} failed:\n{out}"
            print(f"[e2e] {out.strip()}")
    finally:
        for p in starting.values():
            st.stop_pid(p, "puppetserver_ctl.py start", term_timeout=10)
    took_start = time.monotonic() - t0
    record(
        "rolling: both masters started at once",
        f"{took_start:.1f}s until both ready; JAVA_ARGS {' '.join(a.java_args)}, "
        f"max-active-instances {a.instances} each",
    )

    def up(s):
        return st.is_up_checked(s) and s["agent_status"].lstrip("* ") == "L7OK"

    for m in (a, b):
        h.wait_server(backend, srv[m.name], up, "UP, agent check L7OK", 60)

    # -- the agents, all along
    with st.slow_environment("pmcheck_e2e_rolling", COMPILE_SECONDS, code / "environments") as env:
        loops = [
            agent_loops(ident, testdir / f"agent{i}", st.LB_NAME, st.PUPPET_PORT, env)
            for i, ident in enumerate(agents, 1)
        ]

        def runs() -> list[st.AgentRunRecord]:
            return sorted((r for loop in loops for r in loop.runs), key=lambda r: r.start)

        def no_failure_yet() -> None:
            bad = [r for r in runs() if not r.ok]
            if bad:
                raise AssertionError(
                    f"agent run failed before the cycle (exit {bad[0].code}):\n{st.tail(bad[0].log, 30)}"
                )

        def served_catalogs(m: st.PuppetServer) -> int:
            return m.access_log.read_text().count("/puppet/v3/catalog/")

        # warm: every agent has had a good run, and both masters have compiled
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

        with HAProxyWatch(h, backend) as watch:
            # -- 1. the rolling restart: A, then B, each begun during a compile on it
            cycles: list[Cycle] = []
            t_cycles = time.monotonic()
            for m in (a, b):
                _, waited = st.wait_until(
                    f"a catalog compile in flight on {m.name}, the other master taking agents",
                    lambda m=m: compile_in_flight(m) and others_take_agents(serves[m.name]),
                    120,
                    0.2,
                )
                c = run_cycle(pmcheck_bin, m, serves[m.name], testdir / f"cycle-{m.name}.stderr")
                cycles.append(c)
                assert c.code == 0, (
                    f"pmcheck cycle of {m.name} exited {c.code}:\n" + "\n".join(c.stdout) + f"\n{c.stderr}"
                )
                assert list(c.steps) == STEPS, c.stdout
            t_cycles_end = time.monotonic()

            # -- 1b. two cycles on B at once: its restart, and a short one begun once the first
            # holds the drain. Neither may put B back while the other's command runs.
            results: dict[str, Cycle] = {}

            def cycle_in_thread(name: str, command: list[str] | None) -> threading.Thread:
                def go():
                    results[name] = run_cycle(
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

            st.wait_until("A to take agents again", lambda: others_take_agents(serves["b"]), 120, 0.2)
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

            # every run that overlapped the rolling restart and the two cycles has ended before
            # the baseline begins (its restart of A fails the runs under way there)
            st.wait_until(
                "the runs under way at the end of the two cycles on B to end",
                lambda: all(loop.current_start is None or loop.current_start > t_double_end for loop in loops),
                120, interval=0.2,
            )  # fmt: skip

            jvm_cost = ", ".join(f"{m.name} RSS {rss_mib(m.pid())}" for m in (a, b))

            # -- 2. the baseline: A restarted by the same program, without pmcheck, during a
            # compile on it. What fails, fails within seconds of the stop: the test judges every
            # run under way from the restart's start until BASELINE_AFTER_STOP after the stop,
            # and does not wait the minute the new JVM takes (the fixture stops it by its PID).
            st.wait_until("a catalog compile in flight on a", lambda: compile_in_flight(a), 120, 0.2)
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
        # the cycle began during a compile on this master: the drain had agents to wait for
        assert conn and int(conn[1]) >= 1, f"the drain of {c.master} found no agent connection: {wd!r}"
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
        record(f"rolling: baseline failure, {r.agent} run {r.number}", errors_of(r))
    record(
        "rolling: HAProxy sessions on A that ended during the baseline restart (termination state: count)",
        repr(sessions_ended(h.log, srv["a"], wall_base, wall_base_end)),
    )
    record(
        "rolling: catalogs compiled (access logs)",
        ", ".join(f"{m.name}: {m.access_log.read_text().count('/puppet/v3/catalog/')}" for m in (a, b)),
    )
    record("rolling: JVM cost after the rolling restart", f"{jvm_cost} (JAVA_ARGS {' '.join(a.java_args)})")
    record("rolling: the whole test", f"{time.monotonic() - t_test:.1f}s")
