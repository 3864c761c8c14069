"""Real Puppet agents: a slow environment to compile, one-off ``puppet agent --test --noop`` runs,
and an agent that runs again and again through the load balancer, each run recorded."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .pki import Identity, PuppetSettings
from .proc import StackError, clean_env, stop_pid

ENVIRONMENTS = Path("/etc/puppet/code/environments")


@contextlib.contextmanager
def slow_environment(name: str, seconds: int, environments: Path = ENVIRONMENTS):
    """A Puppet environment NAME whose catalog takes ``seconds`` to compile (``generate`` runs
    /bin/sleep on the server, holding a JRuby instance), created in the host's environmentpath
    (or in ``environments``) and removed afterwards, with any directory it had to create."""
    env = environments / name
    created = [d for d in (environments.parent, environments) if not d.exists()]
    shutil.rmtree(env, ignore_errors=True)  # a leftover of an interrupted run
    (env / "manifests").mkdir(parents=True)
    (env / "manifests" / "site.pp").write_text(
        f"node default {{\n  $slept = generate('/bin/sleep', '{seconds}')\n"
        "  notify { 'pmcheck e2e compile': }\n}\n"
    )
    for d in [*created, env, env / "manifests"]:
        os.chmod(d, 0o755)
    os.chmod(env / "manifests" / "site.pp", 0o644)
    try:
        yield name
    finally:
        shutil.rmtree(env, ignore_errors=True)
        for d in reversed(created):
            with contextlib.suppress(OSError):
                d.rmdir()


def agent_run(settings: PuppetSettings, port: int, environment: str, workdir: Path) -> subprocess.Popen:
    """One real ``puppet agent --test --noop`` against ``certname:port`` (HAProxy's frontend
    or Puppet Server itself), with its own vardir and rundir so that concurrent runs do not
    share a lock. Exit 0 or 2 is a successful run."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        "puppet", "agent", "--test", "--noop",
        "--server", settings.certname, "--serverport", str(port),
        "--environment", environment,
        "--vardir", str(workdir / "var"), "--rundir", str(workdir / "run"),
        "--logdir", str(workdir / "log"), "--publicdir", str(workdir / "public"),
    ]  # fmt: skip
    with open(workdir / "agent.log", "wb") as log:  # the child has its own copy
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=clean_env(), start_new_session=True,
        )  # fmt: skip


@dataclass
class AgentRunRecord:
    agent: str
    number: int
    start: float  # time.monotonic()
    end: float
    code: int
    log: Path

    @property
    def ok(self) -> bool:
        return self.code in (0, 2)

    def overlaps(self, t0: float, t1: float) -> bool:
        return self.start < t1 and self.end > t0


class AgentLoop:
    """``puppet agent --test --noop`` as one node (its own certname, ssldir and vardir), run
    again and again through the load balancer at ``server``:``port`` until stopped, ``pause``
    seconds apart (a run's Ruby takes most of a core: three loops with no pause starve the
    masters of a 2-core machine). Every run is recorded with its exit code (0 and 2 are
    successes) and its log file."""

    def __init__(
        self, ident: Identity, workdir: Path, server: str, port: int, environment: str, pause: float = 0.0
    ):
        self.ident, self.dir = ident, workdir
        self.server, self.port, self.environment = server, port, environment
        self.pause = pause
        self.runs: list[AgentRunRecord] = []
        self.current: subprocess.Popen | None = None
        self.current_start: float | None = None
        self.error: BaseException | None = None
        self.cut = 0  # runs stopped by kill(): not recorded, they say nothing about the masters
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._killed = False
        self._thread = threading.Thread(target=self._loop, name=f"agent {ident.certname}", daemon=True)
        workdir.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        d = self.dir
        return [
            "puppet", "agent", "--test", "--noop",
            "--server", self.server, "--serverport", str(self.port),
            "--environment", self.environment,
            "--certname", self.ident.certname, "--ssldir", str(self.ident.ssldir),
            "--vardir", str(d / "var"), "--rundir", str(d / "run"),
            "--logdir", str(d / "log"), "--publicdir", str(d / "public"),
        ]  # fmt: skip

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        n = 0
        try:
            while not self._stop.is_set():
                n += 1
                log_path = self.dir / f"run{n:03d}.log"
                with open(log_path, "wb") as log:
                    with self._lock:
                        self.current_start = time.monotonic()
                        self.current = subprocess.Popen(
                            self.command(), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=clean_env(), start_new_session=True,
                        )  # fmt: skip
                    code = self.current.wait()
                with self._lock:
                    if self._killed:
                        self.cut += 1
                        self.current, self.current_start = None, None
                        return
                    self.runs.append(
                        AgentRunRecord(
                            self.ident.certname, n, self.current_start, time.monotonic(), code, log_path
                        )
                    )
                    self.current, self.current_start = None, None
                self._stop.wait(self.pause)
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.error = e

    def in_flight(self) -> bool:
        with self._lock:
            return self.current is not None

    def finish(self, timeout: float = 180) -> None:
        """Let the run under way end, and start no other."""
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise StackError(f"the run of {self.ident.certname} did not end within {timeout}s")
        if self.error is not None:
            raise StackError(f"agent loop {self.ident.certname} broke: {self.error!r}")

    def kill(self) -> None:
        """Stop at once: the run under way is stopped by its PID, and not recorded."""
        self._stop.set()
        with self._lock:
            self._killed = True
            proc = self.current
        if proc is not None:
            stop_pid(proc, f"puppet agent {self.ident.certname}", term_timeout=5)
        self._thread.join(10)
