"""HAProxy reloads that keep what it knew: the server state the Puppet module's save step
(packaging/puppet/pmcheck/files/haproxy-save-state, which class pmcheck::server_state's drop-in
runs after the configuration check of a reload and before the signal) writes, and the backend
loads (`load-server-state-from-file local`, as pmcheck::haproxy's `keep_state` writes it).

On every HAProxy of each stack (2.6; 3.0, 3.2 and 3.4), run as Debian's unit runs it (`-W`,
reloaded by SIGUSR2), the shipped backend: compile01 in front of pmcheck and the session's
Puppet Server, compile02 a master that is down (nothing answers its ports).
1. A reload that adds a server (a master that just joined, whose pmcheck answers nothing): the
   down master stays DOWN in every sample of the reloaded worker, so its weight never counts in
   the backend's, and the last-server rule, which reads those counts, still refuses to drain
   compile01 (3.1 and later); the joined server never takes agents on 3.1 and later
   (`init-state down`, which pmcheck::haproxy adds there), and on 2.6 and 3.0 is UP until its
   first check: measured, recorded.
2. compile01 drained (NOLB by pmcheck's 404), a weight set (an agent's, here on the admin
   socket): through a reload with the state file it stays NOLB in every sample, HAProxy's log
   saying it came from the file, with that weight; through one without the file it starts UP,
   its first check takes it out again, with the configuration's weight, and the down master is
   counted UP until its first check (measured, recorded).
3. compile02 exported anew at another address with other ports: the reloaded worker takes its
   address from the configuration but its ports from the state file (measured, recorded); with
   the ports list pmcheck::haproxy writes beside the state, the save step leaves its row out and
   it gets the configuration's ports, while compile01 stays NOLB from the file.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

import e2e_stack as st
from conftest import record

pytestmark = pytest.mark.ci_on("debian12", "debian13")

INTER = 2.0  # the shipped `inter 2s`
SAVE = Path(__file__).resolve().parents[2] / "packaging/puppet/pmcheck/files/haproxy-save-state"
UP, NOLB = "2", "3"  # srv_op_state


class Watch(st.Sampler):
    """HAProxy's worker and each server's (srv_op_state, srv_uweight), every 20 ms, from one
    request to the admin socket (`show info;show servers state BACKEND`): the reloaded worker's
    samples are told from the old one's by its Pid."""

    every = 0.02

    def __init__(self, h: st.HAProxy, backend: str):
        super().__init__("haproxy reload watch")
        self.h, self.backend = h, backend
        self.rows: list[tuple[float, int, dict[str, tuple[str, str]]]] = []

    def sample(self) -> None:
        try:
            out = self.h.admin(f"show info;show servers state {self.backend}")
        except OSError:
            return
        pid, header = re.search(r"(?m)^Pid: (\d+)$", out), re.search(r"(?m)^# (be_id .*)$", out)
        if pid and header:
            rows = [
                dict(zip(header[1].split(), line.split(), strict=False))
                for line in out[header.end() :].split("\n")
            ]
            servers = {
                r["srv_name"]: (r["srv_op_state"], r["srv_uweight"]) for r in rows if "srv_uweight" in r
            }
            self.rows.append((time.monotonic(), int(pid[1]), servers))

    def pid(self) -> int:
        return st.wait_until("a sample of HAProxy's worker", lambda: self.rows and self.rows[-1][1], 10)[0]

    def after(self, old: int, server: str) -> list[tuple[float, tuple[str, str]]]:
        """``server``'s samples from a worker other than ``old``."""
        return [(t, s[server]) for t, pid, s in self.rows if pid != old and server in s]

    def reload(self, h: st.HAProxy) -> tuple[int, float]:
        """Reloads HAProxy; returns the old worker's Pid and when, once the new worker has been
        sampled over two check intervals."""
        old = self.pid()
        at = time.monotonic()
        h.reload()
        st.wait_until(
            "samples of the reloaded worker over two check intervals",
            lambda: any(t >= at + 2 * INTER for t, pid, _ in self.rows if pid != old),
            20,
            alive=h.check_alive,
        )
        return old, at


