"""Processes on this machine: starting, waiting for and stopping them (by PID, never by name),
free loopback ports, a child's environment, Debian packages, and a sampler thread."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

LOOPBACK = "127.0.0.1"


class StackError(RuntimeError):
    """A component of the real stack misbehaved (did not start, died, ...)."""


class Sampler:
    """Calls ``sample()`` every ``every`` seconds on a thread of its own, from ``with`` to its end:
    a test's timeline of what it watches while it acts."""

    every = 0.25

    def __init__(self, name: str):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------
# ports, logs, waits


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` (127.0.0.1) that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_accepts(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def tail(path: Path | str, lines: int = 40) -> str:
    try:
        data = Path(path).read_text(errors="replace").splitlines()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(data[-lines:])


def wait_until(
    what: str,
    probe: Callable[[], object],
    timeout: float,
    interval: float = 0.05,
    alive: Callable[[], None] | None = None,
):
    """Poll ``probe`` until it returns a truthy value; return (value, elapsed).

    ``alive`` is called on every round and should raise when the component being
    waited on has died, so that a crash fails at once instead of at the deadline.
    """
    start = time.monotonic()
    deadline = start + timeout
    last = None
    while True:
        if alive is not None:
            alive()
        try:
            last = probe()
        except Exception as e:  # noqa: BLE001 - the probe reports what it saw
            last = e
        else:
            if last:
                return last, time.monotonic() - start
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def stop_pid(proc: subprocess.Popen, name: str, term_timeout: float = 60.0) -> None:
    """Stop a process we started: SIGTERM its process group, then SIGKILL.

    The process was started with ``start_new_session=True``, so its pgid is its
    pid: signalling ``-pid`` reaches the children it forked (and nothing else).
    """
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=term_timeout)
        except subprocess.TimeoutExpired:
            print(f"[e2e] {name} (pid {proc.pid}) ignored SIGTERM for {term_timeout}s: SIGKILL")
    # whatever is left in the group (children, or the leader after a timeout)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        raise StackError(f"{name} (pid {proc.pid}) survived SIGKILL") from None


# The load balancers' key of the stack: every pmcheck daemon takes it (PmcheckServe), every
# rendered HAProxy configuration sends it in place of the shipped placeholder (render_haproxy).
LB_KEY = "9f2b6e1c0d4a8b7e3f5c2d1a0b9e8f7c6d5e4f3a2b1c0d9e"
LB_KEY_PLACEHOLDER = "CHANGE-ME-to-the-key-in-etc-pmcheck-lb-key"


def lb_key_file(workdir: Path) -> Path:
    """The key file of ``LB_KEY`` in ``workdir``, 0640 as the packaged instructions say."""
    path = workdir / "lb-key"
    if not path.exists():
        path.write_text(f"# the e2e stack's load balancers\n{LB_KEY}\n")
        path.chmod(0o640)
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for child processes: ours without any PMCHECK_* variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PMCHECK_")}
    env.update(extra)
    return env


def run_checked(cmd: list[str], what: str, timeout: float = 120) -> str:
    """Run ``cmd`` (our environment minus PMCHECK_*), its stdout; StackError naming ``what`` when it
    fails."""
    cp = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=clean_env()
    )
    if cp.returncode != 0:
        raise StackError(f"{what} failed (exit {cp.returncode}): {' '.join(cmd)}\n{cp.stdout}{cp.stderr}")
    return cp.stdout


# --------------------------------------------------------------------------
# Debian packages


def missing_packages(names: Iterable[str]) -> list[str]:
    """The packages named that dpkg does not have installed."""
    missing = []
    for name in names:
        cp = subprocess.run(
            ["dpkg-query", "-W", "-f=${db:Status-Status}", name], capture_output=True, text=True
        )
        if cp.stdout.strip() != "installed":
            missing.append(name)
    return missing


def install_packages(names: Iterable[str], echo: Callable[[str], None] = print) -> None:
    """Install the packages named that are missing, with apt-get (needs root).

    ``apt-get update`` runs only when the install needs it: no package lists yet, or the
    first attempt failed (stale lists).  Waits for another apt/dpkg (unattended-upgrades,
    a parallel job) instead of failing at once.  Raises StackError when it cannot install.
    """
    missing = missing_packages(names)
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StackError(f"cannot install {' '.join(missing)}: needs root and apt-get")
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=300"]
    install = [*apt, "install", "-y", "--no-install-recommends", *missing]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    echo(f"+ apt-get install -y --no-install-recommends {' '.join(missing)}")
    if (
        any(Path("/var/lib/apt/lists").glob("*_Packages*"))
        and subprocess.run(install, env=env).returncode == 0
    ):
        return
    echo("+ apt-get update (the package lists are missing or stale)")
    if subprocess.run([*apt, "update"], env=env).returncode != 0:
        raise StackError("apt-get update failed")
    if subprocess.run(install, env=env).returncode != 0:
        raise StackError(f"apt-get could not install {' '.join(missing)}")


# --------------------------------------------------------------------------
# processes known only by their PID (a JVM started detached, see ctl.py)


def _proc_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (R, S, Z...), None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def gone(pid: int) -> bool:
    """No such process, or only its zombie: it has exited."""
    return _proc_state(pid) in (None, "Z", "X")


def stop_strays(marker: str) -> list[int]:
    """Kill (SIGKILL, by PID) every process whose command line holds ``marker`` (a master's own
    conf.d path, in the temp dir): a JVM whose pidfile never got written (a restart interrupted
    between start and pidfile). Returns the PIDs."""
    killed = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker.encode() in (d / "cmdline").read_bytes().split(b"\0") and not gone(int(d.name)):
                os.kill(int(d.name), signal.SIGKILL)
                killed.append(int(d.name))
        except OSError:
            continue
    return killed
