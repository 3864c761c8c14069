"""The shipped Ansible rolling restart (packaging/ansible/rolling-restart.yml), run over compile
masters by a real `ansible-playbook` (Debian's ansible-core).

The inventory's hosts come from the caller: the Debian 12 fleet's masters are loopback addresses of
this one machine (``local_hosts``: ``ansible_connection: local``, with host variables saying where
each master's pmcheck daemon and drain record are and what restarts it), the booted fleet's are
reached by SSH (tests/fleet). The playbook runs with the suite's own stdout callback
(ansible_callback/pmcheck_e2e.py): one JSON line per task result, read into a ``Roll``.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from .fleet import STEP_LINE, Cycle
from .proc import StackError, clean_env, stop_pid

if TYPE_CHECKING:
    from .fleet import Fleet

PLAYBOOK = Path(__file__).resolve().parents[3] / "packaging" / "ansible" / "rolling-restart.yml"
CALLBACKS = Path(__file__).resolve().parent / "ansible_callback"
CYCLE_TASK = "Run the command while drained (pmcheck cycle)"


@dataclass
class Roll:
    """One run of the playbook."""

    code: int
    start: float  # time.monotonic()
    end: float
    cycles: dict[str, Cycle] = field(default_factory=dict)  # master: its `pmcheck cycle`, in the order run
    said: dict[str, list[str]] = field(default_factory=dict)  # master: each message printed for it
    failed: dict[str, str] = field(default_factory=dict)  # master: the message of its failed task
    output: str = ""

    def describe(self) -> str:
        return f"ansible-playbook exited {self.code}; failed: {self.failed}; said: {self.said}"


def local_hosts(
    fleet: Fleet, pmcheck_bin: str, names: list[str], command: str | None = None
) -> dict[str, dict[str, str]]:
    """The Debian 12 fleet's masters ``names`` as inventory hosts (in that order): reached locally,
    each restarted by puppetserver_ctl.py unless ``command`` is given."""
    hosts = {}
    for name in names:
        m, serve = fleet.masters[name], fleet.serves[name]
        hosts[name] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": "/usr/bin/python3",
            "pmcheck_bin": pmcheck_bin,
            "pmcheck_url": serve.url,
            "pmcheck_state_dir": str(serve.state_dir),
            "pmcheck_command": command or shlex.join(m.ctl_argv("restart")),
        }
    return hosts


def ansible_roll(
    hosts: dict[str, dict[str, str]],
    workdir: Path,
    extra: dict[str, object] | None = None,
    timeout: float = 900,
) -> Roll:
    """`ansible-playbook rolling-restart.yml` over the inventory ``hosts`` (group compile_masters,
    in that order, each with its host variables); ``extra`` as `-e`."""
    if shutil.which("ansible-playbook") is None:
        raise StackError(
            "ansible-playbook is missing (Debian's package ansible-core; scripts/e2e installs it)"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    inventory = workdir / "inventory.yml"  # JSON is YAML
    inventory.write_text(json.dumps({"all": {"children": {"compile_masters": {"hosts": hosts}}}}))
    extra_file = workdir / "extra.json"
    extra_file.write_text(json.dumps({"pmcheck_max_wait": "5m", **(extra or {})}))
    cmd = ["ansible-playbook", "-i", str(inventory), "-e", f"@{extra_file}", str(PLAYBOOK)]
    env = clean_env(
        ANSIBLE_CALLBACK_PLUGINS=str(CALLBACKS),
        ANSIBLE_STDOUT_CALLBACK="pmcheck_e2e",
        ANSIBLE_HOME=str(workdir / "home"),
        ANSIBLE_LOCAL_TEMP=str(workdir / "tmp"),
        ANSIBLE_RETRY_FILES_ENABLED="0",
        ANSIBLE_NOCOLOR="1",
    )
    print(f"[e2e] $ {' '.join(cmd)}  (hosts {', '.join(hosts)})")
    wall_minus_mono = time.time() - time.monotonic()
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=env, cwd=workdir, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        stop_pid(proc, "ansible-playbook", term_timeout=30)
    (workdir / "results.jsonl").write_text(out)
    r = Roll(proc.returncode, start, time.monotonic(), output=out + err)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise StackError(
            f"ansible-playbook reported no task (exit {proc.returncode}):\n{out[-3000:]}\n{err[-3000:]}"
        )
    for line in lines:
        host, result = line["host"], line["result"]
        msg = result.get("msg")
        if line["status"] in ("failed", "unreachable"):
            r.failed[host] = str(msg)
        elif isinstance(msg, list):
            r.said.setdefault(host, []).extend(str(m) for m in msg)
        elif isinstance(msg, str) and msg not in ("", "All assertions passed"):
            r.said.setdefault(host, []).append(msg)
        if line["task"] == CYCLE_TASK and "rc" in result:
            r.cycles[host] = cycle_of(host, result, wall_minus_mono)
    for host, said in r.said.items():
        for line in said:
            print(f"[e2e]   {host}: {line}")
    for host, msg in r.failed.items():
        print(f"[e2e]   {host} FAILED: {msg}")
    return r


def cycle_of(master: str, result: dict, wall_minus_mono: float) -> Cycle:
    """A `pmcheck cycle` the playbook ran, from its task result: its steps' ends are its start plus
    the time each step took (the playbook shows its output only once it has ended)."""

    def mono(stamp: str) -> float:
        return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp() - wall_minus_mono

    start, end = mono(result["start"]), mono(result["end"])
    c = Cycle(master, result["rc"], start, end, stdout=result.get("stdout_lines", []))
    c.stderr = result.get("stderr", "")
    t = start
    for line in c.stdout:
        m = STEP_LINE.match(line)
        if m:
            t += float(m[2])
            c.steps[m[1]] = (t, float(m[2]), m[3])
    return c
