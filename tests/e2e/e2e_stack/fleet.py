"""Two compile masters behind one HAProxy, each with its `pmcheck serve`: the stack of the fleet
tests (test_rolling_restart.py, test_fleet_moments.py) and of scripts/soak, started once and
changed only where a test asks (``Fleet.ensure``), and the watchers that record what happens to it.

A on 127.0.0.2:8140 holds a throwaway CA made by `puppetserver ca setup`; B on 127.0.0.3:8140 runs
with the CA service disabled and a certificate signed by A's CA. Both certificates carry the load
balancer's name, `localhost` (127.0.0.1 in /etc/hosts). They share one code dir (in the temp dir:
the host's /etc/puppet/code is left alone), and their auth.conf lets the suite's admin certificate
(ADMIN_CERTNAME, from A's CA) flush their JRuby pools. Each has its own `pmcheck serve` (HTTP
check and agent check, `--drained-status 404` as packaged) on its own address. One HAProxy
frontend on 127.0.0.1:8140 runs the shipped backend (packaging/haproxy/pmcheck.cfg), its two
server lines pointing at the two masters and their pmchecks; or, without pmcheck (scripts/soak
--baseline), the same backend with a plain TCP check of port 8140, as a site without a health
responder has. Agents (their certificates from A's CA) reach the masters through that frontend.
Every process is stopped by its PID (``Fleet.stop``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .agents import AgentLoop, AgentRunRecord, slow_environment
from .haproxy import HAProxy, is_up_checked, render_haproxy
from .pki import Identity
from .pmcheck import Pmcheck, PmcheckServe
from .proc import Sampler, StackError, clean_env, free_port, port_accepts, stop_pid, stop_strays, wait_until
from .puppetserver import LB_NAME, PUPPET_PORT, PuppetServer, Tuning

A_HOST, B_HOST = "127.0.0.2", "127.0.0.3"
ADMIN_CERTNAME = "admin.pmcheck.test"
AGENTS = 3
# a catalog that takes seconds to compile: generate('/bin/sleep', N) holds a JRuby on the master
COMPILE_SECONDS = 3
USER_AGENT = "pmcheck/e2e"  # pmcheck does not count its own User-Agent as a load balancer polling

# `pmcheck cycle` prints one line per step; HAProxy's tcplog: frontend backend/server Tw/Tc/Tt ...
STEP_LINE = re.compile(r"^pmcheck cycle: step (\S+) took ([0-9.]+)s: (.*)$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TCPLOG = re.compile(r" (\S+)/(\S+) (-?\d+)/(-?\d+)/(\+?-?\d+) (\+?\d+) (\S\S) ")


# Puppet Server's log: a line's time, and the line that ends a flush of a (non-multithreaded) pool
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z) ")
REFILLED = "Finished draining and refilling pool."


@dataclass
class Flush:
    """One admin-API flush of a master's pool."""

    master: str
    t: float  # time.monotonic() when the DELETE was sent
    wall: float  # time.time() then
    status: int
    log_offset: int  # the master's log size before it


def serving(s: dict[str, str]) -> bool:
    """HAProxy sends new connections to the server: UP, or UP while going down (``UP 1/3``);
    NOLB, DRAIN, MAINT and DOWN (also ``DOWN 1/3`` on its way up) take none."""
    return s.get("status", "").startswith("UP")


# --------------------------------------------------------------------------
# the stack


