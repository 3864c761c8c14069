"""Restarts on a fleet of three booted compile masters, while three agents loop through HAProxy 3.0:
the ones nobody routes through pmcheck (`systemctl restart`, a package's maintainer scripts), the
shipped Ansible rolling restart, a play that fails half-way, and two restarts at the same moment.
Each figure is measured beside its baseline: the same restart with drain on stop turned off.

The tests run in this order and share the fleet (conftest.py); each leaves every master UP.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass

import e2e_stack as st
from conftest import DRAINED, Fleet, Master, measured

RESTART = "systemctl restart puppetserver"
REINSTALL = "DEBIAN_FRONTEND=noninteractive apt-get install --reinstall -y -q puppetserver"
# Between the HAProxy watch's samples (0.2 s) a change is seen up to one interval late.
SAMPLE = 0.25


@dataclass
class Restart:
    master: Master
    command: str
    start: float  # time.monotonic()
    end: float  # HAProxy has it UP again
    wall: float  # time.time() at start
    jvm_before: str
    jvm_after: str


def restart(fleet: Fleet, m: Master, command: str = RESTART, in_flight: bool = True) -> Restart:
    """COMMAND on the master over SSH, begun while an agent's run is in flight there (as a
    restart nobody times meets one) unless ``in_flight`` is false, then until HAProxy has it UP
    again."""
    jvm = m.jvm()
    if in_flight and not fleet.busy(m):
        measured(f"{m.name}: no agent session", f"`{command}` begins with none in flight there")
    wall, start = time.time(), time.monotonic()
    m.ssh(command)
    end = fleet.wait_up(m)
    r = Restart(m, command, start, end, wall, jvm, m.jvm())
    assert r.jvm_after not in ("", "0", r.jvm_before), (
        f"`{command}` on {m.name} did not restart Puppet Server"
    )
    return r


def figures(fleet: Fleet, what: str, t0: float, t1: float) -> tuple[list, str]:
    """The agent runs that overlapped, the failed ones, and HAProxy's fewest servers UP."""
    runs, failed = fleet.runs(t0, t1), fleet.failed(t0, t1)
    assert fleet.ha is not None
    worst = fleet.ha.worst(t0, t1)
    said = f"{len(failed)} of {len(runs)} runs failed ({t1 - t0:.0f}s); {worst}"
    measured(what, said + (f"; failed: {fleet.describe_failed(failed)}" if failed else ""))
    for r in failed:
        print(fleet.explain(r))
    return failed, said


def first(lines: list[tuple[float, str]], text: str, after: float = 0.0) -> float | None:
    return next((t for t, line in lines if text in line and t >= after), None)


def test_baseline_a_plain_restart_without_drain_on_stop(fleet: Fleet):
    """The figure the others stand beside: PMCHECK_DRAIN_ON_STOP=no, `systemctl restart`."""
    m = fleet.masters[0]
    m.ssh("echo PMCHECK_DRAIN_ON_STOP=no >>/etc/default/pmcheck")
    try:
        r = restart(fleet, m)
    finally:
        m.ssh("sed -i '/^PMCHECK_DRAIN_ON_STOP=no$/d' /etc/default/pmcheck")
    journal = m.journal(r.wall)
    assert first(journal, "PMCHECK_DRAIN_ON_STOP=no: puppetserver.service stops without a drain"), journal
    drained = [a for a in fleet.answers.between(m, r.start, r.end) if a.line.startswith(DRAINED)]
    assert not drained, f"the baseline drained: {drained[0]}"
    figures(fleet, f"baseline: a plain restart of {m.name}, drain on stop off", r.start, r.end)


