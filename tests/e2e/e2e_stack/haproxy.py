"""HAProxy in the foreground with an admin socket, its own view of each server read from that
socket (never inferred), and packaging/haproxy/pmcheck.cfg rendered for loopback."""

from __future__ import annotations

import csv
import functools
import io
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from .proc import LB_KEY, LB_KEY_PLACEHOLDER, LOOPBACK, StackError, free_port, stop_pid, tail, wait_until
from .puppetserver import PUPPET_PORT

HAPROXY_HEAD = """\
# ---- written by tests/e2e/e2e_stack/haproxy.py: global/defaults of a throwaway HAProxy
global
    stats socket {sock} mode 600 level admin
    log stderr format raw local0 info
    # no `daemon`, no `user`, no `chroot`: run in the foreground under the test

defaults
    log global
    option log-health-checks
    timeout connect 2s
    timeout client 1m
    timeout server 1m

# ---- from here on: {source} (addresses and ports for this machine)
"""


@functools.cache
def release_of(binary: str) -> tuple[int, int]:
    """The major and minor release ``binary -v`` says, (0, 0) when it says none."""
    try:
        out = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return (0, 0)
    m = re.match(r"HAProxy version (\d+)\.(\d+)", out)
    return (int(m[1]), int(m[2])) if m else (0, 0)


class HAProxy:
    def __init__(
        self, workdir: Path, name: str, body: str, source: str, binary: str = "haproxy",
        first: Path | None = None, master_worker: bool = False,
    ):  # fmt: skip
        """``binary``: the stack's own ``haproxy``, or a newer one beside it
        (``/usr/local/sbin/haproxy-3.2``: scripts/trixie-root). ``first``: a file read before
        the configuration (``-f FIRST -f CFG``: the load balancers' key, as the README keeps it);
        ``master_worker``: run as Debian's unit does (``-W``), reloaded by :meth:`reload`."""
        self.first = first
        self.master_worker = master_worker
        self.dir = workdir
        self.name = name
        self.binary = binary
        self.sock = workdir / f"haproxy-{name}.sock"
        # HAProxy binds `<path>.<pid>.tmp` first, within sun_path's 108 bytes (it said "max 97"
        # for a 6-digit PID); a test's directory, named after the test and its parameters, can
        # make the path longer than that.
        self.sock_dir: Path | None = None
        if len(str(self.sock)) > 90:
            self.sock_dir = Path(tempfile.mkdtemp(prefix="pmcheck-hap-", dir="/tmp"))
            self.sock = self.sock_dir / f"{name}.sock"
        self.cfg = workdir / f"haproxy-{name}.cfg"
        self.log = workdir / f"haproxy-{name}.log"
        self.cfg.write_text(HAPROXY_HEAD.format(sock=self.sock, source=source) + body)
        self.proc: subprocess.Popen | None = None

    def files(self) -> list[str]:
        """``-f`` and each file HAProxy reads, in order."""
        return [a for f in [self.first, self.cfg] if f is not None for a in ("-f", str(f))]

    def validate(self) -> None:
        cp = subprocess.run([self.binary, "-c", *self.files()], capture_output=True, text=True, timeout=30)
        if cp.returncode != 0:
            raise StackError(
                f"haproxy -c rejected {self.cfg}:\n{cp.stdout}{cp.stderr}\n--- config:\n{self.cfg.read_text()}"
            )

    @property
    def release(self) -> tuple[int, int]:
        return release_of(self.binary)

    @property
    def label(self) -> str:
        """``HAProxy 3.2``: as the tests name the load balancer they read."""
        return "HAProxy {}.{}".format(*self.release)

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise StackError(f"haproxy exited ({self.proc and self.proc.returncode}); log:\n{tail(self.log)}")

    def start(self) -> None:
        self.validate()
        with open(self.log, "ab") as log:
            mode = ["-W"] if self.master_worker else []
            self.proc = subprocess.Popen(
                [self.binary, *mode, "-db", *self.files()],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        wait_until(
            "the HAProxy admin socket",
            lambda: "Name: HAProxy" in self.admin("show info"),
            15,
            alive=self.check_alive,
        )

    def reload(self) -> None:
        """Debian's ExecReload: the configuration checked, then SIGUSR2 to the master, which
        re-executes itself and reads every file again."""
        assert self.master_worker and self.proc is not None, "only a master reloads"
        self.validate()
        self.proc.send_signal(signal.SIGUSR2)

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc, "haproxy", term_timeout=10)
        if self.sock_dir is not None:
            shutil.rmtree(self.sock_dir, ignore_errors=True)

    # -- the admin socket: HAProxy's own view, never inferred

    def admin(self, command: str, timeout: float = 5) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(self.sock))
            s.sendall(command.encode() + b"\n")
            chunks = []
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        return b"".join(chunks).decode("utf-8", "replace")

    def servers_state(self, backend: str) -> list[dict[str, str]]:
        """``show servers state BACKEND`` as dicts keyed by the header's names."""
        out = self.admin(f"show servers state {backend}")
        lines = [line for line in out.splitlines() if line.strip()]
        header = next((line for line in lines if line.startswith("# ")), None)
        if header is None:
            raise StackError(f"unexpected `show servers state` output: {out!r}")
        names = header[2:].split()
        rows = []
        for line in lines:
            if line.startswith("#") or len(line.split()) < 5:
                continue
            rows.append(dict(zip(names, line.split(), strict=False)))
        return rows

    def stat(self) -> list[dict[str, str]]:
        """``show stat`` CSV as dicts keyed by its header (pxname, svname, status, check_status, ...)."""
        out = self.admin("show stat")
        if not out.startswith("# "):
            raise StackError(f"unexpected `show stat` output: {out[:200]!r}")
        return list(csv.DictReader(io.StringIO(out[2:])))

    def servers(self, backend: str) -> list[dict[str, str]]:
        """Each server of the backend as HAProxy sees it: its `show stat` row updated with
        its `show servers state` row (srv_op_state, srv_admin_state, ...)."""
        states = {r["srv_name"]: r for r in self.servers_state(backend)}
        merged = []
        for row in self.stat():
            if row["pxname"] != backend or row["svname"] in ("FRONTEND", "BACKEND"):
                continue
            if row["svname"] not in states:
                raise StackError(f"`show servers state {backend}` has no {row['svname']}")
            merged.append({**row, **states[row["svname"]]})
        return merged

    def server(self, backend: str, server: str) -> dict[str, str]:
        """One server as HAProxy sees it (see ``servers``)."""
        s = next((s for s in self.servers(backend) if s["svname"] == server), None)
        if s is None:
            raise StackError(f"HAProxy has no server {backend}/{server}")
        return s

    def wait_server(
        self, backend: str, server: str, want: Callable[[dict[str, str]], bool], what: str, timeout: float
    ) -> tuple[dict[str, str], float]:
        return wait_until(
            f"HAProxy to see {backend}/{server} {what}",
            lambda: (s := self.server(backend, server)) and want(s) and s,
            timeout, interval=0.05, alive=self.check_alive,
        )  # fmt: skip