class Fleet:
    """The two-master stack (see the module's doc). Nothing runs until ``ensure``."""

    def __init__(
        self,
        workdir: Path,
        pmcheck_bin: str | None,
        shipped_haproxy: str,
        *,
        with_pmcheck: bool = True,
        agents: int = AGENTS,
        note: Callable[[str, str], None] = lambda name, value: print(f"[fleet] {name}: {value}"),
        echo: Callable[[str], None] = print,
    ):
        self.dir, self.shipped, self.note, self.echo = workdir, shipped_haproxy, note, echo
        workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(workdir, 0o755)
        self.code = workdir / "code"
        self.a = PuppetServer.master(
            workdir / "master-a", "a", A_HOST, "compile-a.pmcheck.test", ca=True, codedir=self.code
        )
        self.b = PuppetServer.master(
            workdir / "master-b", "b", B_HOST, "compile-b.pmcheck.test", ca=False, codedir=self.code
        )
        self.masters = {"a": self.a, "b": self.b}
        self.default_tuning = {name: m.tuning for name, m in self.masters.items()}
        self.admin = Identity(ADMIN_CERTNAME, workdir / "admin" / "ssl")
        self.agents = [
            Identity(f"agent{i}.pmcheck.test", workdir / f"agent{i}" / "ssl") for i in range(1, agents + 1)
        ]
        self.with_pmcheck = with_pmcheck
        if with_pmcheck and not pmcheck_bin:
            raise StackError("a fleet with pmcheck needs the pmcheck binary")
        self.pm = Pmcheck(pmcheck_bin or "", workdir, echo)
        self.serves: dict[str, PmcheckServe] = {}
        self.agent_ports: dict[str, int] = {}
        self.serve_flags: tuple[str, ...] = ()
        self.h: HAProxy | None = None
        self.backend = ""
        self.srv: dict[str, str] = {}  # master name: its HAProxy server name
        self.prepared = False
        self._confd_flag: bool | None = None

    # -- one-off preparation: certificates and auth.conf

    def prepare(self) -> None:
        if self.prepared:
            return
        t0 = time.monotonic()
        self.a.setup_ca()
        self.b.issue_own_cert(self.a)
        for ident in [*self.agents, self.admin]:
            self.a.issue(ident)
        for m in self.masters.values():
            m.allow_admin_api([ADMIN_CERTNAME])
        self.prepared = True
        self.note(
            f"fleet: CA, 2 master, {len(self.agents)} agent and 1 admin certificates",
            f"{time.monotonic() - t0:.1f}s",
        )

    # -- pmcheck

    def serve_args(self, name: str) -> list[str]:
        """`pmcheck serve`'s flags for master ``name`` (its own identity, address and conf.d),
        without --listen and --state-dir, and with the flags a test asked for last."""
        m = self.masters[name]
        return [
            "--agent-listen", f"{m.host}:{self.agent_ports[name]}",
            "--drained-status", "404",
            "--certname", m.ident.certname,
            "--hostcert", str(m.ident.hostcert),
            "--hostprivkey", str(m.ident.hostprivkey),
            "--localcacert", str(m.ident.localcacert),
            "--puppet-addr", m.addr,
            *(["--puppetserver-confd", str(m.confd)] if self._knows_confd() else []),
            *self.serve_flags,
        ]  # fmt: skip

    def _knows_confd(self) -> bool:
        """This pmcheck reads the master's own conf.d (--puppetserver-confd: where it listens,
        whether its JRuby is multithreaded); an older one reads the host's, which does not
        matter to a master that is not multithreaded."""
        if self._confd_flag is None:
            help_text = subprocess.run(
                [self.pm.binary, "serve", "--help"],
                capture_output=True,
                text=True,
                timeout=30,
                env=clean_env(),
            ).stdout
            self._confd_flag = "--puppetserver-confd" in help_text
        return self._confd_flag

    def state_dir(self, name: str) -> Path:
        return self.dir / f"state-{name}"

    def _pmchecks(self, flags: Sequence[str]) -> None:
        """Every pmcheck running, with ``flags``: started, or restarted where its flags differ or
        it died (same ports: HAProxy's config names them)."""
        self.serve_flags = tuple(flags)
        for name, m in self.masters.items():
            if name not in self.agent_ports:
                self.agent_ports[name] = free_port(m.host)
            serve = self.serves.get(name)
            if serve is None:
                self.serves[name] = self.pm.serve(
                    self.state_dir(name), *self.serve_args(name), name=name, host=m.host
                )
            elif not serve.running() or serve.extra != self.serve_args(name):
                serve.restart(self.serve_args(name))
                self.note(
                    f"fleet: pmcheck of {name} restarted", " ".join(self.serve_flags) or "(default flags)"
                )
            drain = self.state_dir(name) / "drain"
            if drain.exists():  # left by a test that failed half-way
                cp = self.pm.run("undrain", "--force", "--state-dir", str(self.state_dir(name)))
                if cp.returncode != 0:
                    raise StackError(f"could not undrain {name}: {cp.stdout}{cp.stderr}")

    # -- HAProxy

    def haproxy_running(self) -> bool:
        return self.h is not None and self.h.proc is not None and self.h.proc.poll() is None

    def _haproxy(self) -> None:
        if self.haproxy_running():
            return
        if self.with_pmcheck:
            targets = [(m.addr, self.serves[n].port, self.agent_ports[n]) for n, m in self.masters.items()]
        else:
            targets = [(m.addr, 1, 1) for m in self.masters.values()]  # the check lines go away
        cfg, self.backend, servers = render_haproxy(self.shipped, PUPPET_PORT, 0, targets=targets)
        if self.with_pmcheck:
            assert "balance leastconn" in cfg and "mode tcp" in cfg and "disable-on-404" in cfg, cfg
            source = "packaging/haproxy/pmcheck.cfg (two masters on 127.0.0.2, 127.0.0.3)"
        else:
            cfg = plain_tcp_check(cfg)
            source = "packaging/haproxy/pmcheck.cfg without pmcheck: a plain TCP check of port 8140"
        self.srv = dict(zip(self.masters, servers, strict=True))
        if port_accepts(PUPPET_PORT):
            raise StackError(f"something already listens on 127.0.0.1:{PUPPET_PORT}: the load balancer's")
        self.h = HAProxy(self.dir, "lb", cfg, source)
        self.h.start()

    def up(self, name: str) -> bool:
        """HAProxy has master ``name`` UP, its last checks passed."""
        assert self.h is not None
        s = self.h.server(self.backend, self.srv[name])
        if self.with_pmcheck:
            return is_up_checked(s) and s["agent_status"].lstrip("* ") == "L7OK"
        return s["status"] == "UP" and s["check_status"].lstrip("* ") == "L4OK"

    def wait_serving(self, names: Iterable[str] | None = None, timeout: float = 120) -> float:
        """Until HAProxy has every master named (default: every running one) UP; the seconds."""
        names = list(names) if names is not None else [n for n, m in self.masters.items() if m.running()]
        assert self.h is not None
        _, took = wait_until(
            f"HAProxy to have {', '.join(names)} UP", lambda: all(self.up(n) for n in names), timeout,
            interval=0.2, alive=self.h.check_alive,
        )  # fmt: skip
        return took

    # -- the masters

    def start_masters(self, names: Iterable[str]) -> float:
        """Start these masters at once; the seconds until all were ready."""
        ms = [self.masters[n] for n in names]
        if not ms:
            return 0.0
        t0 = time.monotonic()
        with ThreadPoolExecutor(len(ms)) as pool:
            futures = [pool.submit(m.start) for m in ms]
            errors = [f.exception() for f in futures]
        errors = [e for e in errors if e is not None]
        if errors:
            raise StackError(f"starting {', '.join(m.name for m in ms)}: {errors}")
        return time.monotonic() - t0

    def ensure(
        self,
        tunings: dict[str, Tuning] | None = None,
        down: Iterable[str] = (),
        serve_flags: Sequence[str] = (),
    ) -> str:
        """The stack as a test needs it, changing only what differs: every master running with
        its tuning (default: as first made) except those ``down`` (stopped); each pmcheck
        with ``serve_flags``; HAProxy; HAProxy with every running master UP. What it did."""
        self.prepare()
        down = set(down)
        did = []
        to_start = []
        for name, m in self.masters.items():
            want = (tunings or {}).get(name, self.default_tuning[name])
            if m.running() and (name in down or m.tuning != want):
                took = m.stop()
                did.append(f"stopped {name} ({took:.1f}s)")
            if name in down:
                continue
            if m.tuning != want:
                m.retune(want)
                did.append(f"retuned {name} ({' '.join(f'{k}={v}' for k, v in want.jruby.items())})")
            if not m.running():
                to_start.append(name)
        if self.with_pmcheck:
            self._pmchecks(serve_flags)
        self._haproxy()
        if to_start:
            took = self.start_masters(to_start)
            did.append(f"started {' and '.join(to_start)} at once ({took:.1f}s until ready)")
        took = self.wait_serving([n for n in self.masters if n not in down], 120)
        did.append(f"HAProxy had them UP {took:.1f}s later")
        summary = "; ".join(did)
        self.note("fleet: ready", summary)
        return summary

    def stop(self) -> None:
        """Every process of the stack, by its PID (also a JVM that a cut-off restart left without
        its pidfile)."""
        errors = []
        if self.h is not None:
            self.h.stop()
        self.pm.stop_all()
        for m in self.masters.values():
            try:
                m.stop()
            except Exception as e:  # noqa: BLE001 - stop the others, then report
                errors.append(f"{m.name}: {e!r}")
            strays = stop_strays(str(m.confd))
            if strays:
                errors.append(f"{m.name}: killed JVM(s) {strays} that had no pidfile")
        if errors:
            raise StackError("stopping the fleet: " + "; ".join(errors))

    # -- moments

    def flush_at_once(self, names: Iterable[str] = ("a", "b")) -> dict[str, Flush]:
        """Flush these masters' JRuby pools through the admin API at the same moment (a thread
        each, released together): for each, when its DELETE was sent and what it answered."""
        names = list(names)
        barrier = threading.Barrier(len(names))
        out: dict[str, Flush] = {}

        def flush(name: str) -> None:
            m = self.masters[name]
            offset = m.log.stat().st_size
            barrier.wait(timeout=10)
            t, wall = time.monotonic(), time.time()
            out[name] = Flush(name, t, wall, m.flush_pool(self.admin).status, offset)

        with ThreadPoolExecutor(len(names)) as pool:
            for f in [pool.submit(flush, n) for n in names]:
                f.result()
        return out

    def refilled(self, flush: Flush) -> float | None:
        """Seconds from the DELETE until the master logged its pool refilled ("Finished draining
        and refilling pool."), None until it has. Its log, not its status API: that may not answer
        while the new instance is made, and a quick refill falls between two polls."""
        with open(self.masters[flush.master].log, "rb") as log:
            log.seek(flush.log_offset)
            text = log.read().decode("utf-8", "replace")
        for line in text.splitlines():
            m = LOG_TIME.match(line)
            if m and REFILLED in line:
                return datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() - flush.wall
        return None

    def reload(self, name: str) -> None:
        """`kill -HUP` of the master's JVM, as `systemctl reload puppetserver` does."""
        pid = self.masters[name].pid()
        if pid is None:
            raise StackError(f"master {name} is not running")
        os.kill(pid, signal.SIGHUP)

    # -- agents

    def slow_environment(self, name: str, seconds: int = COMPILE_SECONDS):
        return slow_environment(name, seconds, self.code / "environments")

    def agent_loop_args(self, workdir: Path, environment: str) -> list[tuple]:
        """AgentLoop's arguments for each agent, through the load balancer, runs under ``workdir``."""
        return [
            (ident, workdir / f"agent{i}", LB_NAME, PUPPET_PORT, environment)
            for i, ident in enumerate(self.agents, 1)
        ]

    def served_catalogs(self) -> dict[str, int]:
        return {n: m.access_log.read_text().count("/puppet/v3/catalog/") for n, m in self.masters.items()}

    def logs(self) -> list[tuple[str, Path]]:
        """Every log of the stack, by name (those of processes not started yet too)."""
        out = [(f"Puppet Server {n}", m.log) for n, m in self.masters.items()]
        if self.with_pmcheck:
            out += [(f"pmcheck serve {n}", self.dir / f"pmcheck-{n}.log") for n in self.masters]
        return [
            *out,
            ("haproxy lb", self.dir / "haproxy-lb.log"),
            ("haproxy lb config", self.dir / "haproxy-lb.cfg"),
        ]


