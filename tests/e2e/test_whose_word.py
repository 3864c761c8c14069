"""Whose word it is: a load balancer's view is the key it proves itself with, not its address.

Real HAProxy processes (2.6 on Debian 12; 3.0, 3.2 and 3.4 on Debian 13) with packaging/haproxy/pmcheck.cfg
as shipped (its key placeholder replaced, each server line given a `source` address on
loopback), in front of compile masters' `pmcheck serve` (all probing the session's Puppet
Server), each with a key file of the test's own. Every HAProxy value is read from its admin
socket; "empty" below means a sample of `show servers state` and `show stat` in which no server
of the backend takes new agents (running, no drain or maintenance flag, weight above 0).

1. Two HAProxy processes checking master A from one address (127.0.0.1), one whose backend has
   only A (`lone`), the other A and B (`pair`), same server line names and the same `node`:
   - with one key they cannot be told apart: their headers of A's line flip between two views
     of the backend, `/status` holds that line as two views, `drain` is refused (77) naming
     them, and `lone` never goes empty;
   - with a key each they are two views: `drain` is refused (77) naming `lone`'s line alone
     (weight 100 of 100); written while `lone` was away, the drain takes A out of `pair` and is
     held at `lone` when it comes back (A never leaves it).
2. One key on two key-file lines (127.0.0.1 and 127.0.0.2), and one key bound to
   `::ffff:127.0.0.2`: HAProxy checking from 127.0.0.2 proves itself (`/status`: proof `key`),
   and `drain` of its backend's only server is refused (77) naming that load balancer. The
   control: the key bound to 127.0.0.1 alone, the same checks prove nothing (`elsewhere`) and
   the same drain empties the backend.
3. An agent check that cannot be placed (no `agent-send`; an `agent-send` copied from another
   backend's line) never says `drain` while the drain is held at its address: with A drained and
   B then taken out (forced), A takes agents again and its agent line says `up ... #... drain
   held`, and the backend is never empty.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import e2e_stack as st
from conftest import record

# Both stacks in CI; where a backend could go empty (two processes at one address, unplaced agent
# checks), every HAProxy release of the stack (2.6 on Debian 12; 3.0, 3.2 and 3.4 on Debian 13).
pytestmark = pytest.mark.ci_on("debian12", "debian13")

OWN = {"User-Agent": "pmcheck/e2e"}
COMMON = ("--drained-status", "404", "--interval", "500ms", "--slow-start", "0s")
PS = f"{st.LOOPBACK}:{st.PUPPET_PORT}"
SECOND = "127.0.0.2"
SAMPLE_FOR = 10.0  # seconds: five HTTP and five agent checks of each server (inter 2s)
ENOUGH = 40  # samples: SAMPLE_FOR's, every 0.1 s, gathered on where a loaded machine is slower


def new_key() -> str:
    return secrets.token_hex(32)


def key_file(testdir: Path, name: str, lines: list[str]) -> Path:
    path = testdir / f"lb-key-{name}"
    path.write_text("# tests/e2e/test_whose_word.py\n" + "".join(f"{line}\n" for line in lines))
    path.chmod(0o640)
    return path


def master(pmcheck, testdir: Path, name: str, keys: Path) -> tuple[st.PmcheckServe, int]:
    """``pmcheck serve`` for master ``name`` (agent port, 404 for drains, key file ``keys``)."""
    agent = st.free_port()
    d = pmcheck.serve(
        testdir / f"state-{name}", "--agent-listen", f"{st.LOOPBACK}:{agent}",
        "--lb-key-file", str(keys), *COMMON, name=name,
    )  # fmt: skip
    d.wait_verdict(200)
    return d, agent


def backend(
    shipped: str, servers: list[tuple[st.PmcheckServe, int]], key: str, source: str
) -> tuple[str, str, list[str]]:
    """The shipped file with its first ``len(servers)`` server lines, each checking one of
    ``servers`` from ``source`` and sending ``key``: (config, backend, server names)."""
    lines = shipped.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if re.match(r"\s*server\s", line)]
    assert len(at) >= len(servers), shipped
    text = "".join(line for i, line in enumerate(lines) if i not in at[len(servers) :])
    targets = [(PS, d.port, agent) for d, agent in servers]
    cfg, bk, names = st.render_haproxy(text, st.free_port(), servers[0][0].port, targets=targets, key=key)
    cfg, n = re.subn(r"(?m)^([ \t]*server\s.*\S)[ \t]*$", rf"\1 source {source}", cfg)
    assert n == len(servers), cfg
    return cfg, bk, names


def takes_new(s: dict[str, str]) -> bool:
    """HAProxy sends new agents to it: running (or falling), no drain or maintenance flag,
    a weight above 0."""
    return s["srv_op_state"] == "2" and not int(s["srv_admin_state"]) & 0x7F and int(s["weight"]) > 0


def shown(s: dict[str, str]) -> str:
    return f"{st.view(s)} weight={s['weight']} agent={s['agent_status']} {s.get('last_agt', '')!r}"


def never_empty(h: st.HAProxy, bk: str) -> Callable[[], str | None]:
    def wrong() -> str | None:
        servers = h.servers(bk)
        if not any(takes_new(s) for s in servers):
            return f"{h.name}: no server takes new agents: " + " | ".join(shown(s) for s in servers)
        return None

    return wrong


def stays_out(h: st.HAProxy, bk: str, srv: str) -> Callable[[], str | None]:
    def wrong() -> str | None:
        s = h.server(bk, srv)
        return f"{h.name}: {bk}/{srv} takes new agents: {shown(s)}" if takes_new(s) else None

    return wrong


def sample(seconds: float, **checks: Callable[[], str | None]) -> tuple[int, dict[str, list[str]]]:
    """Each check every 0.1 s for ``seconds``, and on until [`ENOUGH`] rounds (a loaded machine
    reads HAProxy's socket slower), within three times ``seconds``: how many rounds, and what
    each found wrong."""
    wrong: dict[str, list[str]] = {name: [] for name in checks}
    rounds = 0
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds or (rounds < ENOUGH and elapsed < 3 * seconds):
        for name, check in checks.items():
            said = check()
            if said:
                wrong[name].append(said)
        rounds += 1
        time.sleep(0.1)
    return rounds, wrong


def status(d: st.PmcheckServe) -> dict:
    return d.get("/status", headers=OWN).json()


def states(d: st.PmcheckServe, key_line: int | None = None) -> list[tuple[dict, dict]]:
    """(poller, state) of each server line a proven load balancer (of ``key_line``, if given)
    sent a state header for, still checked."""
    return [
        (p, s)
        for p in status(d).get("pollers") or []
        if p.get("proof") == "key" and key_line in (None, p.get("key_line"))
        for s in p.get("states") or []
        if s.get("seen") and s.get("polling")
    ]


def drain(pmcheck, d: st.PmcheckServe, *extra: str):
    return pmcheck.run(
        "drain", "--reason", "e2e whose word", *extra, "--state-dir", str(d.state_dir), "--url", d.url,
        timeout=60,
    )  # fmt: skip


def two_processes(pmcheck, haproxy, shipped_haproxy, testdir, keys: tuple[str, str], key_lines: list[str]):
    """A and B; HAProxy ``lone`` (A only, key ``keys[0]``) and ``pair`` (A and B, key
    ``keys[1]``), both checking from 127.0.0.1 with the same server line names and `node`."""
    path = key_file(testdir, "ab", key_lines)
    a = master(pmcheck, testdir, "a", path)
    b = master(pmcheck, testdir, "b", path)
    lone_cfg, bk, (m1,) = backend(shipped_haproxy, [a], keys[0], st.LOOPBACK)
    pair_cfg, bk2, (m1b, m2) = backend(shipped_haproxy, [a, b], keys[1], st.LOOPBACK)
    assert (bk, m1) == (bk2, m1b), (bk, m1, bk2, m1b)
    lone = haproxy("lone", lone_cfg, "the shipped backend, master A alone, checked from 127.0.0.1")
    pair = haproxy("pair", pair_cfg, "the shipped backend, masters A and B, checked from 127.0.0.1")
    for h, srv in ((lone, m1), (pair, m1), (pair, m2)):
        h.wait_server(bk, srv, st.is_up_checked, "UP (L7OK/200)", 30)
    return a[0], b[0], lone, pair, bk, (m1, m2), (lone_cfg, path)


@pytest.mark.every_haproxy()
@pytest.mark.usefixtures("puppetserver")
def test_one_key_one_node_two_processes_hold_every_drain(pmcheck, haproxy, shipped_haproxy, testdir):
    key = new_key()
    a, _b, lone, pair, bk, (m1, _m2), _ = two_processes(
        pmcheck, haproxy, shipped_haproxy, testdir, (key, key), [f"{key} {st.LOOPBACK}"]
    )
    # Their headers of A's one line flip between 100/100 (lone) and 100/200 (pair).
    t0 = time.monotonic()
    found, _ = st.wait_until(
        "A's /status: the drain rule holds its line as two views",
        lambda: [(p, s) for p, s in states(a) if s.get("holds") == "two_views"],
        30,
    )
    (p, s), *_ = found
    assert (p["address"], s["seen"]["backend"], s["seen"]["server"]) == (st.LOOPBACK, bk, m1), found
    record("one key, one node, two HAProxy: A's line held as two views", f"{time.monotonic() - t0:.1f}s")

    # The guard names them whichever HAProxy's header of the line came last; nothing is written.
    for total in (100, 200):
        st.wait_until(
            f"A's line: the latest header says weight 100/{total}",
            lambda total=total: [s for _, s in states(a) if s["seen"]["total_weight"] == total],
            10,
        )
        cp = drain(pmcheck, a)
        assert cp.returncode == 77, (cp.returncode, cp.stdout, cp.stderr)
        assert "two load balancers" in cp.stderr and "answer as one" in cp.stderr, cp.stderr
        assert f"{bk}/{m1}" in cp.stderr and "its own key" in cp.stderr, cp.stderr
        assert not (a.state_dir / "drain").exists(), "a refused drain wrote a record"

    rounds, wrong = sample(SAMPLE_FOR, lone=never_empty(lone, bk), pair=never_empty(pair, bk))
    assert rounds >= ENOUGH, rounds
    assert not wrong["lone"] and not wrong["pair"], "\n".join((wrong["lone"] + wrong["pair"])[:10])
    assert all(takes_new(s) for s in lone.servers(bk)), lone.servers(bk)
    assert any(s.get("holds") == "two_views" for _, s in states(a)), status(a)
    record(
        "one key, one node, two HAProxy: drain of A",
        f"exit 77 naming two load balancers as one; {rounds} samples over {SAMPLE_FOR:.0f}s, 0 empty",
    )


@pytest.mark.usefixtures("puppetserver")
def test_a_key_each_is_a_view_each(pmcheck, haproxy, shipped_haproxy, testdir):
    keys = (new_key(), new_key())
    a, _b, lone, pair, bk, (m1, m2), (lone_cfg, _) = two_processes(
        pmcheck, haproxy, shipped_haproxy, testdir, keys, [f"{k} {st.LOOPBACK}" for k in keys]
    )
    views, _ = st.wait_until(
        "A's /status: a poller per key, each with its own view of A's line",
        lambda: (
            (v := {p["key_line"]: s for p, s in states(a)})
            and len(v) == 2
            and {s["seen"]["total_weight"] for s in v.values()} == {100, 200}
            and v
        ),
        20,
    )
    assert all(s.get("holds") != "two_views" for s in views.values()), views
    lone_line = next(k for k, s in views.items() if s["seen"]["total_weight"] == 100)
    pair_line = next(k for k in views if k != lone_line)
    assert views[lone_line].get("holds") == "last_server", views
    assert views[pair_line].get("holds") is None, views

    # The guard: refused, by lone's word only (pair has B).
    cp = drain(pmcheck, a)
    assert cp.returncode == 77, (cp.returncode, cp.stdout, cp.stderr)
    assert f"says {m1} is the only server taking new agents in backend {bk} (weight 100 of 100)" in cp.stderr
    assert "of 200" not in cp.stderr and "answer as one" not in cp.stderr, cp.stderr
    assert not (a.state_dir / "drain").exists(), "a refused drain wrote a record"
    record("a key each, two HAProxy from one address: drain of A", "exit 77 naming the lone one's line alone")

    # Written while lone is away (its line no longer checked), the drain takes A out of pair...
    lone.stop()
    lone.proc = None  # stopped by its PID: the fixture's teardown has nothing left to stop
    st.wait_until(
        "A's /status: lone's line no longer checked",
        lambda: not [p for p, _ in states(a) if p["key_line"] == lone_line],
        30,
    )
    cp = drain(pmcheck, a)
    assert cp.returncode == 0, (cp.returncode, cp.stdout, cp.stderr)
    assert (a.state_dir / "drain").exists()
    pair.wait_server(bk, m1, lambda s: not takes_new(s), "A out (NOLB/DRAIN)", 15)
    assert takes_new(pair.server(bk, m2)), shown(pair.server(bk, m2))

    # ... and is held at lone when it comes back: A never leaves it.
    again = haproxy("lone-again", lone_cfg, "lone again, A drained meanwhile")
    again.wait_server(bk, m1, st.is_up_checked, "UP (L7OK/200: held)", 30)
    st.wait_until(
        "A's /status: lone's line held (last server), pair's out",
        lambda: (
            (v := {p["key_line"]: s for p, s in states(a)})
            and v.get(lone_line, {}).get("held") == "last_server"
            and v.get(pair_line, {}).get("told") == "DRAINED"
        ),
        20,
    )
    rounds, wrong = sample(SAMPLE_FOR, lone=never_empty(again, bk), pair=stays_out(pair, bk, m1))
    assert rounds >= ENOUGH, rounds
    assert not wrong["lone"], "\n".join(wrong["lone"][:10])
    assert not wrong["pair"], "\n".join(wrong["pair"][:10])
    assert (a.state_dir / "drain").exists(), "the drain was undone"
    agt = again.server(bk, m1).get("last_agt", "")
    record(
        "a key each, two HAProxy from one address: A drained while lone was away",
        f"{rounds} samples over {SAMPLE_FOR:.0f}s: A out of pair in each, lone never empty"
        f" (its agent: {agt!r})",
    )
    # A's own undrain, so the teardown leaves nothing drained
    cp = pmcheck.run("undrain", "--state-dir", str(a.state_dir), "--url", a.url)
    assert cp.returncode == 0, cp.stderr


@pytest.mark.usefixtures("puppetserver")
@pytest.mark.parametrize("bound", ["two-lines", "mapped", "elsewhere"])
def test_a_key_proves_from_each_address_it_is_bound_to(pmcheck, haproxy, shipped_haproxy, testdir, bound):
    """``elsewhere`` is the control: the key bound to 127.0.0.1 alone, HAProxy's checks from
    127.0.0.2 prove nothing, and the drain empties the backend (what the first two did before
    a key's lines were one key and a mapped address matched its IPv4 peer)."""
    key = new_key()
    lines = {
        "two-lines": [f"{key} {st.LOOPBACK}", f"{key} {SECOND}"],
        "mapped": [f"{key} ::ffff:{SECOND}"],
        "elsewhere": [f"{key} {st.LOOPBACK}"],
    }[bound]
    proven = bound != "elsewhere"
    a = master(pmcheck, testdir, "a", key_file(testdir, "a", lines))
    cfg, bk, (m1,) = backend(shipped_haproxy, [a], key, SECOND)
    h = haproxy("lb", cfg, f"the shipped backend, master A alone, checked from {SECOND}")
    h.wait_server(bk, m1, st.is_up_checked, "UP (L7OK/200)", 30)
    d = a[0]
    st.wait_until(
        f"A's /status: HAProxy's HTTP and agent checks from {SECOND}",
        lambda: [
            p for p in status(d)["pollers"] if p["address"] == SECOND and p.get("http") and p.get("agent")
        ],
        20,
    )
    if proven:
        st.wait_until(
            f"A's /status: {SECOND} proven by the key, A its last server",
            lambda: [s for p, s in states(d) if p["address"] == SECOND and s.get("holds") == "last_server"],
            20,
        )
    pollers = status(d)["pollers"]
    want = "key" if proven else "elsewhere"
    assert [p["proof"] for p in pollers if p["address"] == SECOND] == [want], pollers
    # (127.0.0.1: the test's own polls of A's verdict, which send no key)
    assert not [p for p in pollers if p["address"] != SECOND and p["proof"] != "no-key"], pollers

    cp = drain(pmcheck, d)
    if not proven:
        assert cp.returncode == 0, (cp.returncode, cp.stdout, cp.stderr)
        _, took = h.wait_server(bk, m1, lambda s: not takes_new(s), "A out: the backend empty", 15)
        record(f"control: key bound to {st.LOOPBACK} alone, HAProxy from {SECOND}",
               f"proof elsewhere; drain exit 0, the backend empty {took:.1f}s later")  # fmt: skip
        cp = pmcheck.run("undrain", "--state-dir", str(d.state_dir), "--url", d.url)
        assert cp.returncode == 0, cp.stderr
        return
    assert cp.returncode == 77, (cp.returncode, cp.stdout, cp.stderr)
    said = f"load balancer {SECOND}"
    assert (
        said in cp.stderr and f"says {m1} is the only server taking new agents in backend {bk}" in cp.stderr
    )
    assert not (d.state_dir / "drain").exists(), "a refused drain wrote a record"
    rounds, wrong = sample(3.0, lb=never_empty(h, bk))
    assert rounds >= 10 and not wrong["lb"], (rounds, wrong["lb"][:5])
    record(f"key bound as {' / '.join(line.split(' ', 1)[1] for line in lines)}, HAProxy from {SECOND}",
           "proof key; drain of its last server: exit 77 naming it")  # fmt: skip


@pytest.mark.every_haproxy()
@pytest.mark.usefixtures("puppetserver")
@pytest.mark.parametrize("agent_send", ["none", "copied"])
def test_an_agent_check_that_cannot_be_placed_keeps_a_held_node_in(
    pmcheck, haproxy, shipped_haproxy, testdir, agent_send
):
    key = new_key()
    path = key_file(testdir, "abc", [f"{key} {st.LOOPBACK}"])
    a = master(pmcheck, testdir, "a", path)
    b = master(pmcheck, testdir, "b", path)
    cfg, bk, (m1, m2) = backend(shipped_haproxy, [a, b], key, st.LOOPBACK)
    send = re.compile(r'\s+agent-send\s+"[^"]*"')
    if agent_send == "none":
        # a backend written before `agent-send` was shipped: its agent checks send nothing
        cfg, n = send.subn("", cfg)
        assert n == 2, cfg
        other = None
    else:
        # a second backend `other` (A and C); bk's A sends the agent-send of other's A line
        c = master(pmcheck, testdir, "c", path)
        with_c, _, _ = backend(shipped_haproxy, [a, c], key, st.LOOPBACK)
        block = re.search(rf"(?ms)^backend {re.escape(bk)}\n.*?(?=^\S|\Z)", with_c)
        assert block is not None, with_c
        other = "other"
        copy = block[0].replace(f"backend {bk}", f"backend {other}", 1).replace(f'"{bk}/', f'"{other}/')
        cfg, n = re.subn(rf'(server {m1} .*agent-send\s+"){re.escape(bk)}/{m1}\s', rf"\1{other}/{m1} ", cfg)
        assert n == 1, cfg
        assert cfg.count(f'"{other}/{m1} {key}') == 1 and copy.count(f'"{other}/{m1} {key}') == 1, cfg
        cfg += "\n" + copy
    h = haproxy("lb", cfg, f"the shipped backend, agent-send {agent_send}")
    for be, srv in [(bk, m1), (bk, m2)] + ([(other, m1), (other, m2)] if other else []):
        h.wait_server(be, srv, st.is_up_checked, "UP (L7OK/200)", 30)
    da, db = a[0], b[0]

    # A drained while B serves (and C in `other`): the guard lets it, A leaves every backend.
    # A's lines must show the other server in: a header sent before it came UP says A is last.
    def shared() -> bool:
        seen = [s["seen"] for _, s in states(da)]
        return len(seen) >= (2 if other else 1) and all(v["total_weight"] > v["weight"] for v in seen)

    st.wait_until("A's /status: its lines as HAProxy checks them, another server in", shared, 15)
    cp = drain(pmcheck, da)
    assert cp.returncode == 0, (cp.returncode, cp.stdout, cp.stderr)
    for be in [bk] + ([other] if other else []):
        h.wait_server(be, m1, lambda s: not takes_new(s), "A out", 15)
    # B leaves too (forced: it is bk's last server): A is bk's last, and its drain is held there.
    cp = drain(pmcheck, db, "--force")
    assert cp.returncode == 0, (cp.returncode, cp.stdout, cp.stderr)
    h.wait_server(bk, m2, lambda s: not takes_new(s), "B out (forced)", 15)
    _, took = h.wait_server(bk, m1, takes_new, "A taking agents again (the drain held), agent included", 20)
    st.wait_until(
        "bk/A's agent line says the drain is held",
        lambda: "drain held" in h.server(bk, m1).get("last_agt", ""),
        10,
    )
    record(f"agent-send {agent_send}: A held in bk once B left", f"{took:.1f}s after B's forced drain")

    agent_lines: list[str] = []

    def agent_up() -> str | None:
        s = h.server(bk, m1)
        agt = s.get("last_agt", "")
        if s["agent_status"].startswith("*") or not agt:
            return None  # a check under way clears the text: tells nothing
        agent_lines.append(agt)
        if "drain held" not in agt or "DRAINED" in agt:
            return f"bk/{m1} agent line {agt!r}: {shown(s)}"
        return None

    checks = {"bk": never_empty(h, bk), "agent": agent_up}
    if other:
        checks["other"] = stays_out(h, other, m1)
    rounds, wrong = sample(SAMPLE_FOR, **checks)
    assert rounds >= ENOUGH, rounds
    assert len(agent_lines) >= ENOUGH // 2, agent_lines
    for name, said in wrong.items():
        assert not said, f"{name}:\n" + "\n".join(said[:10])
    assert (da.state_dir / "drain").exists() and (db.state_dir / "drain").exists(), "a drain was undone"
    # pmcheck's word: every agent check of 127.0.0.1 was told OK (kept in), none DRAINED
    told = [(p["proof"], p["agent"]["told"]) for p in status(da)["pollers"] if p.get("agent")]
    assert told and all(t == "OK" for _, t in told), told
    held = [s for _, s in states(da) if s["seen"]["backend"] == bk]
    assert held and held[0].get("held") in ("last_server", "empty_backend"), held
    if other:
        out = [s for _, s in states(da) if s["seen"]["backend"] == other]
        assert out and out[0]["told"] == "DRAINED" and out[0].get("held") is None, out
    record(
        f"agent-send {agent_send}: A drained and held in bk",
        f"{rounds} samples over {SAMPLE_FOR:.0f}s, 0 empty; agent {agent_lines[-1]!r}"
        + (f"; A out of {other} throughout" if other else ""),
    )
    for d in (db, da):
        cp = pmcheck.run("undrain", "--state-dir", str(d.state_dir), "--url", d.url)
        assert cp.returncode == 0, cp.stderr
