"""xinetd in the foreground running packaging/xinetd/pmcheck, rendered for loopback, and the system
user the pmcheck package creates."""

from __future__ import annotations

import pwd
import re
import subprocess
from pathlib import Path

from .proc import LOOPBACK, StackError, stop_pid, tail, wait_until


def xinetd_attrs(text: str) -> dict[str, list[str]]:
    """The ``name = value`` / ``name += value`` attributes of the (single) service block."""
    attrs: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^(\w+)\s*(\+?=|-=)\s*(.*)$", line)
        if m:
            attrs.setdefault(m[1], []).append(f"{m[2]} {m[3]}".strip())
    return attrs


def render_xinetd(text: str, port: int, binary: str, state_dir: str, service_log: str) -> str:
    """packaging/xinetd/pmcheck with its port, server path and state dir substituted, bound to loopback."""

    def sub1(pattern: str, repl: str, s: str) -> str:
        new, n = re.subn(pattern, repl, s, flags=re.M)
        if n != 1:
            raise StackError(
                f"expected exactly one match for {pattern!r} in packaging/xinetd/pmcheck, found {n}"
            )
        return new

    out = sub1(r"^(\s*port\s*=\s*)9200\s*$", rf"\g<1>{port}", text)
    out = sub1(r"^(\s*server\s*=\s*)/usr/bin/pmcheck\s*$", rf"\g<1>{binary}", out)
    m = re.search(r"(?m)^\s*server_args\s*=\s*inetd\b(.*)$", out)
    if m is None:
        raise StackError("packaging/xinetd/pmcheck has no `server_args = inetd ...` line")
    args, n = re.subn(r"--state-dir(\s+|=)\S+", f"--state-dir {state_dir}", m[1])
    if n == 0:
        args += f" --state-dir {state_dir}"
    out = out[: m.start(1)] + args + out[m.end(1) :]
    # loopback only, and prove only_from works as documented: add both before the closing brace
    extra = f"\tbind\t\t= {LOOPBACK}\n\tonly_from\t= {LOOPBACK}\n\tlog_type\t= FILE {service_log}\n"
    out = sub1(r"^\}\s*$", extra + "}", out)
    return out


def ensure_system_user(name: str) -> bool:
    """Create the system user as the pmcheck package does (own group, no home, no shell)
    unless it exists; True if created."""
    try:
        pwd.getpwnam(name)
        return False
    except KeyError:
        pass
    subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", f"/var/lib/{name}",
         "--shell", "/usr/sbin/nologin", "--comment", "pmcheck health responder", name],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return True


class Xinetd:
    def __init__(self, workdir: Path, service_text: str):
        self.dir = workdir
        self.conf = workdir / "xinetd.conf"
        self.pidfile = workdir / "xinetd.pid"
        self.log = workdir / "xinetd.log"
        self.conf.write_text(
            "# written by pmcheck's e2e suite\n"
            "defaults\n{\n"
            f"\tlog_type\t= FILE {workdir / 'xinetd-services.log'}\n"
            "}\n\n" + service_text
        )
        self.proc: subprocess.Popen | None = None

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise StackError(f"xinetd exited ({self.proc and self.proc.returncode}); log:\n{tail(self.log)}")

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["xinetd", "-dontfork", "-pidfile", str(self.pidfile), "-filelog", str(self.log), "-f", str(self.conf)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        wait_until(
            "xinetd to write its pidfile",
            lambda: self.pidfile.exists() and self.pidfile.read_text().strip(),
            15,
            alive=self.check_alive,
        )
        pid = int(self.pidfile.read_text().strip())
        if pid != self.proc.pid:
            raise StackError(f"xinetd -dontfork wrote pid {pid}, but we started {self.proc.pid}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc, "xinetd", term_timeout=10)