def plain_tcp_check(cfg: str) -> str:
    """The rendered shipped backend without pmcheck: no HTTP check, no agent check; each server
    checked by a TCP connect to its 8140 (`check`), with the shipped inter, rise, fall and weight."""
    out = []
    for line in cfg.splitlines():
        if re.match(r"\s*(option\s+httpchk|http-check)\b", line):
            continue
        if re.match(r"\s*server\s", line):
            line = re.sub(r"\s(port|agent-port|agent-inter)\s+\S+", "", line)
            line = re.sub(r"\sagent-check\b", "", line)
        out.append(line)
    left = [line for line in out if re.search(r"^\s*[^#\s].*\b(agent-\w+|httpchk|http-check)\b", line)]
    if left:
        raise StackError(f"pmcheck's checks left in the plain TCP backend: {left}")
    return "\n".join(out) + "\n"


def start_agent_loops(args: list[tuple]) -> list[AgentLoop]:
    """Started AgentLoops (scripts/soak; the tests use their fixture, which stops them)."""
    loops = [AgentLoop(*a) for a in args]
    for loop in loops:
        loop.start()
    return loops


# --------------------------------------------------------------------------
# watchers

HA_KEYS = (
    "status", "weight", "scur", "srv_op_state", "srv_admin_state", "check_status", "check_code", "last_chk",
    "agent_status", "last_agt",
)  # fmt: skip


