"""Fixtures for pmcheck's real-stack end-to-end suite.

One real Puppet Server for the whole session (it takes tens of seconds to start),
and per test: pmcheck daemons, HAProxy and xinetd instances, each in the session's
temp dir and each stopped by its PID when the test ends, pass or fail.

The fleet tests (marked ``fleet(N)``: test_fleet_moments.py, test_rolling_restart.py) share one
two-master stack for the whole session (``fleet``: two JVMs, their pmchecks, one HAProxy on
127.0.0.1:8140), started by the first of them and stopped by PID at the session's end. They run
after every other test (the session's Puppet Server, also on 127.0.0.1:8140, is then stopped
once), in the order of their N; each says what it needs with ``fleet.ensure(...)``, which
changes only what differs (restarts a master another test left stopped, retunes one, restarts
the pmchecks with other flags).

A component that cannot run here (not root, program missing, port 8140 taken by
someone else) skips the test with a loud reason -- except under CI=true, where it
fails: CI must never turn green by skipping the real stack.

The suite runs on two stacks: this machine's (Debian 12: Puppet Server 7.9, HAProxy 2.6) and,
with `scripts/e2e --trixie`, a Debian 13 root (Puppet Server 8.7, puppet-agent 8.10, HAProxy
3.0). Every test passes on both. Each says with ``ci_on(...)`` (``"debian12"``, ``"debian13"``)
on which CI runs it (docs/testing.md says which and why); ``ci_on()`` with none: CI leaves it out
to stay within its time, and it runs by hand (`--all`, or pytest args). `--ci-selection` (what
scripts/e2e passes when given no test arguments) runs those of this stack; without it, every
collected test runs.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import e2e_stack as st  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STRICT = os.environ.get("CI") == "true"
TIMINGS: list[tuple[str, str]] = []
# the session's Puppet Server once started, so that a test needing 127.0.0.1:8140 can stop it
SESSION_SERVERS: list[st.PuppetServer] = []
# the fleet tests' stack once made: a test needing the session's Puppet Server stops it
FLEETS: list[st.Fleet] = []


def record(name: str, value: str) -> None:
    """A measurement worth reporting; printed now and in the final summary."""
    TIMINGS.append((name, value))
    print(f"[e2e] MEASURED {name}: {value}")


def unavailable(reason: str):
    """Skip loudly, or fail under CI=true."""
    banner = "!" * 8
    if STRICT:
        pytest.fail(f"{banner} CI=true and the real stack cannot run: {reason}", pytrace=False)
    pytest.skip(f"{banner} REAL STACK NOT TESTED: {reason}")


# ---------------------------------------------------------------------------
# stopping cleanly


def _interrupt(signum, _frame):
    # SIGTERM/SIGHUP (a CI timeout, a closed terminal) would kill pytest without running the
    # fixtures' finalizers and leave Puppet Server, HAProxy... running: turn them into the
    # KeyboardInterrupt pytest already handles by tearing everything down.
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    config.addinivalue_line(
        "markers",
        "fleet(order): runs on the session's two-master stack, after every other test, by order",
    )
    config.addinivalue_line(
        "markers",
        "ci_on(*stacks): the stacks CI runs it on: debian12 (this machine), debian13 (scripts/e2e --trixie);"
        " none: by hand only",
    )
    config.addinivalue_line(
        "markers",
        "every_haproxy(*releases): once per HAProxy of the stack: its own, and the newer ones beside it"
        " (those named, if any)",
    )


# HAProxy releases newer than the stack's own, beside it (scripts/trixie-root unpacks Debian's
# sid and experimental ones into the Debian 13 root): /usr/local/sbin/haproxy-MAJOR.MINOR.
NEWER_HAPROXY = "/usr/local/sbin/haproxy-[0-9]*"


def haproxy_binaries(only: tuple[str, ...] = ()) -> dict[str, str]:
    """The HAProxy binaries a test marked ``every_haproxy`` runs against, by release: the
    stack's own ``haproxy`` and each newer one beside it (only those ``only`` names, if any)."""
    found = {"{}.{}".format(*st.release_of("haproxy")): "haproxy"}
    for path in sorted(glob.glob(NEWER_HAPROXY)):
        release = Path(path).name.removeprefix("haproxy-")
        if not only or release in only:
            found[release] = path
    return found


