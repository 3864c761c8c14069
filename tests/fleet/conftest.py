"""The booted fleet of scripts/check-fleet, as its load balancer's namespace sees it.

Three compile masters (Debian 13 roots booted with systemd, Puppet Server 8.7, pmcheck's .deb) are
reached by address and by SSH. Started here once for the whole run: HAProxy 3.0 with the shipped
backend in front of them, three agents looping through it, and two watchers, of HAProxy's own view
and of each master's answer on port 9200. The tests act on the masters only as an operator would,
over SSH.

These tests run only there (scripts/check-fleet sets PMCHECK_FLEET_*); anywhere else each skips
loudly, and fails under CI=true.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
import e2e_stack as st  # noqa: E402 - found through the path above

REPO = Path(__file__).resolve().parents[2]
SHIPPED_HAPROXY = REPO / "packaging" / "haproxy" / "pmcheck.cfg"
ENVIRONMENT = "fleet"  # the agents' environment on every master: a catalog that compiles for seconds
# Seconds between an agent's runs: three loops with none take a core from the masters' JVMs.
AGENT_PAUSE = 2.0
STRICT = os.environ.get("CI") == "true"
# What a master's pmcheck answers while held for a stop, a cycle or an operator (packaged: 404).
DRAINED = "DRAINED"


def measured(name: str, value: str) -> None:
    """A figure worth reporting; pytest shows it with the test's output (-rA) or on failure."""
    print(f"[fleet] MEASURED {name}: {value}")