def is_up_checked(s: dict[str, str]) -> bool:
    """UP *and* the last check really passed (HAProxy counts a server UP before its first check)."""
    return (
        s["status"] == "UP"
        and s["srv_op_state"] == "2"
        and s["check_status"].lstrip("* ") == "L7OK"
        and s["check_code"] == "200"
    )


def is_down_503(s: dict[str, str]) -> bool:
    return (
        s["status"] == "DOWN"
        and s["srv_op_state"] == "0"
        and s["check_status"].lstrip("* ") == "L7STS"
        and s["check_code"] == "503"
    )


def status_check(s: dict[str, str]) -> str:
    """``UP L7OK``, ``DOWN L7STS``, ``UP 2/3 L7STS`` while a transition is under way... (the
    ``* `` that marks a check in progress is dropped)."""
    return f"{s['status']} {s['check_status'].lstrip('* ')}"


def view(s: dict[str, str]) -> str:
    """One server on one line, for people: status, last check (status/code/text), states."""
    return "{}/{:<10} status={:<5} check={}/{} {:<28} op_state={} admin_state={}".format(
        s["pxname"], s["svname"], s["status"], s["check_status"], s["check_code"] or "-",
        f'"{s["last_chk"]}"', s.get("srv_op_state"), s.get("srv_admin_state"),
    )  # fmt: skip


def summary(s: dict[str, str]) -> str:
    keys = [
        "status",
        "srv_op_state",
        "srv_admin_state",
        "check_status",
        "check_code",
        "last_chk",
        "chkfail",
        "chkdown",
        "stot",
    ]
    return " ".join(f"{k}={s.get(k)!r}" for k in keys)


# --------------------------------------------------------------------------
# packaging/haproxy/pmcheck.cfg rendered for a test run

SERVER_LINE = re.compile(r"(?m)^(?P<indent>\s*)server\s+(?P<name>\S+)\s+(?P<addr>\S+)(?P<rest>.*)$")