def pytest_generate_tests(metafunc):
    """``every_haproxy(*releases)``: the test runs once per HAProxy binary of the stack (its own,
    and the newer ones beside it, or those of them it names)."""
    mark = metafunc.definition.get_closest_marker("every_haproxy")
    if mark is None:
        return
    binaries = haproxy_binaries(mark.args)
    if STRICT and st.stack().debian == "13":
        # CI's Debian 13 root has them all: a release missing would drop its tests silently.
        newer = [r for r, path in binaries.items() if path != "haproxy"]
        missing = [r for r in mark.args if r not in binaries]
        if missing or (not mark.args and len(newer) < 2):
            raise pytest.UsageError(
                f"CI=true: {metafunc.definition.name} wants HAProxy {', '.join(mark.args) or 'every release'}"
                f" beside Debian 13's, found {sorted(binaries)} ({NEWER_HAPROXY}); scripts/trixie-root makes them"
            )
    metafunc.parametrize("haproxy_bin", list(binaries.values()), ids=[f"haproxy{r}" for r in binaries])


def pytest_addoption(parser):
    parser.addoption(
        "--ci-selection",
        action="store_true",
        help="run only the tests whose ci_on(...) names this stack (debian12, debian13)",
    )


def pytest_collection_modifyitems(session, config, items):
    """Every test names the stacks CI runs it on; with --ci-selection, those of other stacks are
    deselected. The fleet tests last (their stack holds 127.0.0.1:8140, where the session's
    Puppet Server listens), in the order their marks give; the others keep theirs."""
    unmarked = [item.nodeid for item in items if item.get_closest_marker("ci_on") is None]
    if unmarked:
        raise pytest.UsageError(f"e2e tests without ci_on(...) (the stacks CI runs them on): {unmarked}")
    if config.getoption("--ci-selection"):
        here = f"debian{st.stack().debian}"
        chosen = [item for item in items if here in item.get_closest_marker("ci_on").args]
        others = [item for item in items if item not in chosen]
        if others:
            config.hook.pytest_deselected(items=others)
        items[:] = chosen

    def key(item):
        mark = item.get_closest_marker("fleet")
        return (1, mark.args[0]) if mark else (0, 0)

    items.sort(key=key)


# ---------------------------------------------------------------------------
# reporting


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for name, path in getattr(item, "e2e_logs", []):
            rep.sections.append((f"log tail: {name} ({path})", st.tail(path, 60)))
        item.session.e2e_failed = True


def pytest_report_header(config):
    return f"pmcheck e2e stack: {st.stack()}"


def pytest_terminal_summary(terminalreporter):
    if not TIMINGS:
        return
    terminalreporter.section(f"pmcheck e2e measurements on {st.stack()}")
    for name, value in TIMINGS:
        terminalreporter.write_line(f"{name}: {value}")


def add_log(request, name: str, path) -> None:
    node = request.node
    if not hasattr(node, "e2e_logs"):
        node.e2e_logs = []
    node.e2e_logs.append((name, str(path)))


# ---------------------------------------------------------------------------
# session fixtures