def test_a_plain_restart_of_each_master_in_turn_loses_no_run(fleet: Fleet):
    assert fleet.h is not None
    log_before = fleet.h.log.read_text(errors="replace")
    restarts = [restart(fleet, m) for m in fleet.masters]
    t0, t1 = restarts[0].start, restarts[-1].end
    failed, said = figures(fleet, "a plain `systemctl restart puppetserver` of each master in turn", t0, t1)
    assert not failed, f"{said}: {fleet.describe_failed(failed)}"
    assert fleet.ha is not None
    assert fleet.ha.worst(t0, t1).fewest >= 2, said
    # A restart never shows DOWN: the stop's hold keeps the master out as NOLB until the first
    # probe that finds the new Puppet Server healthy (the audit saw 4 s of DOWN, 1 restart in 2).
    for r in restarts:
        down = [
            f"+{t - r.start:.1f}s {s[r.master.server]['status']}"
            for t, s in fleet.ha.between(r.start, r.end)
            if s[r.master.server]["status"].startswith("DOWN")
        ]
        assert not down, f"{r.master.name} shown DOWN during its restart: {down[:5]}"
    logged = fleet.h.log.read_text(errors="replace")[len(log_before) :]
    went_down = [line for line in logged.splitlines() if re.search(r"Server \S+ is DOWN", line)]
    measured("HAProxy's log during the restarts in turn", f"{len(went_down)} line(s) of a server going DOWN")
    assert not went_down, went_down[:5]

    # The timeline of the first one, from the master's journal, pmcheck's answers and HAProxy.
    r = restarts[0]
    m, ha = r.master, fleet.ha
    journal = [(fleet.mono(t), line) for t, line in m.journal(r.wall)]
    t0 = next((a.t for a in fleet.answers.between(m, r.start, r.end) if a.line.startswith(DRAINED)), None)
    assert t0 is not None, "pmcheck never answered DRAINED during the restart"
    nolb = [(t, s[m.server]) for t, s in ha.between(t0, r.end) if not st.fleet.serving(s[m.server])]
    assert nolb, f"HAProxy never took {m.server} out: {ha.changes(m.server, r.start, r.end)}"
    t1_, nolb_state = nolb[0]
    t2 = next((t for t, s in ha.between(t1_, r.end) if s[m.server]["scur"] == "0"), None)
    t3 = first(journal, "Stopping puppetserver.service")
    t4 = first(journal, "Started puppetserver.service")
    t5 = next((a.t for a in fleet.answers.between(m, t4 or r.end, r.end + 5) if a.code == 200), None)
    stops_now = first(journal, "puppetserver.service stops now")
    line = (
        f"drained +{t0 - r.start:.1f}s, HAProxy {nolb_state['status']} +{t1_ - r.start:.1f}s, "
        f"its sessions 0 +{(t2 or 0) - r.start:.1f}s, pmcheck's stop wait ended "
        f"+{(stops_now or 0) - r.start:.1f}s, SIGTERM +{(t3 or 0) - r.start:.1f}s, "
        f"Puppet Server ready +{(t4 or 0) - r.start:.1f}s, 200 +{(t5 or 0) - r.start:.1f}s"
    )
    measured(f"the timeline of {m.name}'s restart (from `systemctl restart`)", line)
    assert nolb_state["status"].startswith("NOLB"), f"out as {nolb_state['status']}, not NOLB: {line}"
    assert None not in (t2, t3, t4, t5, stops_now), line
    assert t0 <= t1_ <= t2 <= t3 + SAMPLE, line  # type: ignore[operator]
    assert t3 < t4 <= t5, line  # type: ignore[operator]
    # The drain-event log has the stop's hold and its end; no record is left behind.
    events = m.ssh(
        f"journalctl -u pmcheck --since @{r.wall:.3f} -o cat -q ACTION=stop_drain + ACTION=stop_undrain"
    ).stdout.splitlines()
    assert len(events) >= 2, events
    assert all(x.drain_record() is None for x in fleet.masters), "a drain record was left behind"


def test_a_package_reinstall_loses_no_run(fleet: Fleet):
    """`apt-get install --reinstall puppetserver`: its prerm stops Puppet Server, its postinst
    starts it, both through systemd."""
    m = fleet.masters[1]
    r = restart(fleet, m, REINSTALL)
    journal = m.journal(r.wall)
    assert first(journal, "drained for this stop of puppetserver.service"), journal
    failed, said = figures(fleet, f"`apt-get install --reinstall puppetserver` on {m.name}", r.start, r.end)
    assert not failed, f"{said}: {fleet.describe_failed(failed)}"