@dataclass
class Worst:
    """HAProxy's worst moments between two times."""

    samples: int
    fewest: int  # fewest servers UP in one sample
    fewest_at: float  # when (time.monotonic())
    zero: int  # samples with no server UP
    longest_zero: float  # the longest stretch with none UP, in seconds
    zero_total: float  # all stretches with none UP, in seconds

    def __str__(self) -> str:
        return (
            f"fewest servers UP {self.fewest} ({self.samples} samples every 0.2 s); "
            f"{self.zero} samples with none UP, longest stretch {self.longest_zero:.1f}s, "
            f"{self.zero_total:.1f}s in all"
        )


class HAProxyWatch(Sampler):
    """Samples HAProxy's view of every server (status, weight, sessions, checks) every 0.2 s."""

    every = 0.2

    def __init__(self, h: HAProxy, backend: str):
        super().__init__("haproxy watch")
        self.h, self.backend = h, backend
        self.rows: list[tuple[float, dict[str, dict[str, str]]]] = []

    def sample(self) -> None:
        try:
            servers = {s["svname"]: {k: s.get(k, "") for k in HA_KEYS} for s in self.h.servers(self.backend)}
            self.rows.append((time.monotonic(), servers))
        except (OSError, StackError):
            pass

    def between(self, t0: float, t1: float) -> list[tuple[float, dict[str, dict[str, str]]]]:
        return [r for r in self.rows if t0 <= r[0] <= t1]

    def changes(self, server: str, t0: float, t1: float) -> str:
        """The server's status and weight as they changed between t0 and t1, for people."""
        out, last = [], None
        for t, servers in self.between(t0, t1):
            s = servers.get(server)
            if s is None:
                continue
            now = (s["status"], s["weight"])
            if now != last:
                out.append(f"+{t - t0:.1f}s {s['status']} w{s['weight']}")
                last = now
        return ", ".join(out)

    def worst(self, t0: float, t1: float) -> Worst:
        rows = self.between(t0, t1)
        if not rows:
            return Worst(0, -1, t0, 0, 0.0, 0.0)
        counts = [(t, sum(serving(s) for s in servers.values())) for t, servers in rows]
        fewest_at, fewest = min(counts, key=lambda c: c[1])
        zero = sum(1 for _, n in counts if n == 0)
        longest = total = 0.0
        began = None
        for t, n in counts:
            if n == 0 and began is None:
                began = t
            elif n > 0 and began is not None:
                longest, total, began = max(longest, t - began), total + t - began, None
        if began is not None:  # none UP still at the last sample
            stretch = counts[-1][0] - began + self.every
            longest, total = max(longest, stretch), total + stretch
        return Worst(len(rows), fewest, fewest_at, zero, longest, total)

    def time_in(self, server: str, t0: float, t1: float) -> dict[str, float]:
        """Seconds between t0 and t1 that HAProxy showed the server in each status."""
        rows = self.between(t0, t1)
        out: dict[str, float] = {}
        for (t, servers), (t_next, _) in zip(rows, rows[1:], strict=False):
            if server in servers:
                status = servers[server]["status"]
                out[status] = out.get(status, 0.0) + t_next - t
        return out

    def out_of_service(self, server: str, t0: float, t1: float) -> float:
        """Seconds between t0 and t1 during which HAProxy sent the server nothing new."""
        rows = self.between(t0, t1)
        out = 0.0
        for (t, servers), (t_next, _) in zip(rows, rows[1:], strict=False):
            if server in servers and not serving(servers[server]):
                out += t_next - t
        return out


