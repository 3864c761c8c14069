"""The load balancers' key kept out of haproxy.cfg as the README says: a root-only file of
`setenv` that HAProxy reads first (`-f pmcheck-key.cfg -f haproxy.cfg`, Debian's `CONFIG`), and
"${PMCHECK_KEY}" in packaging/haproxy/pmcheck.cfg where the key goes.

On every HAProxy release of each stack (2.6; 3.0, 3.2 and 3.4):
- `haproxy -c` passes with the key file first, and fails without it with the error the
  `EnvironmentFile=` recipe gave from a root shell (`'hdr' expects <name> and <value>`; 3.4:
  `argument number 4 ... is empty`);
- HAProxy run as Debian's unit runs it (master-worker, `-W`) sends the key in its HTTP and agent
  checks (pmcheck: proof `key`, the key's line), and after a new key in the file and a reload
  (the check, then SIGUSR2 to the master: Debian's ExecReload) sends the new one, which pmcheck's
  key file holds beside the old (a rotation's middle step).
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


@pytest.mark.every_haproxy()
@pytest.mark.usefixtures("puppetserver")
def test_a_key_file_read_first_passes_haproxy_c_and_follows_a_reload(
    pmcheck, shipped_haproxy, testdir, haproxy_bin
):
    old, new = secrets.token_hex(32), secrets.token_hex(32)
    keys = testdir / "lb-key"
    keys.write_text(f"{old} {st.LOOPBACK}\n{new} {st.LOOPBACK}\n")
    keys.chmod(0o640)
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
        h.start()  # validates with the key file first: `haproxy -c` must pass
        st.wait_until(
            "the old key's checks, both kinds", lambda: proving(d) >= {(1, "http"), (1, "agent")}, 20
        )
        key_cfg(first, new)
        h.reload()
        _, took = st.wait_until(
            "the new key's checks after the reload", lambda: proving(d) >= {(2, "http"), (2, "agent")}, 20
        )
        st.wait_until("no check with the old key", lambda: not {(1, "http"), (1, "agent")} & proving(d), 20)
        record(f"{h.label}: the key file's new key, sent after a reload", f"{took:.1f}s")
    finally:
        h.stop()
