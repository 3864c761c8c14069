"""The pmcheck binary under test: its one-shot commands and its daemons, stopped by PID."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from .clients import Reply, http_request
from .proc import LOOPBACK, StackError, clean_env, free_port, lb_key_file, stop_pid, tail, wait_until


class Pmcheck:
    """The pmcheck binary: one-shot commands and ``serve`` daemons.

    ``echo`` receives a line for each command run (the suite prints them; the demo
    shows its own).
    """

    def __init__(self, binary: str, workdir: Path, echo: Callable[[str], None] = print):
        self.binary = binary
        self.dir = workdir
        self.echo = echo
        self.daemons: list[PmcheckServe] = []

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess:
        cp = subprocess.run(
            [self.binary, *args], capture_output=True, text=True, timeout=timeout,
            env=env if env is not None else clean_env(), stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self.echo(f"[e2e] $ pmcheck {' '.join(args)}  -> exit {cp.returncode}")
        for line in (cp.stdout + cp.stderr).splitlines()[:40]:
            self.echo(f"[e2e]   {line}")
        return cp

    def serve(
        self,
        state_dir: Path,
        *extra: str,
        env: dict[str, str] | None = None,
        name: str = "serve",
        host: str = LOOPBACK,
    ) -> PmcheckServe:
        """``pmcheck serve --listen HOST:<a free port> --state-dir STATE_DIR EXTRA...``, started and
        answering."""
        d = PmcheckServe(self, state_dir, list(extra), env, self.dir / f"pmcheck-{name}.log", host=host)
        self.daemons.append(d)
        d.start()
        return d

    def stop_all(self) -> None:
        for d in self.daemons:
            d.stop()


class PmcheckServe:
    def __init__(self, pm: Pmcheck, state_dir: Path, extra: list[str], env, log: Path, host: str = LOOPBACK):
        self.pm = pm
        self.host = host
        self.state_dir = state_dir
        self.extra = extra
        self.env = env if env is not None else clean_env(RUST_LOG=os.environ.get("RUST_LOG", "info"))
        self.log = log
        self.port = free_port(host)
        self.proc: subprocess.Popen | None = None

    @property
    def listen(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.listen}/"

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise StackError(
                f"pmcheck serve exited ({self.proc and self.proc.returncode}); log:\n{tail(self.log)}"
            )

    def start(self, timeout: float = 20) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        state = str(self.state_dir)
        cmd = [self.pm.binary, "serve", "--listen", self.listen, "--state-dir", state]
        # The stack's load balancers prove themselves with its key, unless a test says otherwise.
        if not any(a.startswith(("--lb-key-file", "--lb-address")) for a in self.extra):
            cmd += ["--lb-key-file", str(lb_key_file(self.pm.dir))]
        cmd += self.extra
        self.pm.echo(f"[e2e] $ {' '.join(cmd)}")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True,
            )  # fmt: skip
        wait_until(
            f"pmcheck serve on {self.listen} to answer", self._answers, timeout, alive=self.check_alive
        )

    def _answers(self) -> bool:
        try:
            http_request(self.port, timeout=2, host=self.host)
            return True
        except OSError:
            return False

    def get(self, path: str = "/", **kw) -> Reply:
        kw.setdefault("host", self.host)
        return http_request(self.port, path, **kw)

    def wait_verdict(self, status: int, timeout: float = 30) -> tuple[Reply, float]:
        return wait_until(
            f"pmcheck on {self.listen} to answer {status}",
            lambda: (r := self.get()) and r.status == status and r,
            timeout, interval=0.1, alive=self.check_alive,
        )  # fmt: skip

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc, "pmcheck serve", term_timeout=10)

    def reload(self) -> None:
        """`systemctl reload pmcheck`: SIGHUP, which re-reads the key file."""
        self.check_alive()
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGHUP)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def restart(self, extra: list[str] | None = None, timeout: float = 20) -> None:
        """Stopped by its PID and started again on the same port (a load balancer's config names
        it), with ``extra`` instead of its flags when given."""
        self.stop()
        if extra is not None:
            self.extra = list(extra)
        self.start(timeout)