@dataclass
class Said:
    """One answer of a pmcheck (its JSON), as sampled."""

    t: float
    verdict: str
    load: str | None
    weight: int | None
    reason: str
    pool: dict | None

    @property
    def paused(self) -> bool:
        return self.load == "paused" or self.reason.startswith("paused: ")


class NodeWatch(Sampler):
    """Every 0.2 s: what each pmcheck answers (its JSON; and its plain-text answer at the first
    pause seen)."""

    every = 0.2

    def __init__(self, fleet: Fleet, names: Iterable[str] = ("a", "b")):
        super().__init__("node watch")
        self.fleet, self.names = fleet, list(names)
        self.said: dict[str, list[Said]] = {n: [] for n in self.names}
        # the plain-text answer (what HAProxy's HTTP check reads) at the first pause seen
        self.paused_body: dict[str, str] = {}

    def sample(self) -> None:
        for name in self.names:
            serve = self.fleet.serves.get(name)
            if serve is not None:
                try:
                    a = serve.get(headers={"User-Agent": USER_AGENT, "Accept": "application/json"}).json()
                    said = Said(
                        time.monotonic(), a["verdict"], a.get("load"), a.get("weight"), a.get("reason", ""),
                        a.get("pool"),
                    )  # fmt: skip
                    self.said[name].append(said)
                    if said.paused and name not in self.paused_body:
                        r = serve.get(headers={"User-Agent": USER_AGENT})
                        self.paused_body[name] = f"{r.status} {r.body.strip()}"
                except (OSError, ValueError, KeyError):
                    pass

    def answers(self, name: str, t0: float, t1: float) -> list[Said]:
        return [s for s in self.said[name] if t0 <= s.t <= t1]

    def changes(self, name: str, t0: float, t1: float, width: int = 90) -> str:
        """What the pmcheck of ``name`` answered between t0 and t1, each change once, for people."""
        out, last = [], None
        for s in self.answers(name, t0, t1):
            words = re.sub(r"\d+(\.\d+)? ?(s|ms)\b", "#s", s.reason)  # a changing age is no change
            now = (s.verdict, s.load, s.weight, words)
            if now != last:
                out.append(f"+{s.t - t0:.1f}s {s.verdict}/{s.load} w{s.weight} {s.reason[:width]!r}")
                last = now
        return "; ".join(out)

    def episodes(
        self, name: str, t0: float, t1: float, what: Callable[[Said], bool]
    ) -> list[tuple[float, float]]:
        """The stretches (first, last sample) in which the answers of ``name`` were ``what``."""
        out: list[tuple[float, float]] = []
        began = last = None
        for s in self.answers(name, t0, t1):
            if what(s):
                began = s.t if began is None else began
                last = s.t
            elif began is not None:
                out.append((began, last))
                began = None
        if began is not None:
            out.append((began, last))
        return out