@dataclass
class Master:
    name: str  # master1
    addr: str  # on the fleet's network
    server: str  # its server line in HAProxy's backend (compile01)

    @classmethod
    def of(cls, name: str) -> Master:
        """The host NAME as scripts/check-fleet made it, which names its address and server line."""
        return cls(name, os.environ[f"PMCHECK_FLEET_ADDR_{name}"], os.environ[f"PMCHECK_FLEET_SERVER_{name}"])

    def ssh(self, command: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        """COMMAND as root on the master, as an operator types it there."""
        cp = subprocess.run(
            ["ssh", self.name, command], capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if check and cp.returncode != 0:
            raise st.StackError(
                f"ssh {self.name} {command!r} exited {cp.returncode}:\n{cp.stdout[-2000:]}{cp.stderr[-2000:]}"
            )
        return cp

    def jvm(self) -> str:
        """Puppet Server's MainPID, as systemd says."""
        return self.ssh("systemctl show -p MainPID --value puppetserver").stdout.strip()

    def answer(self, timeout: float = 1.0) -> tuple[int, str]:
        """pmcheck's answer on port 9200 to a poll that proves nothing (a drain the drain rule
        holds for a proven load balancer shows DRAINED here): its status code and first line
        (``VERDICT - reason``). Asked at /status, which is not a poll: polled at /, this watch
        would be a second, unproven poller on the load balancer's address, and every wait would
        wait it out by time; this way the waits and the guard go by the proven checks of the
        load balancer alone, as on a user's fleet. An answer that is not pmcheck's JSON raises
        OSError, as a failed connection does."""
        r = st.http_request(
            9200, "/status", headers={"User-Agent": "pmcheck/fleet"}, host=self.addr, timeout=timeout
        )
        try:
            answer = json.loads(r.body)
            return r.status, f"{answer['verdict']} - {answer['reason']}"
        except (ValueError, KeyError, TypeError) as e:
            raise OSError(
                f"/status answered {r.status} without pmcheck's JSON ({e!r}): {r.body[:200]!r}"
            ) from e

    def journal(self, since_wall: float) -> list[tuple[float, str]]:
        """The master's journal since a wall-clock time: (time, `UNIT: message` as journalctl
        short-unix prints it, without the host name)."""
        out = self.ssh(f"journalctl --since @{since_wall:.3f} -o short-unix --no-pager -q").stdout
        lines = []
        for line in out.splitlines():
            stamp, _, rest = line.partition(" ")
            try:
                lines.append((float(stamp), rest.partition(" ")[2]))
            except ValueError:
                continue
        return lines

    def heard_up(self) -> bool:
        """Whether every load balancer that proves itself said UP (no transition, weight above
        0) in its last check, as `pmcheck status --json` shows and the playbook's pre-check reads."""
        out = self.ssh("pmcheck status --json", check=False).stdout
        try:
            seen = st.fleet.lb_views(json.loads(out), proven_within_ms=10000)
        except ValueError:
            return False
        return bool(seen) and all(
            v.get("health") == "UP" and not v.get("transition") and (v.get("weight") or 0) > 0 for v in seen
        )

    def drain_record(self) -> dict | None:
        cp = self.ssh("cat /var/lib/pmcheck/drain", check=False)
        return json.loads(cp.stdout) if cp.returncode == 0 else None


@dataclass
class Answer:
    t: float  # time.monotonic()
    code: int  # 0: no answer
    line: str


class AnswerWatch(st.Sampler):
    """Each master's answer on port 9200, every 0.25 s, as HAProxy's check would get it."""

    every = 0.25

    def __init__(self, masters: list[Master]):
        super().__init__("answer watch")
        self.masters = masters
        self.rows: dict[str, list[Answer]] = {m.name: [] for m in masters}

    def sample(self) -> None:
        for m in self.masters:
            t = time.monotonic()
            try:
                code, line = m.answer()
            except OSError as e:
                code, line = 0, f"no answer: {e}"
            self.rows[m.name].append(Answer(t, code, line))

    def between(self, m: Master, t0: float, t1: float) -> list[Answer]:
        return [a for a in self.rows[m.name] if t0 <= a.t <= t1]


class Fleet:
    def __init__(self, workdir: Path):
        self.dir = workdir
        domain = os.environ["PMCHECK_FLEET_DOMAIN"]
        self.frontend = f"puppet.{domain}"
        self.masters = [Master.of(name) for name in os.environ["PMCHECK_FLEET_MASTERS"].split()]
        # The master that joins the backend by itself through PuppetDB (test_members.py).
        self.joiner = Master.of(os.environ["PMCHECK_FLEET_JOINER"])
        self.agent_names = [f"{a}.{domain}" for a in os.environ["PMCHECK_FLEET_AGENTS"].split()]
        self.net = os.environ["PMCHECK_FLEET_LB_ADDR"].rsplit(".", 1)[0]
        self.key = Path("/root/lb-key").read_text().strip()
        self.wall_minus_mono = time.time() - time.monotonic()
        self.h: st.HAProxy | None = None
        self.backend = ""
        self.port = 0
        self.agents: list[st.AgentLoop] = []
        self.ha: st.HAProxyWatch | None = None
        self.answers = AnswerWatch(self.masters)

    def wall(self, mono: float) -> float:
        return mono + self.wall_minus_mono

    def mono(self, wall: float) -> float:
        return wall - self.wall_minus_mono

    # -- starting

    def start_haproxy(self) -> None:
        """The shipped file with one more server line (three masters), each pointing at its
        master's address, check port 9200 and agent port 9201 as packaged, with the fleet's key."""
        text = SHIPPED_HAPROXY.read_text()
        lines = re.findall(r"(?m)^\s*server\s+compile02\s.*$", text)
        if len(lines) != 1:
            raise st.StackError("the shipped HAProxy file has no single `server compile02` line")
        # compile03 names itself in its agent-send too.
        text = text.replace(lines[0], lines[0] + "\n" + lines[0].replace("compile02", "compile03"), 1)
        self.port = st.free_port()
        body, self.backend, names = st.render_haproxy(
            text, self.port, 9200,
            targets=[(f"{m.addr}:8140", 9200, 9201) for m in self.masters],
            key=self.key, network=rf"(127|{re.escape(self.net)})\.\d+(\.\d+\.\d+)?",
        )  # fmt: skip
        if names != [m.server for m in self.masters]:
            raise st.StackError(f"server lines {names}, expected {[m.server for m in self.masters]}")
        # As Debian's unit runs it (master-worker), so that test_members.py reloads it.
        self.h = st.HAProxy(
            self.dir, "fleet", body, "packaging/haproxy/pmcheck.cfg, three masters", master_worker=True
        )
        self.h.start()
        for m in self.masters:
            self.h.wait_server(self.backend, m.server, st.is_up_checked, "UP", 120)

    def start_agents(self) -> None:
        for name in self.agent_names:
            ident = st.Identity(name, Path(f"/var/lib/pmcheck-fleet/{name.split('.')[0]}/ssl"))
            loop = st.AgentLoop(ident, self.dir / name, self.frontend, self.port, ENVIRONMENT, AGENT_PAUSE)
            loop.start()
            self.agents.append(loop)
        # Every agent through the load balancer once, before any test counts runs.
        st.wait_until(
            "a successful run of every agent",
            lambda: all(any(r.ok for r in a.runs) for a in self.agents),
            300,
            interval=0.5,
            alive=self.check_agents,
        )

    def check_agents(self) -> None:
        for a in self.agents:
            if a.error is not None:
                raise st.StackError(f"agent loop {a.ident.certname} broke: {a.error!r}")
        bad = [r for a in self.agents for r in a.runs if not r.ok]
        if len(bad) >= 3:
            raise st.StackError(f"agents fail through the load balancer: {st.errors_of(bad[-1])}")

    # -- what happened

    def runs(self, t0: float, t1: float) -> list[st.AgentRunRecord]:
        """Agent runs that overlapped [t0, t1] (time.monotonic())."""
        return [r for a in self.agents for r in a.runs if r.overlaps(t0, t1)]

    def failed(self, t0: float, t1: float) -> list[st.AgentRunRecord]:
        return [r for r in self.runs(t0, t1) if not r.ok]

    def describe_failed(self, runs: list[st.AgentRunRecord]) -> str:
        return "; ".join(f"{r.agent} run {r.number} (exit {r.code}): {st.errors_of(r)}" for r in runs)

    def explain(self, run: st.AgentRunRecord) -> str:
        """Where a failed run was sent, and what that master's stop and Puppet Server did around
        it, in seconds from the run's start. A run is one session through HAProxy (the agent
        keeps its connection), which HAProxy's tcplog names with the server: the candidates are
        the sessions accepted during the run that ended within a second of it."""
        assert self.h is not None and self.ha is not None
        t0, t1 = self.wall(run.start), self.wall(run.end)
        lines = [f"{run.agent} run {run.number}, {run.end - run.start:.1f}s:"]
        for s in st.fleet.sessions(self.h.log):
            m = next((m for m in self.masters if m.server == s.server), None)
            if m is None or not (t0 <= s.accepted <= t1 and abs(s.ended - t1) < 1.0):
                continue
            lines.append(
                f"  a session on {s.server} ({m.name}) +{s.accepted - t0:.1f}s to +{s.ended - t0:.1f}s, "
                f"ended {s.termination}; HAProxy had it {self.ha.changes(s.server, run.start - 20, run.end)}"
                " (from 20s before the run)"
            )
            journal = m.ssh(
                "journalctl -u pmcheck-drain-on-stop@puppetserver -u puppetserver -o short-unix -q "
                f"--no-pager --since @{t0 - 20:.3f} --until @{t1 + 2:.3f}",
                check=False,
            ).stdout
            for entry in journal.splitlines():
                stamp, _, rest = entry.partition(" ")
                try:
                    lines.append(f"    {float(stamp) - t0:+.1f}s {rest.partition(' ')[2][:400]}")
                except ValueError:
                    continue
        return "\n".join(lines)

    def wait_up(self, m: Master, timeout: float = 300) -> float:
        """Until HAProxy has the master UP with a passing check; returns time.monotonic(). When
        it does not come back, the error says what the master says of itself."""
        assert self.h is not None
        try:
            self.h.wait_server(self.backend, m.server, st.is_up_checked, "UP", timeout)
        except TimeoutError as e:
            said = m.ssh("pmcheck status | head -n 3; systemctl --failed --no-legend --plain", check=False)
            raise st.StackError(f"{e}\n{m.name} says:\n{said.stdout}{said.stderr}") from e
        up = time.monotonic()
        # The master hears HAProxy's view in its next check's send-state header, one check
        # (2 s) after HAProxy's own: what the next test's playbook asks the master must be UP too.
        st.wait_until(f"{m.name} to hear HAProxy say UP", m.heard_up, 30, interval=0.5)
        return up

    def busy(self, m: Master, timeout: float = 60) -> bool:
        """Until HAProxy has an agent's session open on the master (a run in flight there), at
        most ``timeout`` seconds; whether it had."""
        assert self.h is not None
        h = self.h
        try:
            h.wait_server(
                self.backend, m.server, lambda s: int(s["scur"] or 0) > 0, "with a session", timeout
            )
        except TimeoutError:
            return False
        return True

    def in_pool(self) -> int:
        assert self.h is not None
        return sum(st.fleet.serving(s) for s in self.h.servers(self.backend))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """test_members.py last: it reloads the load balancer with the backend Puppet wrote."""
    items.sort(key=lambda item: item.path.name == "test_members.py")


def fleet_here() -> str | None:
    """Why this is not the booted fleet's namespace, or None when it is."""
    if "PMCHECK_FLEET_MASTERS" not in os.environ:
        return "not in scripts/check-fleet's load balancer namespace (run: sudo scripts/check-fleet)"
    if not Path("/root/lb-key").exists():
        return "the fleet's load balancer key /root/lb-key is missing"
    return None


@pytest.fixture(scope="session")
def fleet(tmp_path_factory):
    why = fleet_here()
    if why is not None:
        banner = "!" * 8
        if STRICT:
            pytest.fail(f"{banner} CI=true and the fleet cannot run: {why}", pytrace=False)
        pytest.skip(f"{banner} THE BOOTED FLEET WAS NOT TESTED: {why}")
    f = Fleet(tmp_path_factory.mktemp("fleet"))
    for m in f.masters:
        st.wait_until(
            f"{m.name}'s pmcheck to answer 200", lambda m=m: m.answer()[0] == 200, 300, interval=0.5
        )
    try:
        f.start_haproxy()
        assert f.h is not None
        f.ha = st.HAProxyWatch(f.h, f.backend)
        with f.ha, f.answers:
            f.start_agents()
            yield f
            for a in f.agents:
                a.finish(timeout=120)
    finally:
        for a in f.agents:
            a.kill()
        if f.h is not None:
            f.h.stop()