def render_haproxy(
    text: str,
    frontend_port: int,
    check_port: int,
    backend_addr: str = f"{LOOPBACK}:{PUPPET_PORT}",
    timing: str | None = None,
    agent_port: int | None = None,
    targets: list[tuple[str, int, int]] | None = None,
    key: str = LB_KEY,
    network: str = r"127\.\d+\.\d+\.\d+",
) -> tuple[str, str, list[str]]:
    """Turn packaging/haproxy/pmcheck.cfg into a loopback-only config.

    * every ``bind`` gets the loopback address and ``frontend_port``;
    * every active ``server`` line gets ``backend_addr`` and ``check port <check_port>``;
    * its ``agent-port`` becomes ``agent_port`` (without one, a free port nothing listens on:
      HAProxy then changes nothing for the agent, and the HTTP check decides alone);
    * with ``timing`` (``"inter 300ms rise 2 fall 2"``, ``"... agent-inter 300ms"``: pairs of a
      keyword the shipped line has and a value) those keywords of the server lines are replaced
      by it, the others are kept as shipped;
    * with ``targets`` (one ``(address:port, check port, agent port)`` per shipped server line, in
      order: several compile masters on loopback addresses of their own) each server line gets its
      own, instead of ``backend_addr``, ``check_port`` and ``agent_port``.
    * the placeholder of the load balancers' key becomes ``key`` (the stack's own by default);
    * every address left must match ``network`` (a regex: loopback unless a test's own network,
      tests/fleet's, is named).
    Returns (config, backend name, server names).  Raises when the file does not have the
    shape the suite relies on, so the test fails instead of testing something else.
    """
    if LB_KEY_PLACEHOLDER not in text:
        raise StackError("packaging/haproxy/pmcheck.cfg has no placeholder of the load balancers' key")
    text = text.replace(LB_KEY_PLACEHOLDER, key)
    out, nbind = re.subn(r"(?m)^(\s*)bind\s+\S+", rf"\g<1>bind {LOOPBACK}:{frontend_port}", text)
    if nbind < 1:
        raise StackError("packaging/haproxy/pmcheck.cfg has no `bind` line")
    names: list[str] = []
    agent = agent_port if agent_port is not None else free_port()

    def fix_server(m: re.Match) -> str:
        rest = m["rest"]
        addr, check, agent_p = backend_addr, check_port, agent
        if targets is not None:
            if len(names) >= len(targets):
                raise StackError(f"more server lines than the {len(targets)} targets given: {m[0]!r}")
            addr, check, agent_p = targets[len(names)]
        rest, n = re.subn(r"(?<![\w-])port\s+\d+", f"port {check}", rest)
        if n != 1:
            raise StackError(f"server line without exactly one `port N`: {m[0]!r}")
        rest, n = re.subn(r"\bagent-port\s+\d+", f"agent-port {agent_p}", rest)
        if n != 1:
            raise StackError(f"server line without exactly one `agent-port N`: {m[0]!r}")
        if timing is not None:
            words = timing.split()
            if len(words) % 2:
                raise StackError(f"timing must be keyword/value pairs: {timing!r}")
            for word in words[::2]:
                # `inter` is not the end of `agent-inter`
                rest, n = re.subn(rf"(?<![\w-]){re.escape(word)}\s+\S+", "", rest)
                if n != 1:
                    raise StackError(f"server line without exactly one `{word}`: {m[0]!r}")
            rest = re.sub(r"\s+", " ", rest).rstrip() + " " + timing
        names.append(m["name"])
        return f"{m['indent']}server {m['name']} {addr}{rest}"

    out = SERVER_LINE.sub(fix_server, out)
    if not names:
        raise StackError("packaging/haproxy/pmcheck.cfg has no active `server` line")
    if targets is not None and len(names) != len(targets):
        raise StackError(f"{len(targets)} targets for the shipped file's {len(names)} server lines")
    backends = re.findall(r"(?m)^backend\s+(\S+)", out)
    if len(backends) != 1:
        raise StackError(f"expected exactly one backend in the shipped HAProxy file, found {backends}")
    # nothing in it may point anywhere but loopback (or the test's own network)
    for m in re.finditer(r"(?m)^\s*(bind|server)\s.*$", out):
        if not re.search(rf"\s{network}:\d+", m[0]):
            raise StackError(f"an address outside {network} left in rendered config: {m[0]!r}")
    return out, backends[0], names
