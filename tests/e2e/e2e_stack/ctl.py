"""A Puppet Server JVM run as a service manager runs one: started detached (a session of its own,
so that it outlives the program that started it), known by its pidfile, stopped by that PID.

Everything comes from a *spec*, a dict that PuppetServer.spec() makes and writes to a JSON file:
the JVM's command, environment and working directory, its log, restart file and pidfile, its
address, certname and CA bundle, and a marker (its own conf.d path) that only its command line
holds. The driver (puppetserver.py) and tests/e2e/puppetserver_ctl.py, the restart program
`pmcheck cycle` runs, both work through these functions. No pytest here.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

from .clients import TLSReply, https_request, tls_context
from .proc import StackError, gone, port_accepts, tail, wait_until


def running_pid(spec: dict) -> int | None:
    """The PID in the pidfile, if that process is alive and is this server's JVM (its command line
    holds the marker): never a recycled PID."""
    try:
        pid = int(Path(spec["pidfile"]).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    if gone(pid) or spec["marker"].encode() not in cmdline.split(b"\0"):
        return None
    return pid


def status(spec: dict) -> TLSReply:
    """``GET /status/v1/simple``, the server verified against its CA bundle as its certname."""
    ctx = tls_context(spec["cafile"])
    return https_request(
        spec["port"], spec["certname"], ctx, "/status/v1/simple", host=spec["host"], timeout=5
    )


def ready(spec: dict) -> bool:
    """Ready as Debian's unit sees it (the restart file says 1) and as a client does (running)."""
    if Path(spec["restart_file"]).read_text().strip() != "1":
        return False
    r = status(spec)
    return r.status == 200 and r.body.strip() == "running"


def stop(spec: dict, term_timeout: float = 60) -> float | None:
    """Stop the server's JVM by the PID in its pidfile (SIGTERM to its process group, SIGKILL
    after ``term_timeout``), wait until its port is closed; the seconds it took, None when it was
    not running."""
    pid = running_pid(spec)
    if pid is None:
        return None
    t0 = time.monotonic()
    # started with start_new_session: its process group id is its PID (setpriv execs java)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    try:
        wait_until(f"Puppet Server {spec['name']} (pid {pid}) to exit", lambda: gone(pid), term_timeout, 0.1)
    except TimeoutError:
        print(f"[e2e] Puppet Server {spec['name']} (pid {pid}) ignored SIGTERM for {term_timeout}s: SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        wait_until(f"Puppet Server {spec['name']} (pid {pid}) to die", lambda: gone(pid), 10, 0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)  # whatever it forked
    wait_until(
        f"{spec['host']}:{spec['port']} to close",
        lambda: not port_accepts(spec["port"], spec["host"]),
        30,
    )
    Path(spec["pidfile"]).unlink(missing_ok=True)
    return time.monotonic() - t0


def start(spec: dict, timeout: float = 300) -> tuple[float, subprocess.Popen]:
    """Start the server's JVM detached (its own session; the pidfile is written at once), wait
    until it is ready (restart file 1, `/status/v1/simple` running); the seconds it took, and the
    JVM, this process's child: to reap once stopped (a program that exits leaves that to init)."""
    if running_pid(spec) is not None:
        raise StackError(f"Puppet Server {spec['name']} is already running")
    if port_accepts(spec["port"], spec["host"]):
        raise StackError(f"something already listens on {spec['host']}:{spec['port']}")
    pw = pwd.getpwnam("puppet")
    restart = Path(spec["restart_file"])
    restart.write_text("0")
    os.chown(restart, pw.pw_uid, pw.pw_gid)
    t0 = time.monotonic()
    with open(spec["log"], "ab") as log:
        log.write(f"\n==== e2e: starting Puppet Server at {time.strftime('%H:%M:%S')}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            spec["cmd"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=spec["cwd"], env=spec["env"], start_new_session=True,
        )  # fmt: skip
    pidfile = Path(spec["pidfile"])
    tmp = pidfile.with_name(pidfile.name + ".tmp")
    tmp.write_text(f"{proc.pid}\n")
    os.replace(tmp, pidfile)

    def alive() -> None:
        if proc.poll() is not None:
            raise StackError(
                f"Puppet Server {spec['name']} exited (status {proc.returncode}); log tail:\n{tail(spec['log'])}"
            )

    try:
        wait_until(f"Puppet Server {spec['name']} to be ready", lambda: ready(spec), timeout, 0.25, alive)
    except BaseException:
        stop(spec)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        raise
    return time.monotonic() - t0, proc