@pytest.fixture(scope="session")
def workdir(request):
    """One temp dir for the whole run, traversable by the puppet and pmcheck users."""
    d = Path(tempfile.mkdtemp(prefix="pmcheck-e2e-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    failed = getattr(request.session, "e2e_failed", False) or request.session.testsfailed
    if failed or os.environ.get("PMCHECK_E2E_KEEP"):
        print(f"\n[e2e] kept {d} for inspection")
    else:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def pmcheck_bin():
    path = os.environ.get("PMCHECK_BIN") or str(REPO / "target" / "release" / "pmcheck")
    path = str(Path(path).resolve())
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        unavailable(f"no pmcheck binary at {path} (build it with `cargo build --release` or set PMCHECK_BIN)")
    return path


def _require_root_and(*programs: str) -> None:
    if os.geteuid() != 0:
        unavailable("must run as root (Puppet Server runs as user puppet, pmcheck reads the host key)")
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        unavailable(f"missing programs: {', '.join(missing)} (scripts/e2e installs them with apt-get)")


@pytest.fixture(scope="session")
def puppet_cfg():
    _require_root_and("puppet")
    return st.puppet_settings()


@pytest.fixture(scope="session")
def puppetserver_session(workdir, puppet_cfg):
    _require_root_and("java", "setpriv")
    if not os.path.exists(st.PUPPETSERVER_JAR):
        unavailable(f"{st.PUPPETSERVER_JAR} missing: install the puppetserver package")
    if st.port_accepts(st.PUPPET_PORT):
        unavailable(
            f"something already listens on 127.0.0.1:{st.PUPPET_PORT}; the suite must own Puppet Server "
            "(tests stop and start it): stop the other instance"
        )
    ps = st.PuppetServer.system(workdir / "puppetserver", puppet_cfg)
    SESSION_SERVERS.append(ps)
    first_ever = not os.path.exists(puppet_cfg.hostcert)
    try:
        took = ps.start()
        record(
            "Puppet Server start (session)",
            f"{took:.1f}s{' (first start: created the CA and host certificate)' if first_ever else ''}"
            f" with JAVA_ARGS {' '.join(ps.java_args)}",
        )
        yield ps
    finally:
        ps.stop()


@pytest.fixture
def puppetserver(request, puppetserver_session):
    """The session's Puppet Server, running (a previous failed test may have left it stopped)."""
    ps = puppetserver_session
    add_log(request, "Puppet Server", ps.log)
    for f in FLEETS:  # only when tests run out of their order: the fleet's HAProxy holds :8140
        if f.haproxy_running():
            t0 = time.monotonic()
            f.stop()
            record(
                "fleet stopped (127.0.0.1:8140 is the session Puppet Server's)",
                f"{time.monotonic() - t0:.1f}s",
            )
    if not ps.running():
        took = ps.start()
        record("Puppet Server restart (recovering from an earlier test)", f"{took:.1f}s")
    return ps


# ---------------------------------------------------------------------------
# per-test components


@pytest.fixture
def testdir(request, workdir):
    d = workdir / request.node.name.replace("/", "_").replace("[", "-").replace("]", "")
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    return d


@pytest.fixture
def pmcheck(request, pmcheck_bin, testdir):
    pm = st.Pmcheck(pmcheck_bin, testdir)
    orig_serve = pm.serve

    def serve(*a, **kw):
        d = orig_serve(*a, **kw)
        add_log(request, "pmcheck serve", d.log)
        return d

    pm.serve = serve
    yield pm
    pm.stop_all()


@pytest.fixture
def haproxy_bin() -> str:
    """The HAProxy a test runs: the stack's own, unless ``every_haproxy`` parametrizes it."""
    return "haproxy"


@pytest.fixture
def haproxy(request, testdir, haproxy_bin):
    """Factory: haproxy(name, body, source) -> started HAProxy with an admin socket."""
    started: list[st.HAProxy] = []
    if shutil.which(haproxy_bin) is None:
        unavailable(f"{haproxy_bin} is not installed (scripts/e2e installs haproxy with apt-get)")

    def make(name: str, body: str, source: str) -> st.HAProxy:
        h = st.HAProxy(testdir, name, body, source, binary=haproxy_bin)
        add_log(request, f"haproxy {name}", h.log)
        add_log(request, f"haproxy {name} config", h.cfg)
        started.append(h)
        h.start()
        return h

    yield make
    for h in started:
        h.stop()


@pytest.fixture
def xinetd(request, testdir):
    started: list[st.Xinetd] = []
    if shutil.which("xinetd") is None:
        unavailable("xinetd is not installed (scripts/e2e installs it with apt-get)")

    def make(service_text: str) -> st.Xinetd:
        x = st.Xinetd(testdir, service_text)
        add_log(request, "xinetd", x.log)
        add_log(request, "xinetd services", testdir / "xinetd-services.log")
        started.append(x)
        x.start()
        return x

    yield make
    for x in started:
        x.stop()


@pytest.fixture
def prometheus(request, testdir):
    """Factory: prometheus(target) -> a started Prometheus scraping ``target`` with the shipped
    alert rules."""
    started: list[st.Prometheus] = []
    for program in ("prometheus", "promtool"):
        if shutil.which(program) is None:
            unavailable(f"{program} is not installed (scripts/e2e installs Debian's prometheus with apt-get)")

    def make(target: str | list[str]) -> st.Prometheus:
        p = st.Prometheus(testdir, target, REPO / "packaging" / "prometheus" / "pmcheck-alerts.yml")
        add_log(request, "prometheus", p.log)
        started.append(p)
        took = p.start()
        record("Prometheus start", f"{took:.1f}s")
        return p

    yield make
    for p in started:
        p.stop()


@pytest.fixture(scope="session")
def shipped_haproxy() -> str:
    return (REPO / "packaging" / "haproxy" / "pmcheck.cfg").read_text()


@pytest.fixture(scope="session")
def shipped_xinetd() -> str:
    return (REPO / "packaging" / "xinetd" / "pmcheck").read_text()


# ---------------------------------------------------------------------------
# several compile masters behind one load balancer (the fleet tests)


def _free_loopback_8140() -> str:
    """127.0.0.1:8140 free for a load balancer's frontend: the session's Puppet Server, which
    listens there, is stopped if this run started it (the `puppetserver` fixture starts it again
    for any test after). Anything else listening there skips the test (fails under CI=true)."""
    for ps in SESSION_SERVERS:
        if ps.running():
            t0 = time.monotonic()
            ps.stop()
            record("session Puppet Server stopped (127.0.0.1:8140 is the load balancer's)",
                   f"{time.monotonic() - t0:.1f}s")  # fmt: skip
    if st.port_accepts(st.PUPPET_PORT):
        unavailable(f"something else listens on 127.0.0.1:{st.PUPPET_PORT}: stop it")
    return f"{st.LOOPBACK}:{st.PUPPET_PORT}"


@pytest.fixture
def agent_loops():
    """Factory: agent_loops(ident, workdir, server, port, environment) -> a started AgentLoop.
    Any loop still running at the end is stopped, its run under way by PID."""
    if shutil.which("puppet") is None:
        unavailable("puppet (the agent) is not installed")
    loops: list[st.AgentLoop] = []

    def make(*a, **kw) -> st.AgentLoop:
        loop = st.AgentLoop(*a, **kw)
        loops.append(loop)
        loop.start()
        return loop

    yield make
    for loop in loops:
        loop.kill()


@pytest.fixture(scope="session")
def fleet_session(workdir, pmcheck_bin, shipped_haproxy):
    """The two-master stack, made (not started) once; stopped by PID at the session's end."""
    _require_root_and("java", "setpriv", "puppetserver", "openssl", "puppet", "haproxy")
    if not os.path.exists(st.PUPPETSERVER_JAR):
        unavailable(f"{st.PUPPETSERVER_JAR} missing: install the puppetserver package")
    f = st.Fleet(workdir / "fleet", pmcheck_bin, shipped_haproxy, note=record)
    FLEETS.append(f)
    try:
        yield f
    finally:
        f.stop()


@pytest.fixture
def fleet(request, fleet_session):
    """The session's two-master stack (e2e_stack/fleet.py), whatever state the last test left it
    in: a test says what it needs with ``fleet.ensure(...)`` (which starts the stack the first
    time). The addresses it needs must be free of anyone else's servers."""
    f = fleet_session
    if not f.haproxy_running():
        _free_loopback_8140()
    for m in f.masters.values():
        if not m.running() and st.port_accepts(st.PUPPET_PORT, m.host):
            unavailable(f"something else listens on {m.host}:{st.PUPPET_PORT}: stop it")
    for name, path in f.logs():
        add_log(request, name, path)
    return f