# --------------------------------------------------------------------------
# `pmcheck cycle` and what a test or the soak reads from the stack


@dataclass
class Cycle:
    master: str
    code: int
    start: float
    end: float
    steps: dict[str, tuple[float, float, str]] = field(default_factory=dict)  # name: (t_end, took, detail)
    stdout: list[str] = field(default_factory=list)
    stderr: str = ""

    def window(self, name: str) -> tuple[float, float]:
        t_end, took, _ = self.steps[name]
        return t_end - took, t_end


def lb_views(answer: dict, proven_within_ms: int | None = None) -> list[dict]:
    """The load balancers' latest words in pmcheck's JSON answer (each poller's states' `seen`);
    with ``proven_within_ms``, only from pollers that prove themselves (key or address) and
    polled within that, as the shipped playbook reads them."""
    return [
        s["seen"]
        for p in answer.get("pollers") or []
        if proven_within_ms is None
        or (
            p.get("proof") in ("key", "address") and p.get("last_ms_ago", proven_within_ms) < proven_within_ms
        )
        for s in p.get("states") or []
        if s.get("seen")
    ]


def others_take_agents(serve: PmcheckServe) -> bool:
    """The load balancer's latest word to ``serve`` counts another server in the backend: a
    cycle's last-server guard lets it drain (a master whose pool is refilling is briefly out)."""
    seen = lb_views(serve.get("/status", headers={"User-Agent": USER_AGENT}).json())
    return bool(seen) and all(s["total_weight"] > s["weight"] for s in seen)