def logged_since(h: st.HAProxy, offset: int, server: str, timeout: float = 15) -> str:
    """The first line HAProxy logged after ``offset`` of ``server`` changing state."""

    def line():
        text = h.log.read_bytes()[offset:].decode("utf-8", "replace")
        return next((m[0] for m in re.finditer(rf"(?m)^.*Server \S+/{server} is .*$", text)), None)

    return st.wait_until(f"HAProxy's log about {server}", line, timeout, alive=h.check_alive)[0]


def save(h: st.HAProxy, saved: Path) -> None:
    """The save step, as the drop-in runs it."""
    cp = subprocess.run([str(SAVE), str(h.sock), str(saved)], capture_output=True, text=True, timeout=30)
    assert cp.returncode == 0, cp.stderr


def up_for(samples: list[tuple[float, tuple[str, str]]], since: float) -> str:
    up = [t - since for t, (op, _) in samples if op == UP]
    return f"UP until {max(up):.2f}s after the reload" if up else "never UP"


@pytest.mark.every_haproxy()
@pytest.mark.usefixtures("puppetserver")
def test_a_reload_with_the_saved_state_keeps_what_haproxy_knew(
    pmcheck, shipped_haproxy, testdir, haproxy_bin
):
    state_dir = testdir / "state"
    saved = testdir / "server-state"
    d = pmcheck.serve(state_dir, "--drained-status", "404", "--interval", "500ms", "--slow-start", "0s")
    dead = st.free_port()
    targets = [
        (f"{st.LOOPBACK}:{st.PUPPET_PORT}", d.port, st.free_port()),
        (f"{st.LOOPBACK}:{dead}", dead, st.free_port()),
    ]
    cfg, backend, (m1, m2) = st.render_haproxy(shipped_haproxy, st.free_port(), d.port, targets=targets)
    cfg = re.sub(
        rf"(?m)^backend {backend}$",
        f"backend {backend}\n    load-server-state-from-file local\n    server-state-file-name {saved}/{backend}",
        cfg,
    )
    h = st.HAProxy(testdir, "lb", cfg, "the shipped backend, keeping its state", haproxy_bin, None, True)
    new = h.release >= (3, 1)
    drain = ("drain", "--reason", "e2e reload", "--state-dir", str(state_dir), "--url", d.url)
    try:
        h.start()
        h.wait_server(backend, m1, st.is_up_checked, "UP", 30)
        h.wait_server(backend, m2, lambda s: s["status"] == "DOWN", "DOWN", 30)

        # 1. A master joins at a reload; compile02 is down, compile01 the last server.
        save(h, saved)
        rows = (saved / backend).read_text().splitlines()
        assert rows[0] == "1" and any(f" {m2} " in r for r in rows[2:]), rows
        joined = f"    server joined {st.LOOPBACK}:{dead} check port {dead} inter 2s rise 3 fall 3"
        h.cfg.write_text(f"{h.cfg.read_text().rstrip()}\n{joined}{' init-state down' if new else ''}\n")
        with Watch(h, backend) as watch:
            old, at = watch.reload(h)
            refused = pmcheck.run(*drain)
        down = watch.after(old, m2)
        assert down and all(op != UP for _, (op, _) in down), f"{m2} counted UP after the reload: {down[:20]}"
        joined_up = up_for(watch.after(old, "joined"), at)
        if new:
            assert joined_up == "never UP", (
                f"the joined server took agents before a healthy check: {joined_up}"
            )
            assert refused.returncode == 77, f"drain of the last server after a reload: {refused}"
            record(f"{h.label}: a server joining at a reload (init-state down)", "DOWN until a healthy check")
        else:
            record(f"{h.label}: a server joining at a reload (no init-state before 3.1)", joined_up)
        record(
            f"{h.label}: a down master through a reload with the state file",
            f"DOWN in all {len(down)} samples; drain of the last server then: exit {refused.returncode}",
        )

        # 2. compile01 drained, with a weight HAProxy set.
        assert pmcheck.run(*drain, "--force").returncode == 0
        h.wait_server(backend, m1, lambda s: s["status"] == "NOLB", "NOLB", 30)
        assert h.admin(f"set weight {backend}/{m1} 37").strip() == ""
        save(h, saved)
        with Watch(h, backend) as watch:
            offset = h.log.stat().st_size
            old, at = watch.reload(h)
        said = logged_since(h, offset, m1)
        drained = watch.after(old, m1)
        assert "changed from server-state after a reload" in said, said
        assert drained and all(op == NOLB for _, (op, _) in drained), f"{m1} left NOLB: {drained[:20]}"
        assert drained[0][1][1] == "37", f"{m1}'s weight after the reload: {drained[0]}"
        record(
            f"{h.label}: a drained master through a reload with the state file",
            f"NOLB in all {len(drained)} samples, weight 37 kept",
        )

        # The same reload without the file.
        (saved / backend).unlink()
        with Watch(h, backend) as watch:
            offset = h.log.stat().st_size
            old, at = watch.reload(h)
        said = logged_since(h, offset, m1)
        # Not loaded: it started UP, and its first check (pmcheck's 404) took it out again.
        assert "server-state" not in said and f"{m1} is stopping" in said, said
        assert [w for _, (_, w) in watch.after(old, m1)][-1] == "100"
        record(
            f"{h.label}: a reload without the state file",
            f"the drained master UP at the start, NOLB after its first check, weight 100; "
            f"the down master {up_for(watch.after(old, m2), at)}",
        )

        # 3. compile02 exported anew: another loopback address, other ports.
        save(h, saved)
        port, check = st.free_port(), st.free_port()
        text = h.cfg.read_text()
        line = re.search(rf"(?m)^\s*server {m2} .*$", text)[0]
        moved = line.replace(f"{st.LOOPBACK}:{dead} ", f"127.0.0.2:{port} ").replace(
            f" port {dead} ", f" port {check} "
        )
        assert moved.count(f" port {check} ") == 1 and f"127.0.0.2:{port} " in moved, moved
        h.cfg.write_text(text.replace(line, moved))

        def row(server: str) -> tuple[str, str, str, str]:
            r = next(r for r in h.servers_state(backend) if r["srv_name"] == server)
            return r["srv_addr"], r["srv_port"], r["srv_check_port"], r["srv_op_state"]

        with Watch(h, backend) as watch:
            watch.reload(h)
        addr, svc, chk, _ = row(m2)
        assert (addr, svc, chk) == ("127.0.0.2", str(dead), str(dead)), (
            f"{h.label} took {m2}'s address and ports otherwise than measured: {addr}:{svc}, check port {chk}"
        )
        record(
            f"{h.label}: a server at another address and ports, through a reload with its old state",
            "the configuration's address, the state file's ports",
        )
        agent1, agent2 = (
            re.search(rf"(?m)^\s*server {m} .*agent-port (\d+)", h.cfg.read_text())[1] for m in (m1, m2)
        )
        (saved / f"{backend}.ports").write_text(
            f"{m1} {st.PUPPET_PORT} {d.port} {agent1}\n{m2} {port} {check} {agent2}\n"
        )
        save(h, saved)
        assert f" {m2} " not in (saved / backend).read_text() and f" {m1} " in (saved / backend).read_text()
        with Watch(h, backend) as watch:
            old, _ = watch.reload(h)
        assert row(m2)[:3] == ("127.0.0.2", str(port), str(check)), row(m2)
        kept = watch.after(old, m1)
        assert kept and all(op == NOLB for _, (op, _) in kept), f"{m1} left NOLB: {kept[:20]}"
    finally:
        h.stop()
