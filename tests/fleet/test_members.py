"""A compile master that joins the load balancer's backend by itself, through PuppetDB, and
leaves it the same way (packaging/puppet/pmcheck: class pmcheck's `export_to` and `retire`,
pmcheck::haproxy's `collect` and `keep_state`), while three agents loop through HAProxy 3.0.

master4 boots with Puppet Server stopped and out of the backend. Its Puppet run (catalogs from
master1, which stores them in PuppetDB) exports its member once its pmcheck answers 200; the load
balancer's Puppet run collects it into the backend, which the suite loads as Debian's unit would
reload HAProxy: the module's save step first, then the signal. Meanwhile master2 is drained and
must stay out through the reload. Then master4 retires: drained by its own Puppet run, withdrawn
at the next, removed by the load balancer's. Runs last (conftest.py): it leaves the backend as
Puppet wrote it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import e2e_stack as st
from conftest import Fleet, Master, measured

PUPPET_CFG = Path("/etc/haproxy/pmcheck-fleet.cfg")  # the backend Puppet writes (site.pp)
SAVE_STATE = "/usr/local/sbin/pmcheck-haproxy-save-state"  # class pmcheck::server_state's
STATE_DIR = "/var/lib/haproxy/pmcheck-state"
RETIRE_FACT = "/etc/facter/facts.d/pmcheck_fleet.txt"
# A run of the `members` environment on master1, as `puppet agent -t` would, without its cache.
PUPPET_RUN = (
    "puppet agent --onetime --no-daemonize --no-splay --no-usecacheonfailure --detailed-exitcodes"
    " --verbose --environment members"
)


def puppet_run(where: Master | None) -> str:
    """A Puppet run on a master (over SSH) or on the load balancer (here); its output. Exit 0
    or 2 (changes made) passes; anything else fails the test with what Puppet said."""
    if where is None:
        cp = subprocess.run(PUPPET_RUN.split(), capture_output=True, text=True, timeout=600)
        name = "the load balancer"
    else:
        cp = where.ssh(PUPPET_RUN, check=False)
        name = where.name
    if cp.returncode not in (0, 2):
        raise st.StackError(
            f"the Puppet run on {name} exited {cp.returncode}:\n{cp.stdout[-3000:]}{cp.stderr[-3000:]}"
        )
    return cp.stdout + cp.stderr


def exported(fleet: Fleet) -> list[str]:
    """The members PuppetDB holds (active nodes' latest catalogs), as pmcheck::haproxy asks."""
    pql = "resources[certname, parameters] { type = 'Pmcheck::Member' and exported = true }"
    out = (
        fleet.masters[0]
        .ssh(f'curl -sfG http://127.0.0.1:8080/pdb/query/v4 --data-urlencode "query={pql}"')
        .stdout
    )
    return sorted(r["parameters"]["server"] for r in json.loads(out))


def reload_from_puppet(fleet: Fleet) -> float:
    """The load balancer's Puppet run, then its backend loaded: the state saved by the module's
    step, the configuration checked and HAProxy's master signalled, as Debian's unit reloads
    with class pmcheck::server_state's drop-in. Returns time.monotonic() at the signal."""
    assert fleet.h is not None
    said = puppet_run(None)
    if "Warning" in said and "left out the member" in said:
        raise st.StackError(f"pmcheck::haproxy left a member out:\n{said[-2000:]}")
    text = fleet.h.cfg.read_text()
    cut = text.index(f"\nbackend {fleet.backend}")
    fleet.h.cfg.write_text(text[: cut + 1] + PUPPET_CFG.read_text())
    subprocess.run([SAVE_STATE, str(fleet.h.sock), STATE_DIR], check=True, capture_output=True, timeout=30)
    saved = Path(STATE_DIR, fleet.backend).read_text()
    assert all(m.server in saved for m in fleet.masters), f"the saved state lacks a master:\n{saved}"
    t = time.monotonic()
    fleet.h.reload()
    return t


def has_server(fleet: Fleet, server: str) -> bool:
    assert fleet.h is not None
    return any(s["svname"] == server for s in fleet.h.servers(fleet.backend))


def stayed_out(fleet: Fleet, server: str, t0: float, t1: float) -> bool:
    """Whether every sample between t0 and t1 had the server NOLB (drained; `NOLB 1/3` while a
    failed check counts): never a status that takes agents, nor DOWN (which would lose it the
    drain's weight and the last-server rule's count)."""
    assert fleet.ha is not None
    seen = [servers[server]["status"] for _, servers in fleet.ha.between(t0, t1) if server in servers]
    return bool(seen) and all(status.startswith("NOLB") for status in seen)


def effect(fleet: Fleet, at: float, log_from: int) -> str:
    """Each server's status and weight from 2 s before a reload to 10 s after, and what HAProxy
    logged of its checks since, for the record."""
    assert fleet.ha is not None and fleet.h is not None
    names = sorted({n for _, servers in fleet.ha.between(at - 2, at + 10) for n in servers})
    with open(fleet.h.log, "rb") as log:
        log.seek(log_from)
        said = [
            line
            for line in log.read().decode(errors="replace").splitlines()
            if "check for server" in line and not line.startswith("[")
        ]
    return "; ".join(f"{n}: {fleet.ha.changes(n, at - 2, at + 10)}" for n in names) + "".join(
        f"\n    {line[:300]}" for line in said[:12]
    )


def test_a_master_joins_through_puppetdb_and_retires_while_another_stays_drained(fleet: Fleet):
    assert fleet.h is not None and fleet.ha is not None
    new, drained = fleet.joiner, fleet.masters[1]
    t_begin = time.monotonic()

    # The new master: Puppet Server started, its pmcheck OK, then its Puppet run exports it.
    new.ssh("systemctl start puppetserver")
    st.wait_until(f"{new.name}'s pmcheck to answer 200", lambda: new.answer()[0] == 200, 300, interval=0.5)
    said = puppet_run(new)
    assert new.ssh("cat /etc/pmcheck/member").stdout.strip() == fleet.backend, said[-2000:]
    st.wait_until(f"PuppetDB to hold {new.server}", lambda: new.server in exported(fleet), 120, interval=1)
    assert not has_server(fleet, new.server), "the master is in the backend before the load balancer's run"

    # Another master drained before the reload: it must stay out through it.
    drained.ssh("pmcheck drain --reason 'fleet: stays out through the reload' --wait --max-wait 120s")
    fleet.h.wait_server(fleet.backend, drained.server, lambda s: s["status"] == "NOLB", "NOLB", 30)

    log_from = fleet.h.log.stat().st_size
    t_join = reload_from_puppet(fleet)
    fleet.h.wait_server(fleet.backend, new.server, st.is_up_checked, "UP, checked", 120)
    first_check = time.monotonic()
    fleet.h.wait_server(fleet.backend, new.server, lambda s: int(s["stot"] or 0) > 0, "with a session", 180)
    took_agents = time.monotonic()
    measured("the join's reload, each server", effect(fleet, t_join, log_from))
    measured(
        f"{new.server} joined",
        f"first passing check {first_check - t_join:.1f}s after the reload, first agent session "
        f"{took_agents - t_join:.1f}s after; weight "
        f"{fleet.ha.changes(new.server, t_join, time.monotonic())}",
    )
    assert stayed_out(fleet, drained.server, t_join - 1, time.monotonic()), (
        f"{drained.server} left NOLB at the reload: {fleet.ha.changes(drained.server, t_join - 1, time.monotonic())}"
    )
    weights = [
        int(servers[new.server]["weight"] or 0)
        for _, servers in fleet.ha.between(first_check, time.monotonic())
        if new.server in servers
    ]
    assert weights and min(weights) < 100, f"{new.server} did not ramp (weights {sorted(set(weights))})"

    # The new master retires: its run drains it (`pmcheck drain --wait`) and keeps the export,
    # the next withdraws it, the load balancer's removes the line.
    new.ssh(f"mkdir -p {os.path.dirname(RETIRE_FACT)} && echo pmcheck_fleet_retire=yes > {RETIRE_FACT}")
    said = puppet_run(new)
    assert "drain" in said and new.server in exported(fleet), said[-2000:]
    fleet.h.wait_server(fleet.backend, new.server, lambda s: s["status"] == "NOLB", "NOLB", 30)
    puppet_run(new)
    assert new.ssh("test -e /etc/pmcheck/member", check=False).returncode == 1, "the member marker stayed"
    st.wait_until(
        f"PuppetDB to drop {new.server}", lambda: new.server not in exported(fleet), 120, interval=1
    )
    log_from = fleet.h.log.stat().st_size
    t_leave = reload_from_puppet(fleet)
    st.wait_until(
        f"HAProxy to drop {new.server}", lambda: not has_server(fleet, new.server), 30, interval=0.2
    )
    measured("the leave's reload, each server", effect(fleet, t_leave, log_from))
    assert stayed_out(fleet, drained.server, t_join - 1, time.monotonic()), (
        f"{drained.server} left NOLB: {fleet.ha.changes(drained.server, t_join - 1, time.monotonic())}"
    )

    drained.ssh("pmcheck undrain --wait --max-wait 120s")
    fleet.wait_up(drained)
    t_end = time.monotonic()
    runs, failed = fleet.runs(t_begin, t_end), fleet.failed(t_begin, t_end)
    worst = fleet.ha.worst(t_begin, t_end)
    measured(
        "join and leave", f"{len(failed)} of {len(runs)} agent runs failed ({t_end - t_begin:.0f}s); {worst}"
    )
    assert not failed, fleet.describe_failed(failed)
    assert worst.samples > 0 and worst.zero == 0, f"a sample with no server UP: {worst}"