def run_cycle(
    pmcheck_bin: str,
    master: PuppetServer,
    serve: PmcheckServe,
    log,
    command: list[str] | None = None,
    reason: str = "e2e rolling restart",
) -> Cycle:
    """`pmcheck cycle ... -- puppetserver_ctl.py restart MASTER` (or ``command``), its stdout read
    line by line as it comes (each step's end is when its line arrived)."""
    cmd = [
        pmcheck_bin, "cycle", "--url", serve.url, "--state-dir", str(serve.state_dir),
        "--reason", reason, "--max-wait", "5m", "--", *(command or master.ctl_argv("restart")),
    ]  # fmt: skip
    print(f"[e2e] $ {' '.join(cmd)}")
    lines: list[tuple[float, str]] = []
    start = time.monotonic()
    with open(log, "w+") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True,
            env=clean_env(), start_new_session=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append((time.monotonic(), line.rstrip("\n")))
                print(f"[e2e]   {line.rstrip()}")
            code = proc.wait(timeout=30)
        finally:
            stop_pid(proc, "pmcheck cycle", term_timeout=30)
        err.seek(0)
        stderr = err.read()
    c = Cycle(master.name, code, start, time.monotonic(), stdout=[line for _, line in lines], stderr=stderr)
    for t, line in lines:
        m = STEP_LINE.match(line)
        if m:
            c.steps[m[1]] = (t, float(m[2]), m[3])
    return c


def compile_in_flight(master: PuppetServer, within: float = 1.0) -> bool:
    """A catalog compile is under way on the master: one of its JRubies is borrowed for a catalog
    request, and the compile's `generate('/bin/sleep', ...)` began less than ``within`` seconds
    ago (a child of the master's JVM), so that it has seconds left."""
    jvm = master.pid()
    if jvm is None or not any(age < within for age in sleeping_children(jvm)):
        return False
    pool = master.pool()
    return bool(pool) and any("/puppet/v3/catalog/" in json.dumps(b) for b in pool["borrowed-instances"])


def sleeping_children(ppid: int) -> list[float]:
    """The age in seconds of each `/bin/sleep` whose parent is ``ppid``."""
    ticks = os.sysconf("SC_CLK_TCK")
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    ages = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) != ppid:
                continue
            if Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")[0] != b"/bin/sleep":
                continue
        except (OSError, IndexError, ValueError):
            continue
        ages.append(uptime - int(stat[19]) / ticks)
    return ages


def rss_mib(pid: int | None) -> str:
    if pid is None:
        return "?"
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return f"{int(line.split()[1]) // 1024} MiB"
    return "?"


def errors_of(run: AgentRunRecord) -> str:
    """The run's errors on one line (Facter's complaints about /proc/1/environ, which every run
    here has, left out)."""
    lines = [ANSI.sub("", line) for line in run.log.read_text(errors="replace").splitlines()]
    errs = [line for line in lines if line.startswith("Error:") and "Facter:" not in line]
    return " | ".join(errs[-4:] or lines[-4:])


@dataclass(frozen=True)
class Session:
    """One agent session in HAProxy's tcplog, in wall-clock times."""

    server: str
    accepted: float
    ended: float
    termination: str  # `--` is a normal end


def sessions(log: Path) -> list[Session]:
    """The sessions HAProxy's tcplog ``log`` has logged (a line each, as they end)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = TCPLOG.search(line)
        accepted = re.search(r"\[(\d+/\w+/\d+:\d+:\d+:\d+\.\d+)\]", line)
        if not m or not accepted:
            continue
        start = datetime.strptime(accepted[1], "%d/%b/%Y:%H:%M:%S.%f").timestamp()
        out.append(Session(m[2], start, start + int(m[5].lstrip("+")) / 1000, m[7]))
    return out


def sessions_ended(log: Path, server: str, t0: float, t1: float) -> dict[str, int]:
    """How the sessions on ``server`` that ended between wall-clock times t0 and t1 ended
    (termination state: count)."""
    ended: dict[str, int] = {}
    for s in sessions(log):
        if s.server == server and t0 <= s.ended <= t1 + 1:
            ended[s.termination] = ended.get(s.termination, 0) + 1
    return ended


def run_times(runs: list[AgentRunRecord]) -> str:
    """Median and longest duration of these runs, for people."""
    if not runs:
        return "no runs"
    took = sorted(r.end - r.start for r in runs)
    return f"median {took[len(took) // 2]:.1f}s, longest {took[-1]:.1f}s"
