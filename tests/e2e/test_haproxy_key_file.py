"""The load balancers' key kept out of haproxy.cfg as the README says: a root-only file of
`setenv` that HAProxy reads first (`-f pmcheck-key.cfg -f haproxy.cfg`, Debian's `CONFIG`), and
"${PMCHECK_KEY}" in packaging/haproxy/pmcheck.cfg where the key goes.

On every HAProxy release of each stack (2.6; 3.0, 3.2 and 3.4):
- `haproxy -c` passes with the key file first, and fails without it with the error the
  `EnvironmentFile=` recipe gave from a root shell (`'hdr' expects <name> and <value>`; 3.4:
  `argument number 4 ... is empty`);
- HAProxy run as Debian's unit runs it (master-worker, `-W`) sends the key in its HTTP and agent
  checks (pmcheck: proof `key`, the key's line), and after a new key in the file and a reload
  (the check, then SIGUSR2 to the master: Debian's ExecReload) sends the new one;
- a whole rotation, no restart anywhere, with the file holding one to four keys (three load
  balancers' own, then a fourth, the new one): the new key on the master (its file, then
  `systemctl reload pmcheck`: SIGHUP), then on the load balancer (its key file, then its
  reload), then the old key taken out of the master's file (SIGHUP again). No check from the
  load balancer is unproven at any moment: every poller at its address proves itself with a key
  in every status read along the way.
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest

import e2e_stack as st
from conftest import record

pytestmark = pytest.mark.ci_on("debian12", "debian13")

OWN = {"User-Agent": "pmcheck/e2e"}
ENV_KEY = "${PMCHECK_KEY}"


def key_cfg(path: Path, key: str) -> Path:
    path.write_text(
        f"# tests/e2e/test_haproxy_key_file.py, as the README's\nglobal\n    setenv PMCHECK_KEY {key}\n"
    )
    path.chmod(0o600)
    return path


def proving(d: st.PmcheckServe) -> set[tuple[int, str]]:
    """(key line, kind) of the checks from 127.0.0.1 that proved themselves and still poll."""
    pollers = d.get("/status", headers=OWN).json().get("pollers") or []
    return {
        (p["key_line"], kind)
        for p in pollers
        if p["address"] == st.LOOPBACK and p.get("proof") == "key" and p.get("polling")
        for kind in ("http", "agent")
        if p.get(kind) and p[kind]["last_ms_ago"] < 3000
    }


def write_keys(path: Path, keys: list[str]) -> None:
    """The master's key file, each key bound to the load balancer's address, as a rotation
    writes it: a new file renamed over the old."""
    new = path.with_suffix(".new")
    new.write_text("".join(f"{key} {st.LOOPBACK}\n" for key in keys))
    new.chmod(0o640)
    new.rename(path)


def key_lines(d: st.PmcheckServe) -> int:
    """How many keys the daemon holds now."""
    return len((d.get("/status", headers=OWN).json().get("lb_key_file") or {}).get("keys") or [])


def unproven_polls(d: st.PmcheckServe) -> tuple[int, list[str]]:
    """The polls made by the pollers at the load balancer's address that prove nothing (a check
    whose key the master does not hold, yet or any more; the harness's own readiness poll at
    pmcheck's start, before HAProxy), and those pollers. Counted, not timed: a slow status read
    never takes that earlier poll for a new one."""
    pollers = d.get("/status", headers=OWN).json().get("pollers") or []
    them = [p for p in pollers if p["address"] == st.LOOPBACK and p.get("proof") != "key"]
    return sum(p["polls"] for p in them), [f"{p['proof']} ({p['polls']} polls)" for p in them]


@pytest.mark.every_haproxy()
@pytest.mark.usefixtures("puppetserver")
def test_a_key_file_read_first_passes_haproxy_c_and_follows_a_reload(
    pmcheck, shipped_haproxy, testdir, haproxy_bin
):
    old, new = secrets.token_hex(32), secrets.token_hex(32)
    # Two other load balancers' own keys: the file holds three, then four, then three.
    others = [secrets.token_hex(32) for _ in range(2)]
    keys = testdir / "lb-key"
    write_keys(keys, [old, *others])
    agent = st.free_port()
    d = pmcheck.serve(
        testdir / "state",
        "--lb-key-file",
        str(keys),
        "--agent-listen",
        f"{st.LOOPBACK}:{agent}",
        "--interval",
        "500ms",
    )
    cfg, _, _ = st.render_haproxy(shipped_haproxy, st.free_port(), d.port, agent_port=agent, key=ENV_KEY)
    assert cfg.count(f'X-Pmcheck-Key "{ENV_KEY}"') == 1 and cfg.count(f" {ENV_KEY}\\n") == 2, cfg
    first = key_cfg(testdir / "pmcheck-key.cfg", old)
    h = st.HAProxy(
        testdir, "lb", cfg, "the shipped backend, its key from pmcheck-key.cfg", haproxy_bin, first, True
    )
    try:
        alone = subprocess.run(
            [haproxy_bin, "-c", "-f", str(h.cfg)], capture_output=True, text=True, timeout=30
        )
        said = alone.stdout + alone.stderr  # 2.6 to 3.2: 'hdr' expects ...; 3.4: argument ... is empty
        assert alone.returncode != 0 and ("'hdr' expects" in said or "is empty" in said), alone
        before = unproven_polls(d)[0]
        h.start()  # validates with the key file first: `haproxy -c` must pass
        st.wait_until(
            "the old key's checks, both kinds", lambda: proving(d) >= {(1, "http"), (1, "agent")}, 20
        )
        bad: list[str] = []

        def step(what: str, done) -> float:
            """Reads status until `done`; no read may show an unproven poller."""

            def read():
                polls, them = unproven_polls(d)
                if polls > before:
                    bad.append(f"{what}: {them}")
                return done()

            took = st.wait_until(what, read, 30, interval=0.05, alive=d.check_alive)[1]
            assert not bad, f"a check from the load balancer proved nothing: {bad}"
            return took

        step("the load balancer proven from its start", lambda: True)

        # 1. the master learns the new key: four keys, the old still proving on line 1.
        write_keys(keys, [old, *others, new])
        d.reload()
        step("the master holds four keys", lambda: key_lines(d) == 4)
        step("the old key's checks still proven", lambda: proving(d) >= {(1, "http"), (1, "agent")})
        # 2. the load balancer sends it: line 4.
        key_cfg(first, new)
        h.reload()
        took = step(
            "the new key's checks after the reload", lambda: proving(d) >= {(4, "http"), (4, "agent")}
        )
        step("no check with the old key", lambda: not {(1, "http"), (1, "agent")} & proving(d))
        record(f"{h.label}: the key file's new key, sent after a reload", f"{took:.1f}s")
        # 3. the old key leaves the master: three keys, the new one now on line 3.
        write_keys(keys, [*others, new])
        d.reload()
        step("the master holds three keys", lambda: key_lines(d) == 3)
        step("the new key's checks on its new line", lambda: proving(d) >= {(3, "http"), (3, "agent")})
    finally:
        h.stop()