def hosts(fleet: Fleet, commands: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """The inventory: every master by its name over SSH (root's ~/.ssh/config), with a command of
    its own where given (else the playbook's default, a restart)."""
    out: dict[str, dict[str, str]] = {}
    for m in fleet.masters:
        out[m.name] = {"ansible_user": "root", "ansible_python_interpreter": "/usr/bin/python3"}
        if commands and m.name in commands:
            out[m.name]["pmcheck_command"] = commands[m.name]
    return out


def roll_mark(m: Master) -> dict | None:
    """The roll's mark on the master (`pmcheck roll begin`), if any."""
    cp = m.ssh("cat /var/lib/pmcheck/roll", check=False)
    return json.loads(cp.stdout) if cp.returncode == 0 else None


def test_the_ansible_rolling_restart_of_three_loses_no_run(fleet: Fleet, tmp_path):
    """The roll, and a second play begun while it runs (issue 46, part 8): before, its pre-check
    passed in the window after a master was back UP, and only the cycles' guard protected the
    backend. Now every master carries the first roll's mark and the second play is refused
    before it touches anything."""
    jvms = {m.name: m.jvm() for m in fleet.masters}
    rolls: dict[str, st.Roll] = {}
    first = threading.Thread(
        target=lambda: rolls.update(first=st.ansible_roll(hosts(fleet), tmp_path / "roll"))
    )
    first.start()
    try:
        st.wait_until(
            "the first roll's mark on every master",
            lambda: all(roll_mark(m) for m in fleet.masters) or not first.is_alive(),
            300,
            0.5,
        )
        marks = {m.name: roll_mark(m) for m in fleet.masters}
        names = {(mark or {}).get("roll") for mark in marks.values()}
        assert len(names) == 1 and None not in names, marks
        second = st.ansible_roll(hosts(fleet), tmp_path / "second")
        assert second.code != 0 and not second.cycles, second.describe()
        refused = " ".join(second.failed.values())
        assert f"another roll is under way here: roll {names.pop()}" in refused, second.describe()
        measured("a second play during the roll", refused[:300])
    finally:
        first.join(1200)
    assert not first.is_alive(), "the first roll still runs"
    roll = rolls["first"]
    assert roll.code == 0, roll.describe()
    assert not any(roll_mark(m) for m in fleet.masters), "the roll's marks outlived it"
    assert list(roll.cycles) == [m.name for m in fleet.masters], roll.describe()
    assert all(c.code == 0 for c in roll.cycles.values()), roll.describe()
    # HAProxy sends the key as packaging/haproxy/pmcheck.cfg does, and nothing else on its
    # host polls: each cycle's wait goes by its proven word (out, no session left), and no
    # unproven poller is waited out by time.
    for name, c in roll.cycles.items():
        # The stop's hold its own restart left behind holds nothing once Puppet Server is back
        # (issue 53, part 3): the cycle waits for the load balancers, never says it stays drained.
        assert "stays drained" not in "\n".join(c.stdout), f"{name}: {c.stdout}"
        assert "wait-undrained" in c.steps, f"{name}: no wait-undrained step: {c.stdout}"
        drained = c.steps.get("wait-drained")
        assert drained is not None, f"{name}: no wait-drained step: {c.stdout}"
        measured(f"{name}: the cycle's wait for the drain", f"{drained[1]:.1f}s: {drained[2][:300]}")
        # (A load balancer's state header is read only from a proven poller.)
        assert "unverified" not in drained[2], f"{name}: {drained[2]}"
        assert re.search(r"load balancer \S+ .* says \w+ .*: out, no session left", drained[2]), (
            f"{name}: {drained[2]}"
        )
    end = max(fleet.wait_up(m) for m in fleet.masters)
    failed, said = figures(fleet, "the Ansible rolling restart of three masters", roll.start, end)
    assert not failed, f"{said}: {fleet.describe_failed(failed)}"
    assert fleet.ha is not None
    assert fleet.ha.worst(roll.start, end).fewest >= 2, said
    for m in fleet.masters:
        assert m.jvm() != jvms[m.name], f"the roll did not restart {m.name}'s Puppet Server"
        # Within the cycle, the stop's own hold found the node drained already: no second wait.
        waited = [line for _, line in m.journal(fleet.wall(roll.start)) if "safe to stop after" in line]
        assert waited, f"{m.name}: no stop wait in its journal"
        measured(f"{m.name}: the stop's own wait within the roll's cycle", waited[0])
        assert re.search(r"safe to stop after \d\.\ds", waited[0]), waited[0]


def test_a_play_whose_command_fails_on_master2_stops_there(fleet: Fleet, tmp_path):
    m1, m2, m3 = fleet.masters
    jvm3 = m3.jvm()
    reason = "fleet: an upgrade that fails on master2"
    commands = {m1.name: "true", m2.name: "echo 'fleet: the upgrade failed' >&2; exit 3"}
    roll = st.ansible_roll(hosts(fleet, commands), tmp_path / "fails", extra={"pmcheck_reason": reason})
    try:
        assert roll.code != 0, roll.describe()
        assert list(roll.cycles) == [m1.name, m2.name], roll.describe()
        assert "the roll stops here" in roll.failed.get(m2.name, ""), roll.describe()
        held = (m2.drain_record() or {}).get("holders", [])
        stopped = {"kind": "stopped-cycle", "what": f"{reason}; cycle stopped: the command exited with 3"}
        assert [{k: h.get(k) for k in stopped} for h in held] == [stopped], held
        code, line = m2.answer()
        assert line.startswith(DRAINED), (code, line)
        assert m3.drain_record() is None, "the play drained master3"
        assert m3.jvm() == jvm3, "the play restarted master3's Puppet Server"
        assert fleet.in_pool() == 2, "HAProxy should take agents to master1 and master3"
        marks = {m.name: roll_mark(m) for m in fleet.masters}
        assert not any(marks.values()), f"the failed roll kept its marks: {marks}"
        measured("a play failing on master2", f"{m2.name} said: {line}; {m3.name} untouched")
    finally:
        m2.ssh("pmcheck undrain", check=False)
        fleet.wait_up(m2)


def test_two_plain_restarts_at_the_same_moment_leave_a_master_up(fleet: Fleet):
    a, b = fleet.masters[0], fleet.masters[2]
    done: dict[str, Restart | BaseException] = {}

    def run(m: Master) -> None:
        try:
            done[m.name] = restart(fleet, m, in_flight=False)  # the moment is the point
        except BaseException as e:  # noqa: BLE001 - reported below
            done[m.name] = e

    threads = [threading.Thread(target=run, args=(m,)) for m in (a, b)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    t1 = time.monotonic()
    for name, r in done.items():
        assert isinstance(r, Restart), f"{name}: {r!r}"
    failed, said = figures(fleet, f"two plain restarts at once ({a.name}, {b.name})", t0, t1)
    assert fleet.ha is not None
    assert fleet.ha.worst(t0, t1).fewest >= 1, said
    assert not failed, f"{said}: {fleet.describe_failed(failed)}"


def test_two_cycles_in_a_row_each_return_with_the_master_up(fleet: Fleet):
    """Issue 53, point 3: the shipped drain on stop writes a stop's hold for the restart the
    cycle's own command makes; the cycle takes it for this restart's, waits until the daemon let
    go of it and HAProxy has the master back, and says "stays drained" only for another holder.
    Two in a row, so that the second meets whatever the first left."""
    m = fleet.masters[1]
    assert fleet.h is not None
    t0 = time.monotonic()
    for n in (1, 2):
        jvm = m.jvm()
        cp = m.ssh(
            f"pmcheck cycle --reason 'fleet: cycle {n} of 2' -- systemctl restart puppetserver",
            check=False,
        )
        # Read at once: the cycle returns only once the load balancer has the master UP.
        line = fleet.h.server(fleet.backend, m.server)
        said = f"cycle {n}: exit {cp.returncode}\n{cp.stdout}{cp.stderr}"
        assert cp.returncode == 0, said
        assert "stays drained" not in cp.stdout + cp.stderr, said
        assert "step wait-undrained" in cp.stdout, said
        assert st.is_up_checked(line), f"{said}\nHAProxy right after: {line}"
        assert m.jvm() not in ("", "0", jvm), f"cycle {n} did not restart Puppet Server"
        status = m.ssh("pmcheck status", check=False).stdout
        assert "drain:  not drained" in status, f"{said}\npmcheck status:\n{status}"
        measured(f"{m.name}: cycle {n} of 2 in a row", cp.stdout.strip().splitlines()[-1])
    t1 = time.monotonic()
    failed, said = figures(fleet, f"two cycles in a row on {m.name}", t0, t1)
    assert not failed, f"{said}: {fleet.describe_failed(failed)}"
