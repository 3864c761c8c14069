"""Real-stack helpers for pmcheck's end-to-end suite (tests/e2e) and for scripts/demo.

Everything here drives real programs: Puppet Server (java, as user puppet),
HAProxy (foreground, with an admin socket), xinetd (foreground) and the pmcheck
binary.  All traffic stays on loopback.  Every process is started in its own
session so that it (and anything it forked) can be stopped by its PID / process
group id, never by name.
"""

from __future__ import annotations

import contextlib
import csv
import http.client
import io
import json
import os
import pwd
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = "127.0.0.1"
PUPPET_PORT = 8140

PUPPETSERVER_JAR = "/usr/share/puppetserver/puppetserver.jar"
PUPPETSERVER_CONFD = "/etc/puppet/puppetserver/conf.d"
PUPPETSERVER_SERVICES_D = "/etc/puppet/puppetserver/services.d"
JRUBY_LIB = "/usr/share/jruby/lib"
# two JRuby instances (MAX_ACTIVE_INSTANCES) at about 512 MB each, plus the rest of the server
DEFAULT_JAVA_ARGS = (
    "-Xms1g -Xmx1536m -XX:TieredStopAtLevel=1 "
    "-Djruby.logger.class=com.puppetlabs.jruby_utils.jruby.Slf4jLogger"
)
# A pool of two, so that warming (one of two created) and busy (none free, requests
# waiting) can be seen on a 2-core machine, where Puppet Server's default is cores - 1 = 1.
MAX_ACTIVE_INSTANCES = 2


class StackError(RuntimeError):
    """A component of the real stack misbehaved (did not start, died, ...)."""


class Sampler:
    """Calls ``sample()`` every ``every`` seconds on a thread of its own, from ``with`` to its end:
    a test's timeline of what it watches while it acts."""

    every = 0.25

    def __init__(self, name: str):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------
# small utilities


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` (127.0.0.1) that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_accepts(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def tail(path: Path | str, lines: int = 40) -> str:
    try:
        data = Path(path).read_text(errors="replace").splitlines()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(data[-lines:])


def wait_until(
    what: str,
    probe: Callable[[], object],
    timeout: float,
    interval: float = 0.05,
    alive: Callable[[], None] | None = None,
):
    """Poll ``probe`` until it returns a truthy value; return (value, elapsed).

    ``alive`` is called on every round and should raise when the component being
    waited on has died, so that a crash fails at once instead of at the deadline.
    """
    start = time.monotonic()
    deadline = start + timeout
    last = None
    while True:
        if alive is not None:
            alive()
        try:
            last = probe()
        except Exception as e:  # noqa: BLE001 - the probe reports what it saw
            last = e
        else:
            if last:
                return last, time.monotonic() - start
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def stop_pid(proc: subprocess.Popen, name: str, term_timeout: float = 60.0) -> None:
    """Stop a process we started: SIGTERM its process group, then SIGKILL.

    The process was started with ``start_new_session=True``, so its pgid is its
    pid: signalling ``-pid`` reaches the children it forked (and nothing else).
    """
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=term_timeout)
        except subprocess.TimeoutExpired:
            print(f"[e2e] {name} (pid {proc.pid}) ignored SIGTERM for {term_timeout}s: SIGKILL")
    # whatever is left in the group (children, or the leader after a timeout)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        raise StackError(f"{name} (pid {proc.pid}) survived SIGKILL") from None


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for child processes: ours without any PMCHECK_* variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PMCHECK_")}
    env.update(extra)
    return env


# --------------------------------------------------------------------------
# Debian packages


def missing_packages(names: Iterable[str]) -> list[str]:
    """The packages named that dpkg does not have installed."""
    missing = []
    for name in names:
        cp = subprocess.run(
            ["dpkg-query", "-W", "-f=${db:Status-Status}", name], capture_output=True, text=True
        )
        if cp.stdout.strip() != "installed":
            missing.append(name)
    return missing


def install_packages(names: Iterable[str], echo: Callable[[str], None] = print) -> None:
    """Install the packages named that are missing, with apt-get (needs root).

    ``apt-get update`` runs only when the install needs it: no package lists yet, or the
    first attempt failed (stale lists).  Waits for another apt/dpkg (unattended-upgrades,
    a parallel job) instead of failing at once.  Raises StackError when it cannot install.
    """
    missing = missing_packages(names)
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StackError(f"cannot install {' '.join(missing)}: needs root and apt-get")
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=300"]
    install = [*apt, "install", "-y", "--no-install-recommends", *missing]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    echo(f"+ apt-get install -y --no-install-recommends {' '.join(missing)}")
    if (
        any(Path("/var/lib/apt/lists").glob("*_Packages*"))
        and subprocess.run(install, env=env).returncode == 0
    ):
        return
    echo("+ apt-get update (the package lists are missing or stale)")
    if subprocess.run([*apt, "update"], env=env).returncode != 0:
        raise StackError("apt-get update failed")
    if subprocess.run(install, env=env).returncode != 0:
        raise StackError(f"apt-get could not install {' '.join(missing)}")


# --------------------------------------------------------------------------
# HTTP / HTTPS clients (no proxies, no magic)


@dataclass
class Reply:
    status: int
    reason: str
    headers: dict[str, str]
    body: str

    def json(self):
        return json.loads(self.body)


def http_request(
    port: int,
    path: str = "/",
    method: str = "GET",
    headers: dict[str, str] | None = None,
    host: str = LOOPBACK,
    timeout: float = 5.0,
) -> Reply:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        body = r.read().decode("utf-8", "replace")
        return Reply(r.status, r.reason, {k.lower(): v for k, v in r.getheaders()}, body)
    finally:
        conn.close()


def raw_http(
    port: int, payload: bytes, host: str = LOOPBACK, timeout: float = 5.0, source: str | None = None
) -> bytes:
    """Send exact bytes (e.g. HAProxy's ``OPTIONS / HTTP/1.0\\r\\n\\r\\n``), read until EOF."""
    src = (source, 0) if source else None
    with socket.create_connection((host, port), timeout=timeout, source_address=src) as s:
        try:
            s.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            return b""
        chunks = []
        while True:
            try:
                b = s.recv(65536)
            except ConnectionResetError:
                break
            if not b:
                break
            chunks.append(b)
    return b"".join(chunks)


def tls_context(cafile: str, certfile: str | None = None, keyfile: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    if certfile:
        ctx.load_cert_chain(certfile, keyfile)
    return ctx


@dataclass
class TLSReply(Reply):
    peer_cert: dict = field(default_factory=dict)
    tls_version: str = ""


def https_request(
    port: int,
    tls_name: str,
    ctx: ssl.SSLContext,
    path: str,
    method: str = "GET",
    host: str = LOOPBACK,
    timeout: float = 10.0,
) -> TLSReply:
    """HTTPS to ``host:port`` verifying the server as ``tls_name`` (SNI = Host = tls_name)."""
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        s = ctx.wrap_socket(raw, server_hostname=tls_name)
    except BaseException:
        raw.close()
        raise
    with s:
        req = (
            f"{method} {path} HTTP/1.1\r\nHost: {tls_name}\r\n"
            "Accept: application/json, text/plain\r\nConnection: close\r\n\r\n"
        )
        s.sendall(req.encode())
        r = http.client.HTTPResponse(s, method=method)
        r.begin()
        body = r.read().decode("utf-8", "replace")
        return TLSReply(
            r.status,
            r.reason,
            {k.lower(): v for k, v in r.getheaders()},
            body,
            peer_cert=s.getpeercert() or {},
            tls_version=s.version() or "",
        )


# --------------------------------------------------------------------------
# Puppet settings (asked once from Puppet itself, as the truth to compare with)


@dataclass
class PuppetSettings:
    certname: str
    ssldir: str
    confdir: str
    hostcert: str
    hostprivkey: str
    localcacert: str
    config: str


def puppet_settings() -> PuppetSettings:
    names = ["certname", "ssldir", "confdir", "hostcert", "hostprivkey", "localcacert", "config"]
    out = subprocess.run(
        ["puppet", "config", "print", *names, "--section", "server"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    ).stdout
    values = {}
    for line in out.splitlines():
        if " = " in line:
            k, v = line.split(" = ", 1)
            values[k.strip()] = v.strip()
    missing = [n for n in names if n not in values]
    if missing:
        raise StackError(f"`puppet config print` did not print {missing}: {out!r}")
    return PuppetSettings(**{n: values[n] for n in names})


# --------------------------------------------------------------------------
# Puppet Server


LOGBACK = """<configuration scan="false">
    <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
        <encoder>
            <pattern>%d{yyyy-MM-dd'T'HH:mm:ss.SSSXXX} %-5p [%t] [%c{2}] %m%n</pattern>
        </encoder>
    </appender>
    <logger name="puppetlabs.trapperkeeper.services.status.status-debug-logging" level="info"/>
    <logger name="org.eclipse.jetty" level="INFO"/>
    <logger name="jruby" level="info"/>
    <root level="info">
        <appender-ref ref="STDOUT"/>
    </root>
</configuration>
"""

REQUEST_LOGGING = """<configuration debug="false">
    <appender name="FILE" class="ch.qos.logback.core.FileAppender">
        <file>{access_log}</file>
        <append>true</append>
        <encoder>
            <pattern>%h %l %u [%t] "%r" %s %b "%i{{Referer}}" "%i{{User-Agent}}" %D</pattern>
        </encoder>
    </appender>
    <appender-ref ref="FILE" />
</configuration>
"""


def _hocon_set(text: str, key: str, value: str) -> str:
    """Replace ``key: anything`` (one line) in a HOCON file; the key must exist."""
    new, n = re.subn(rf"(?m)^(\s*){re.escape(key)}\s*[:=].*$", rf"\g<1>{key}: {value}", text)
    if n != 1:
        raise StackError(f"expected exactly one `{key}` in Puppet Server config, found {n}")
    return new


def _pool_size(puppetserver_conf: str, instances: int) -> str:
    """puppetserver.conf with ``max-active-instances`` set, commented out or not; exactly one."""
    text, n = re.subn(
        r"(?m)^(\s*)#?\s*max-active-instances\s*[:=].*$",
        rf"\g<1>max-active-instances: {instances}",
        puppetserver_conf,
    )
    if n != 1:
        raise StackError(f"expected one `max-active-instances` in puppetserver.conf, found {n}")
    return text


def _log_to_workdir(confd: Path, workdir: Path) -> None:
    """Puppet Server logs through workdir/logback.xml, named in confd's global.conf."""
    (workdir / "logback.xml").write_text(LOGBACK)
    glob = confd / "global.conf"
    glob.write_text(_hocon_set(glob.read_text(), "logging-config", str(workdir / "logback.xml")))


class PuppetServer:
    """A real Puppet Server on 127.0.0.1:8140, run by hand as user ``puppet``.

    Its configuration is a copy of the package's conf.d in a temp dir, changed
    only where a test run must not touch the host: ``ssl-host`` (loopback),
    ``server-run-dir`` (the temp dir), logging (files in the temp dir).  The
    ssldir (/var/lib/puppet/ssl) and the CA are the real ones: the first start
    creates them, as on a fresh install.
    """

    def __init__(self, workdir: Path, settings: PuppetSettings, java_args: str | None = None):
        self.dir = workdir
        self.settings = settings
        self.java_args = (java_args or os.environ.get("PMCHECK_E2E_JAVA_ARGS") or DEFAULT_JAVA_ARGS).split()
        self.confd = workdir / "conf.d"
        self.rundir = workdir / "run"
        self.restart_file = self.rundir / "restart"
        self.log = workdir / "puppetserver.log"
        self.access_log = workdir / "puppetserver-access.log"
        self.proc: subprocess.Popen | None = None
        self.start_times: list[float] = []
        self._prepare()

    def _prepare(self) -> None:
        pw = pwd.getpwnam("puppet")
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)
        shutil.copytree(PUPPETSERVER_CONFD, self.confd)
        web = self.confd / "webserver.conf"
        text = _hocon_set(web.read_text(), "ssl-host", LOOPBACK)
        text = _hocon_set(text, "ssl-port", str(PUPPET_PORT))
        (self.dir / "request-logging.xml").write_text(REQUEST_LOGGING.format(access_log=self.access_log))
        text = _hocon_set(text, "access-log-config", str(self.dir / "request-logging.xml"))
        web.write_text(text)
        ps = self.confd / "puppetserver.conf"
        text = _hocon_set(ps.read_text(), "server-run-dir", str(self.rundir))
        ps.write_text(_pool_size(text, MAX_ACTIVE_INSTANCES))
        _log_to_workdir(self.confd, self.dir)
        for p in self.confd.rglob("*"):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        self.rundir.mkdir(mode=0o755, exist_ok=True)
        os.chown(self.rundir, pw.pw_uid, pw.pw_gid)
        self.access_log.touch()
        os.chown(self.access_log, pw.pw_uid, pw.pw_gid)

    # -- lifecycle

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise StackError(f"Puppet Server exited (status {code}); log tail:\n{tail(self.log)}")

    def start(self, timeout: float = 300.0) -> float:
        """Start and wait until ready; returns the seconds it took."""
        if self.running():
            raise StackError("Puppet Server is already running")
        if port_accepts(PUPPET_PORT):
            raise StackError(
                f"something already listens on {LOOPBACK}:{PUPPET_PORT}; this suite needs to own "
                "Puppet Server (it stops and starts it). Stop the other instance first."
            )
        pw = pwd.getpwnam("puppet")
        self.restart_file.write_text("0")
        os.chown(self.restart_file, pw.pw_uid, pw.pw_gid)
        cmd = [
            "setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--",
            "java", *self.java_args,
            f"-Djruby.lib={JRUBY_LIB}",
            "-XX:+CrashOnOutOfMemoryError",
            f"-XX:ErrorFile={self.dir}/puppetserver_err_pid%p.log",
            "-jar", PUPPETSERVER_JAR,
            "--config", str(self.confd),
            "--bootstrap-config", PUPPETSERVER_SERVICES_D,
            "--restart-file", str(self.restart_file),
        ]  # fmt: skip
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOME": pw.pw_dir,
            "USER": "puppet",
            "LOGNAME": "puppet",
        }
        t0 = time.monotonic()
        with open(self.log, "ab") as log:
            log.write(f"\n==== e2e: starting Puppet Server at {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.dir, env=env, start_new_session=True,
            )  # fmt: skip
        try:
            wait_until(
                "Puppet Server to be ready", self.ready, timeout, interval=0.25, alive=self.check_alive
            )
        except BaseException:
            self.stop()
            raise
        took = time.monotonic() - t0
        self.start_times.append(took)
        return took

    def pool(self) -> dict | None:
        """The JRuby pool as Puppet Server reports it (``status.experimental.metrics`` of
        ``jruby-metrics``), or None while it does not answer."""
        ctx = tls_context(self.settings.localcacert, self.settings.hostcert, self.settings.hostprivkey)
        try:
            r = https_request(
                PUPPET_PORT,
                self.settings.certname,
                ctx,
                "/status/v1/services/jruby-metrics?level=debug",
                timeout=5,
            )
            return json.loads(r.body)["status"]["experimental"]["metrics"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def ready(self) -> bool:
        if self.restart_file.read_text().strip() != "1":
            return False
        r = self.status()
        return r.status == 200 and r.body.strip() == "running"

    def status(self) -> TLSReply:
        ctx = tls_context(self.settings.localcacert)
        return https_request(PUPPET_PORT, self.settings.certname, ctx, "/status/v1/simple", timeout=5)

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc, "Puppet Server", term_timeout=60)
        if self.proc is not None:
            # the port must really be free again: a later start relies on it
            wait_until(f"port {PUPPET_PORT} to close", lambda: not port_accepts(PUPPET_PORT), 30)


# --------------------------------------------------------------------------
# real Puppet agents

ENVIRONMENTS = Path("/etc/puppet/code/environments")


@contextlib.contextmanager
def slow_environment(name: str, seconds: int, environments: Path = ENVIRONMENTS):
    """A Puppet environment NAME whose catalog takes ``seconds`` to compile (``generate`` runs
    /bin/sleep on the server, holding a JRuby instance), created in the host's environmentpath
    (or in ``environments``) and removed afterwards, with any directory it had to create."""
    env = environments / name
    created = [d for d in (environments.parent, environments) if not d.exists()]
    shutil.rmtree(env, ignore_errors=True)  # a leftover of an interrupted run
    (env / "manifests").mkdir(parents=True)
    (env / "manifests" / "site.pp").write_text(
        f"node default {{\n  $slept = generate('/bin/sleep', '{seconds}')\n"
        "  notify { 'pmcheck e2e compile': }\n}\n"
    )
    for d in [*created, env, env / "manifests"]:
        os.chmod(d, 0o755)
    os.chmod(env / "manifests" / "site.pp", 0o644)
    try:
        yield name
    finally:
        shutil.rmtree(env, ignore_errors=True)
        for d in reversed(created):
            with contextlib.suppress(OSError):
                d.rmdir()


def agent_run(settings: PuppetSettings, port: int, environment: str, workdir: Path) -> subprocess.Popen:
    """One real ``puppet agent --test --noop`` against ``certname:port`` (HAProxy's frontend
    or Puppet Server itself), with its own vardir and rundir so that concurrent runs do not
    share a lock. Exit 0 or 2 is a successful run."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        "puppet", "agent", "--test", "--noop",
        "--server", settings.certname, "--serverport", str(port),
        "--environment", environment,
        "--vardir", str(workdir / "var"), "--rundir", str(workdir / "run"),
        "--logdir", str(workdir / "log"), "--publicdir", str(workdir / "public"),
    ]  # fmt: skip
    log = open(workdir / "agent.log", "wb")  # noqa: SIM115 - closed when the child has it
    try:
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=clean_env(), start_new_session=True,
        )  # fmt: skip
    finally:
        log.close()


# --------------------------------------------------------------------------
# stand-ins for pmcheck's two ports, to see how HAProxy reads a given answer


class _StubServer:
    """A threaded TCP server on 127.0.0.1 (a port of its own) calling ``self.serve(conn)`` per
    connection; counts the connections it served, so a test can wait for the next checks."""

    def __init__(self, name: str):
        self.name = name
        self.sock = socket.create_server((LOOPBACK, 0))
        self.port = self.sock.getsockname()[1]
        self.served = 0
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._accept, name=name, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(timeout=5)

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                self.serve(conn)
            except OSError:
                return
        with self.lock:
            self.served += 1

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def count(self) -> int:
        with self.lock:
            return self.served


class AgentLineStub(_StubServer):
    """An agent-check port that writes ``line`` (plus ``\n``) to each connection without
    reading first and closes, as ``pmcheck serve --agent-listen`` does."""

    def __init__(self, line: str = ""):
        super().__init__("agent-line-stub")
        self.line = line

    def serve(self, conn: socket.socket) -> None:
        conn.sendall(self.line.encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(512):  # whatever the client still sends, until it closes
            pass


class HttpStatusStub(_StubServer):
    """A check port that answers every request with ``status`` and ``reason`` (HTTP/1.0, a
    one-line body), as pmcheck's HTTP responder does."""

    def __init__(self, status: int = 200, reason: str = "OK"):
        super().__init__("http-status-stub")
        self.status, self.reason = status, reason

    def serve(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data and len(data) < 65536:
            b = conn.recv(4096)
            if not b:
                break
            data += b
        body = f"{self.reason}\n".encode()
        head = f"HTTP/1.0 {self.status} {self.reason}\r\nContent-Type: text/plain\r\n"
        conn.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


# --------------------------------------------------------------------------
# pmcheck


class Pmcheck:
    """The pmcheck binary: one-shot commands and ``serve`` daemons.

    ``echo`` receives a line for each command run (the suite prints them; the demo
    shows its own).
    """

    def __init__(self, binary: str, workdir: Path, echo: Callable[[str], None] = print):
        self.binary = binary
        self.dir = workdir
        self.echo = echo
        self.daemons: list[PmcheckServe] = []

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess:
        cp = subprocess.run(
            [self.binary, *args], capture_output=True, text=True, timeout=timeout,
            env=env if env is not None else clean_env(), stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self.echo(f"[e2e] $ pmcheck {' '.join(args)}  -> exit {cp.returncode}")
        for line in (cp.stdout + cp.stderr).splitlines()[:40]:
            self.echo(f"[e2e]   {line}")
        return cp

    def serve(
        self,
        state_dir: Path,
        *extra: str,
        env: dict[str, str] | None = None,
        name: str = "serve",
        host: str = LOOPBACK,
    ) -> PmcheckServe:
        """``pmcheck serve --listen HOST:<a free port> --state-dir STATE_DIR EXTRA...``, started and
        answering."""
        d = PmcheckServe(self, state_dir, list(extra), env, self.dir / f"pmcheck-{name}.log", host=host)
        self.daemons.append(d)
        d.start()
        return d

    def stop_all(self) -> None:
        for d in self.daemons:
            d.stop()


class PmcheckServe:
    def __init__(self, pm: Pmcheck, state_dir: Path, extra: list[str], env, log: Path, host: str = LOOPBACK):
        self.pm = pm
        self.host = host
        self.state_dir = state_dir
        self.extra = extra
        self.env = env if env is not None else clean_env(RUST_LOG=os.environ.get("RUST_LOG", "info"))
        self.log = log
        self.port = free_port(host)
        self.proc: subprocess.Popen | None = None

    @property
    def listen(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.listen}/"

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise StackError(
                f"pmcheck serve exited ({self.proc and self.proc.returncode}); log:\n{tail(self.log)}"
            )

    def start(self, timeout: float = 20) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        state = str(self.state_dir)
        cmd = [self.pm.binary, "serve", "--listen", self.listen, "--state-dir", state, *self.extra]
        self.pm.echo(f"[e2e] $ {' '.join(cmd)}")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True,
            )  # fmt: skip
        wait_until(
            f"pmcheck serve on {self.listen} to answer", self._answers, timeout, alive=self.check_alive
        )

    def _answers(self) -> bool:
        try:
            http_request(self.port, timeout=2, host=self.host)
            return True
        except OSError:
            return False

    def get(self, path: str = "/", **kw) -> Reply:
        kw.setdefault("host", self.host)
        return http_request(self.port, path, **kw)

    def wait_verdict(self, status: int, timeout: float = 30) -> tuple[Reply, float]:
        return wait_until(
            f"pmcheck on {self.listen} to answer {status}",
            lambda: (r := self.get()) and r.status == status and r,
            timeout, interval=0.1, alive=self.check_alive,
        )  # fmt: skip

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc, "pmcheck serve", term_timeout=10)


# --------------------------------------------------------------------------
# Prometheus


PROMETHEUS_CONFIG = """\
# written by tests/e2e/e2e_stack.py: a throwaway Prometheus scraping one pmcheck
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - {rules}
scrape_configs:
  - job_name: pmcheck
    static_configs:
      - targets: ["{target}"]
"""


class Prometheus:
    """Debian's Prometheus server on a free loopback port, scraping ``target`` every second with
    the shipped alert rules; its data in the test's dir. Stopped by PID."""

    def __init__(self, workdir: Path, target: str, rules: Path):
        self.dir = workdir / "prometheus"
        self.dir.mkdir(mode=0o755, exist_ok=True)
        self.cfg = self.dir / "prometheus.yml"
        self.log = self.dir / "prometheus.log"
        self.cfg.write_text(PROMETHEUS_CONFIG.format(rules=rules, target=target))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise StackError(
                f"prometheus exited ({self.proc and self.proc.returncode}); log:\n{tail(self.log)}"
            )

    def start(self, timeout: float = 60) -> float:
        cmd = [
            "prometheus", f"--config.file={self.cfg}", f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address={LOOPBACK}:{self.port}",
        ]  # fmt: skip
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=clean_env(), start_new_session=True,
            )  # fmt: skip
        _, took = wait_until(
            "Prometheus to be ready", lambda: self._get("/-/ready").status == 200, timeout,
            interval=0.1, alive=self.check_alive,
        )  # fmt: skip
        return took

    def _get(self, path: str) -> Reply:
        return http_request(self.port, path, timeout=5)

    def api(self, path: str, **params: str):
        """``GET /api/v1/PATH?PARAMS``'s ``data``."""
        reply = self._get(f"/api/v1/{path}?{urllib.parse.urlencode(params)}")
        answer = reply.json()
        if reply.status != 200 or answer.get("status") != "success":
            raise StackError(f"Prometheus API {path} {params}: HTTP {reply.status} {reply.body[:300]}")
        return answer["data"]

    def query(self, promql: str) -> dict[str, float]:
        """An instant query's samples, by their labels (``name{k="v",...}``)."""
        out = {}
        for r in self.api("query", query=promql)["result"]:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(r["metric"].items()) if k != "__name__")
            out[f"{r['metric'].get('__name__', '')}{{{labels}}}"] = float(r["value"][1])
        return out

    def value(self, promql: str) -> float | None:
        """The one sample ``promql`` selects, or None when it selects nothing."""
        samples = list(self.query(promql).values())
        if len(samples) > 1:
            raise StackError(f"{promql} selects {len(samples)} series")
        return samples[0] if samples else None

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc, "prometheus", term_timeout=20)


# --------------------------------------------------------------------------
# HAProxy


HAPROXY_HEAD = """\
# ---- written by tests/e2e/e2e_stack.py: global/defaults of a throwaway HAProxy
global
    stats socket {sock} mode 600 level admin
    log stderr format raw local0 info
    # no `daemon`, no `user`, no `chroot`: run in the foreground under the test

defaults
    log global
    option log-health-checks
    timeout connect 2s
    timeout client 1m
    timeout server 1m

# ---- from here on: {source} (addresses and ports for this machine)
"""


class HAProxy:
    def __init__(self, workdir: Path, name: str, body: str, source: str):
        self.dir = workdir
        self.name = name
        self.sock = workdir / f"haproxy-{name}.sock"
        self.cfg = workdir / f"haproxy-{name}.cfg"
        self.log = workdir / f"haproxy-{name}.log"
        self.cfg.write_text(HAPROXY_HEAD.format(sock=self.sock, source=source) + body)
        self.proc: subprocess.Popen | None = None

    def validate(self) -> None:
        cp = subprocess.run(
            ["haproxy", "-c", "-f", str(self.cfg)], capture_output=True, text=True, timeout=30
        )
        if cp.returncode != 0:
            raise StackError(
                f"haproxy -c rejected {self.cfg}:\n{cp.stdout}{cp.stderr}\n--- config:\n{self.cfg.read_text()}"
            )

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise StackError(f"haproxy exited ({self.proc and self.proc.returncode}); log:\n{tail(self.log)}")

    def start(self) -> None:
        self.validate()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["haproxy", "-db", "-f", str(self.cfg)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        wait_until(
            "the HAProxy admin socket",
            lambda: "Name: HAProxy" in self.admin("show info"),
            15,
            alive=self.check_alive,
        )

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc, "haproxy", term_timeout=10)

    # -- the admin socket: HAProxy's own view, never inferred

    def admin(self, command: str, timeout: float = 5) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(self.sock))
            s.sendall(command.encode() + b"\n")
            chunks = []
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        return b"".join(chunks).decode("utf-8", "replace")

    def servers_state(self, backend: str) -> list[dict[str, str]]:
        """``show servers state BACKEND`` as dicts keyed by the header's names."""
        out = self.admin(f"show servers state {backend}")
        lines = [line for line in out.splitlines() if line.strip()]
        header = next((line for line in lines if line.startswith("# ")), None)
        if header is None:
            raise StackError(f"unexpected `show servers state` output: {out!r}")
        names = header[2:].split()
        rows = []
        for line in lines:
            if line.startswith("#") or len(line.split()) < 5:
                continue
            rows.append(dict(zip(names, line.split(), strict=False)))
        return rows

    def stat(self) -> list[dict[str, str]]:
        """``show stat`` CSV as dicts keyed by its header (pxname, svname, status, check_status, ...)."""
        out = self.admin("show stat")
        if not out.startswith("# "):
            raise StackError(f"unexpected `show stat` output: {out[:200]!r}")
        return list(csv.DictReader(io.StringIO(out[2:])))

    def servers(self, backend: str) -> list[dict[str, str]]:
        """Each server of the backend as HAProxy sees it: its `show stat` row updated with
        its `show servers state` row (srv_op_state, srv_admin_state, ...)."""
        states = {r["srv_name"]: r for r in self.servers_state(backend)}
        merged = []
        for row in self.stat():
            if row["pxname"] != backend or row["svname"] in ("FRONTEND", "BACKEND"):
                continue
            if row["svname"] not in states:
                raise StackError(f"`show servers state {backend}` has no {row['svname']}")
            merged.append({**row, **states[row["svname"]]})
        return merged

    def server(self, backend: str, server: str) -> dict[str, str]:
        """One server as HAProxy sees it (see ``servers``)."""
        s = next((s for s in self.servers(backend) if s["svname"] == server), None)
        if s is None:
            raise StackError(f"HAProxy has no server {backend}/{server}")
        return s

    def wait_server(
        self, backend: str, server: str, want: Callable[[dict[str, str]], bool], what: str, timeout: float
    ) -> tuple[dict[str, str], float]:
        return wait_until(
            f"HAProxy to see {backend}/{server} {what}",
            lambda: (s := self.server(backend, server)) and want(s) and s,
            timeout, interval=0.05, alive=self.check_alive,
        )  # fmt: skip


def is_up_checked(s: dict[str, str]) -> bool:
    """UP *and* the last check really passed (HAProxy counts a server UP before its first check)."""
    return (
        s["status"] == "UP"
        and s["srv_op_state"] == "2"
        and s["check_status"].lstrip("* ") == "L7OK"
        and s["check_code"] == "200"
    )


def is_down_503(s: dict[str, str]) -> bool:
    return (
        s["status"] == "DOWN"
        and s["srv_op_state"] == "0"
        and s["check_status"].lstrip("* ") == "L7STS"
        and s["check_code"] == "503"
    )


def status_check(s: dict[str, str]) -> str:
    """``UP L7OK``, ``DOWN L7STS``, ``UP 2/3 L7STS`` while a transition is under way... (the
    ``* `` that marks a check in progress is dropped)."""
    return f"{s['status']} {s['check_status'].lstrip('* ')}"


def view(s: dict[str, str]) -> str:
    """One server on one line, for people: status, last check (status/code/text), states."""
    return "{}/{:<10} status={:<5} check={}/{} {:<28} op_state={} admin_state={}".format(
        s["pxname"], s["svname"], s["status"], s["check_status"], s["check_code"] or "-",
        f'"{s["last_chk"]}"', s.get("srv_op_state"), s.get("srv_admin_state"),
    )  # fmt: skip


def summary(s: dict[str, str]) -> str:
    keys = [
        "status",
        "srv_op_state",
        "srv_admin_state",
        "check_status",
        "check_code",
        "last_chk",
        "chkfail",
        "chkdown",
        "stot",
    ]
    return " ".join(f"{k}={s.get(k)!r}" for k in keys)


# --------------------------------------------------------------------------
# rendering the shipped packaging files for a test run

SERVER_LINE = re.compile(r"(?m)^(?P<indent>\s*)server\s+(?P<name>\S+)\s+(?P<addr>\S+)(?P<rest>.*)$")


def render_haproxy(
    text: str,
    frontend_port: int,
    check_port: int,
    backend_addr: str = f"{LOOPBACK}:{PUPPET_PORT}",
    timing: str | None = None,
    agent_port: int | None = None,
    targets: list[tuple[str, int, int]] | None = None,
) -> tuple[str, str, list[str]]:
    """Turn packaging/haproxy/pmcheck.cfg into a loopback-only config.

    * every ``bind`` gets the loopback address and ``frontend_port``;
    * every active ``server`` line gets ``backend_addr`` and ``check port <check_port>``;
    * its ``agent-port`` becomes ``agent_port`` (without one, a free port nothing listens on:
      HAProxy then changes nothing for the agent, and the HTTP check decides alone);
    * with ``timing`` (``"inter 300ms rise 2 fall 2"``, ``"... agent-inter 300ms"``: pairs of a
      keyword the shipped line has and a value) those keywords of the server lines are replaced
      by it, the others are kept as shipped;
    * with ``targets`` (one ``(address:port, check port, agent port)`` per shipped server line, in
      order: several compile masters on loopback addresses of their own) each server line gets its
      own, instead of ``backend_addr``, ``check_port`` and ``agent_port``.
    Returns (config, backend name, server names).  Raises when the file does not have the
    shape the suite relies on, so the test fails instead of testing something else.
    """
    out, nbind = re.subn(r"(?m)^(\s*)bind\s+\S+", rf"\g<1>bind {LOOPBACK}:{frontend_port}", text)
    if nbind < 1:
        raise StackError("packaging/haproxy/pmcheck.cfg has no `bind` line")
    names: list[str] = []
    agent = agent_port if agent_port is not None else free_port()

    def fix_server(m: re.Match) -> str:
        rest = m["rest"]
        addr, check, agent_p = backend_addr, check_port, agent
        if targets is not None:
            if len(names) >= len(targets):
                raise StackError(f"more server lines than the {len(targets)} targets given: {m[0]!r}")
            addr, check, agent_p = targets[len(names)]
        rest, n = re.subn(r"(?<![\w-])port\s+\d+", f"port {check}", rest)
        if n != 1:
            raise StackError(f"server line without exactly one `port N`: {m[0]!r}")
        rest, n = re.subn(r"\bagent-port\s+\d+", f"agent-port {agent_p}", rest)
        if n != 1:
            raise StackError(f"server line without exactly one `agent-port N`: {m[0]!r}")
        if timing is not None:
            words = timing.split()
            if len(words) % 2:
                raise StackError(f"timing must be keyword/value pairs: {timing!r}")
            for word in words[::2]:
                # `inter` is not the end of `agent-inter`
                rest, n = re.subn(rf"(?<![\w-]){re.escape(word)}\s+\S+", "", rest)
                if n != 1:
                    raise StackError(f"server line without exactly one `{word}`: {m[0]!r}")
            rest = re.sub(r"\s+", " ", rest).rstrip() + " " + timing
        names.append(m["name"])
        return f"{m['indent']}server {m['name']} {addr}{rest}"

    out = SERVER_LINE.sub(fix_server, out)
    if not names:
        raise StackError("packaging/haproxy/pmcheck.cfg has no active `server` line")
    if targets is not None and len(names) != len(targets):
        raise StackError(f"{len(targets)} targets for the shipped file's {len(names)} server lines")
    backends = re.findall(r"(?m)^backend\s+(\S+)", out)
    if len(backends) != 1:
        raise StackError(f"expected exactly one backend in the shipped HAProxy file, found {backends}")
    # nothing in it may point anywhere but loopback
    for m in re.finditer(r"(?m)^\s*(bind|server)\s.*$", out):
        if not re.search(r"\s127\.\d+\.\d+\.\d+:\d+", m[0]):
            raise StackError(f"non-loopback address left in rendered config: {m[0]!r}")
    return out, backends[0], names


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


# --------------------------------------------------------------------------
# several compile masters behind one load balancer (test_rolling_restart.py)
#
# Each master is a real Puppet Server on a loopback address of its own (the whole 127.0.0.0/8
# is local on Linux) and port 8140, with its own conf.d, bootstrap directory, puppet.conf,
# ssldir and vardir in the test's temp dir. The first holds a throwaway CA made by Puppet's own
# tool (`puppetserver ca setup`); the others run with the CA service disabled, as compile
# masters do, with certificates that CA signed. Nothing of the host's Puppet (its ssldir, its
# CA) is touched. Their JVMs are started detached by tests/e2e/puppetserver_ctl.py and known by
# a pidfile, so that `pmcheck cycle` can restart one with a real program; `ctl_stop` stops one
# by that PID (the fixtures call it whatever happened).

# The name agents use for the load balancer: /etc/hosts maps it to 127.0.0.1 on every Debian
# host, so nothing global is edited. Every master's certificate carries it as a DNS alt name.
LB_NAME = "localhost"
# half of DEFAULT_JAVA_ARGS: two JVMs share the machine, each with a pool of MASTER_INSTANCES
MASTER_JAVA_ARGS = (
    "-Xms512m -Xmx768m -XX:TieredStopAtLevel=1 "
    "-Djruby.logger.class=com.puppetlabs.jruby_utils.jruby.Slf4jLogger"
)
MASTER_INSTANCES = 1
CA_SERVICE = "puppetlabs.services.ca.certificate-authority-service/certificate-authority-service"
CA_DISABLED_SERVICE = (
    "puppetlabs.services.ca.certificate-authority-disabled-service/certificate-authority-disabled-service"
)
CTL = Path(__file__).resolve().with_name("puppetserver_ctl.py")


@dataclass
class Identity:
    """A Puppet certname and the ssldir with its key, its certificate, the CA bundle and the CRL,
    laid out as Puppet lays them out."""

    certname: str
    ssldir: Path

    @property
    def hostcert(self) -> Path:
        return self.ssldir / "certs" / f"{self.certname}.pem"

    @property
    def hostprivkey(self) -> Path:
        return self.ssldir / "private_keys" / f"{self.certname}.pem"

    @property
    def localcacert(self) -> Path:
        return self.ssldir / "certs" / "ca.pem"

    @property
    def hostcrl(self) -> Path:
        return self.ssldir / "crl.pem"


def _run(cmd: list[str], what: str, timeout: float = 120) -> str:
    cp = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=clean_env()
    )
    if cp.returncode != 0:
        raise StackError(f"{what} failed (exit {cp.returncode}): {' '.join(cmd)}\n{cp.stdout}{cp.stderr}")
    return cp.stdout


# The extensions Puppet's CA puts in the certificates it signs for agents and servers
# (compare `openssl x509 -text` of one it signed): no pp_cli_auth, which only the CA host gets.
SIGN_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = critical, serverAuth, clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
nsComment = "Puppet Server Internal Certificate"
subjectAltName = {sans}
"""


def ca_sign(cadir: Path, ca_ssldir: Path, ident: Identity, alt_names: Iterable[str] = ()) -> None:
    """A new 2048-bit key and a certificate for ``ident``, signed with openssl by the Puppet CA in
    ``cadir`` with the extensions Puppet's CA would give it; written to ``ident.ssldir`` with the
    CA bundle and CRL of ``ca_ssldir``, and recorded in the CA's serial, inventory and signed/
    as Puppet's CA records its own."""
    ssl_dir = ident.ssldir
    for d in (ssl_dir, ssl_dir / "certs", ssl_dir / "private_keys"):
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o750)
    key, cert = ident.hostprivkey, ident.hostcert
    _run(["openssl", "genrsa", "-traditional", "-out", str(key), "2048"], f"a key for {ident.certname}")
    os.chmod(key, 0o640)
    csr, ext = ssl_dir / f"{ident.certname}.csr", ssl_dir / f"{ident.certname}.ext"
    _run(
        ["openssl", "req", "-new", "-key", str(key), "-subj", f"/CN={ident.certname}", "-out", str(csr)],
        f"a CSR for {ident.certname}",
    )
    sans = ", ".join(f"DNS:{n}" for n in dict.fromkeys([ident.certname, *alt_names]))
    ext.write_text(SIGN_EXTENSIONS.format(sans=sans))
    serial_file = cadir / "serial"
    serial = int(serial_file.read_text().strip(), 16)
    _run(
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(cadir / "ca_crt.pem"),
         "-CAkey", str(cadir / "ca_key.pem"), "-set_serial", str(serial), "-days", "30", "-sha256",
         "-extfile", str(ext), "-out", str(cert)],
        f"signing {ident.certname}",
    )  # fmt: skip
    csr.unlink()
    ext.unlink()
    serial_file.write_text(f"{serial + 1:04X}")  # the file keeps its owner (puppet)
    dates = _run(["openssl", "x509", "-in", str(cert), "-noout", "-startdate", "-enddate"], "dates")
    stamp = {
        k: time.strftime("%Y-%m-%dT%H:%M:%SUTC", time.strptime(v.strip(), "%b %d %H:%M:%S %Y %Z"))
        for k, v in (line.split("=", 1) for line in dates.splitlines())
    }
    with open(cadir / "inventory.txt", "a") as inv:
        inv.write(f"0x{serial:04x} {stamp['notBefore']} {stamp['notAfter']} /CN={ident.certname}\n")
    signed = cadir / "signed" / f"{ident.certname}.pem"
    shutil.copyfile(cert, signed)
    pw = pwd.getpwnam("puppet")
    os.chown(signed, pw.pw_uid, pw.pw_gid)
    os.chmod(cert, 0o644)
    shutil.copyfile(ca_ssldir / "certs" / "ca.pem", ident.localcacert)
    shutil.copyfile(ca_ssldir / "crl.pem", ident.hostcrl)
    os.chmod(ident.localcacert, 0o644)
    os.chmod(ident.hostcrl, 0o644)


class CompileMaster:
    """One Puppet Server compile master on ``host``:8140 (see the section's comment).

    ``ca=True``: this master holds the CA; ``setup_ca`` makes it with `puppetserver ca setup`.
    Otherwise its bootstrap has the CA service disabled, and ``issue_cert`` gets its certificate
    from the CA master. Start, stop and restart go through puppetserver_ctl.py (``ctl_*`` below)
    with the spec written to ``spec_file``.
    """

    def __init__(
        self,
        workdir: Path,
        name: str,
        host: str,
        certname: str,
        ca: bool,
        java_args: str | None = None,
        instances: int = MASTER_INSTANCES,
        alt_names: Iterable[str] = (LB_NAME,),
        codedir: Path | None = None,
    ):
        self.dir, self.name, self.host, self.ca = workdir, name, host, ca
        self.ident = Identity(certname, workdir / "ssl")
        self.alt_names = list(alt_names)
        self.java_args = (
            java_args or os.environ.get("PMCHECK_E2E_MASTER_JAVA_ARGS") or MASTER_JAVA_ARGS
        ).split()
        self.instances = instances
        self.confdir = workdir / "puppet"
        # its own code dir (with a `production` environment, which Puppet Server would otherwise
        # try to create at start as user puppet): the host's /etc/puppet/code is left alone
        self.codedir = codedir or workdir / "code"
        self.puppet_conf = self.confdir / "puppet.conf"
        self.cadir = workdir / "ca"
        self.confd = workdir / "conf.d"
        self.bootstrap = workdir / "services.d"
        self.vardir, self.rundir, self.logdir = workdir / "var", workdir / "run", workdir / "log"
        self.restart_file = self.rundir / "restart"
        self.log = workdir / "puppetserver.log"
        self.access_log = workdir / "puppetserver-access.log"
        self.pidfile = workdir / "puppetserver.pid"
        self.spec_file = workdir / "ctl.json"
        self._prepare()

    @property
    def addr(self) -> str:
        return f"{self.host}:{PUPPET_PORT}"

    def _prepare(self) -> None:
        pw = pwd.getpwnam("puppet")
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)
        self.confdir.mkdir(mode=0o755)
        for d in (self.codedir, self.codedir / "environments", self.codedir / "environments" / "production"):
            d.mkdir(mode=0o755, exist_ok=True)
        self.puppet_conf.write_text(
            "# written by tests/e2e/e2e_stack.py: a compile master of the rolling-restart test\n"
            f"[main]\ncertname = {self.ident.certname}\nssldir = {self.ident.ssldir}\n"
            # only `puppetserver ca setup` makes keys from this; 2048 bits take a second, not five
            "keylength = 2048\n"
            f"[server]\ncadir = {self.cadir}\n"
        )
        shutil.copytree(PUPPETSERVER_CONFD, self.confd)
        web = self.confd / "webserver.conf"
        text = _hocon_set(web.read_text(), "ssl-host", self.host)
        text = _hocon_set(text, "ssl-port", str(PUPPET_PORT))
        (self.dir / "request-logging.xml").write_text(REQUEST_LOGGING.format(access_log=self.access_log))
        text = _hocon_set(text, "access-log-config", str(self.dir / "request-logging.xml"))
        web.write_text(text)
        ps = self.confd / "puppetserver.conf"
        text = ps.read_text()
        for key, value in (
            ("server-conf-dir", self.confdir),
            ("server-code-dir", self.codedir),
            ("server-var-dir", self.vardir),
            ("server-run-dir", self.rundir),
            ("server-log-dir", self.logdir),
        ):
            text = _hocon_set(text, key, str(value))
        ps.write_text(_pool_size(text, self.instances))
        _log_to_workdir(self.confd, self.dir)
        shutil.copytree(PUPPETSERVER_SERVICES_D, self.bootstrap)
        # ca.cfg names the CA service and, commented out, the disabled one (and other services):
        # a compile master swaps the two
        ca_cfg = self.bootstrap / "ca.cfg"
        lines, found = [], set()
        for line in ca_cfg.read_text().splitlines():
            service = line.lstrip("#").strip()
            if service in (CA_SERVICE, CA_DISABLED_SERVICE):
                found.add(service)
                line = service if (service == CA_SERVICE) == self.ca else f"#{service}"
            lines.append(line)
        if found != {CA_SERVICE, CA_DISABLED_SERVICE}:
            raise StackError(f"{PUPPETSERVER_SERVICES_D}/ca.cfg does not name both CA services: {lines}")
        ca_cfg.write_text("\n".join(lines) + "\n")
        for p in [*self.confd.rglob("*"), *self.bootstrap.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        for d in (self.vardir, self.rundir, self.logdir):
            d.mkdir(mode=0o750)
            os.chown(d, pw.pw_uid, pw.pw_gid)
        self.access_log.touch()
        os.chown(self.access_log, pw.pw_uid, pw.pw_gid)
        self.spec_file.write_text(json.dumps(self.spec(), indent=2))

    def spec(self) -> dict:
        """What puppetserver_ctl.py needs to start, check and stop this master."""
        pw = pwd.getpwnam("puppet")
        cmd = [
            "setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--",
            "java", *self.java_args,
            f"-Djruby.lib={JRUBY_LIB}",
            "-XX:+CrashOnOutOfMemoryError",
            f"-XX:ErrorFile={self.dir}/puppetserver_err_pid%p.log",
            "-jar", PUPPETSERVER_JAR,
            "--config", str(self.confd),
            "--bootstrap-config", str(self.bootstrap),
            "--restart-file", str(self.restart_file),
        ]  # fmt: skip
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOME": pw.pw_dir,
            "USER": "puppet",
            "LOGNAME": "puppet",
        }
        return {
            "name": self.name, "cmd": cmd, "env": env, "cwd": str(self.dir), "log": str(self.log),
            "restart_file": str(self.restart_file), "pidfile": str(self.pidfile),
            "host": self.host, "port": PUPPET_PORT, "certname": self.ident.certname,
            "cafile": str(self.ident.localcacert),
            # in the JVM's command line and nobody else's: a recycled PID is never taken for it
            "marker": str(self.confd),
        }  # fmt: skip

    # -- certificates

    def setup_ca(self) -> None:
        """The CA (root and intermediate) and this master's certificate, with `puppetserver ca
        setup`, offline, as on a fresh CA host."""
        if not self.ca:
            raise StackError(f"{self.name} does not hold the CA")
        _run(
            ["puppetserver", "ca", "setup", "--config", str(self.puppet_conf),
             "--subject-alt-names", ",".join(self.alt_names), "--ca-name", "pmcheck e2e CA"],
            "puppetserver ca setup",
        )  # fmt: skip

    def issue(self, ident: Identity, alt_names: Iterable[str] = ()) -> None:
        """A certificate for ``ident`` signed by this master's CA."""
        if not self.ca:
            raise StackError(f"{self.name} does not hold the CA")
        ca_sign(self.cadir, self.ident.ssldir, ident, alt_names)

    def issue_own_cert(self, ca_master: CompileMaster) -> None:
        """This (CA-less) master's certificate, from the CA master, readable by user puppet."""
        ca_master.issue(self.ident, self.alt_names)
        pw = pwd.getpwnam("puppet")
        for p in [self.ident.ssldir, *self.ident.ssldir.rglob("*")]:
            os.chown(p, pw.pw_uid, pw.pw_gid)

    # -- lifecycle (through puppetserver_ctl.py, as `pmcheck cycle` does)

    def ctl_argv(self, action: str) -> list[str]:
        return [sys.executable, str(CTL), action, str(self.spec_file)]

    def pid(self) -> int | None:
        return ctl_pid(self.spec())

    def running(self) -> bool:
        return self.pid() is not None

    def stop(self) -> float | None:
        return ctl_stop(self.spec())

    def status(self) -> TLSReply:
        return ctl_status(self.spec())

    def pool(self) -> dict | None:
        """The JRuby pool as this master reports it (``status.experimental.metrics`` of
        ``jruby-metrics``), or None while it does not answer."""
        ctx = tls_context(str(self.ident.localcacert))
        try:
            r = https_request(
                PUPPET_PORT, self.ident.certname, ctx, "/status/v1/services/jruby-metrics?level=debug",
                host=self.host, timeout=5,
            )  # fmt: skip
            return json.loads(r.body)["status"]["experimental"]["metrics"]
        except (OSError, ValueError, KeyError, TypeError):
            return None


# -- puppetserver_ctl.py's work: a JVM started detached, known by its pidfile


def _proc_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (R, S, Z...), None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _gone(pid: int) -> bool:
    return _proc_state(pid) in (None, "Z", "X")


def ctl_pid(spec: dict) -> int | None:
    """The PID in the pidfile, if that process is alive and is this master's JVM (its command line
    names the master's conf.d): never a recycled PID."""
    try:
        pid = int(Path(spec["pidfile"]).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    if _gone(pid) or spec["marker"].encode() not in cmdline.split(b"\0"):
        return None
    return pid


def ctl_status(spec: dict) -> TLSReply:
    ctx = tls_context(spec["cafile"])
    return https_request(
        spec["port"], spec["certname"], ctx, "/status/v1/simple", host=spec["host"], timeout=5
    )


def ctl_ready(spec: dict) -> bool:
    if Path(spec["restart_file"]).read_text().strip() != "1":
        return False
    r = ctl_status(spec)
    return r.status == 200 and r.body.strip() == "running"


def ctl_stop(spec: dict, term_timeout: float = 60) -> float | None:
    """Stop the master's JVM by the PID in its pidfile (SIGTERM to its process group, SIGKILL
    after ``term_timeout``), wait until its port is closed; the seconds it took, None when it was
    not running."""
    pid = ctl_pid(spec)
    if pid is None:
        return None
    t0 = time.monotonic()
    # started with start_new_session: its process group id is its PID (setpriv execs java)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    try:
        wait_until(f"Puppet Server {spec['name']} (pid {pid}) to exit", lambda: _gone(pid), term_timeout, 0.1)
    except TimeoutError:
        print(f"[e2e] Puppet Server {spec['name']} (pid {pid}) ignored SIGTERM for {term_timeout}s: SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        wait_until(f"Puppet Server {spec['name']} (pid {pid}) to die", lambda: _gone(pid), 10, 0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)  # whatever it forked
    wait_until(
        f"{spec['host']}:{spec['port']} to close",
        lambda: not port_accepts(spec["port"], spec["host"]),
        30,
    )
    Path(spec["pidfile"]).unlink(missing_ok=True)
    return time.monotonic() - t0


def ctl_start(spec: dict, timeout: float = 300) -> float:
    """Start the master's JVM detached (its own session; the pidfile is written at once), wait
    until it is ready (restart file 1, `/status/v1/simple` running); the seconds it took."""
    if ctl_pid(spec) is not None:
        raise StackError(f"Puppet Server {spec['name']} is already running")
    if port_accepts(spec["port"], spec["host"]):
        raise StackError(f"something already listens on {spec['host']}:{spec['port']}")
    pw = pwd.getpwnam("puppet")
    restart = Path(spec["restart_file"])
    restart.write_text("0")
    os.chown(restart, pw.pw_uid, pw.pw_gid)
    t0 = time.monotonic()
    with open(spec["log"], "ab") as log:
        log.write(f"\n==== e2e: starting Puppet Server at {time.strftime('%H:%M:%S')}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            spec["cmd"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=spec["cwd"], env=spec["env"], start_new_session=True,
        )  # fmt: skip
    pidfile = Path(spec["pidfile"])
    tmp = pidfile.with_name(pidfile.name + ".tmp")
    tmp.write_text(f"{proc.pid}\n")
    os.replace(tmp, pidfile)

    def alive() -> None:
        if proc.poll() is not None:
            raise StackError(
                f"Puppet Server {spec['name']} exited (status {proc.returncode}); log tail:\n{tail(spec['log'])}"
            )

    try:
        wait_until(f"Puppet Server {spec['name']} to be ready", lambda: ctl_ready(spec), timeout, 0.25, alive)
    except BaseException:
        ctl_stop(spec)
        raise
    return time.monotonic() - t0


def stop_strays(marker: str) -> list[int]:
    """Kill (SIGKILL, by PID) every process whose command line holds ``marker`` (a master's own
    conf.d path, in the temp dir): a JVM whose pidfile never got written (a restart interrupted
    between start and pidfile). Returns the PIDs."""
    killed = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker.encode() in (d / "cmdline").read_bytes().split(b"\0") and not _gone(int(d.name)):
                os.kill(int(d.name), signal.SIGKILL)
                killed.append(int(d.name))
        except OSError:
            continue
    return killed


# -- real agents, again and again


@dataclass
class AgentRunRecord:
    agent: str
    number: int
    start: float  # time.monotonic()
    end: float
    code: int
    log: Path

    @property
    def ok(self) -> bool:
        return self.code in (0, 2)

    def overlaps(self, t0: float, t1: float) -> bool:
        return self.start < t1 and self.end > t0


class AgentLoop:
    """``puppet agent --test --noop`` as one node (its own certname, ssldir and vardir), run
    again and again through the load balancer at ``server``:``port`` until stopped. Every run
    is recorded with its exit code (0 and 2 are successes) and its log file."""

    def __init__(self, ident: Identity, workdir: Path, server: str, port: int, environment: str):
        self.ident, self.dir = ident, workdir
        self.server, self.port, self.environment = server, port, environment
        self.runs: list[AgentRunRecord] = []
        self.current: subprocess.Popen | None = None
        self.current_start: float | None = None
        self.error: BaseException | None = None
        self.cut = 0  # runs stopped by kill(): not recorded, they say nothing about the masters
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._killed = False
        self._thread = threading.Thread(target=self._loop, name=f"agent {ident.certname}", daemon=True)
        workdir.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        d = self.dir
        return [
            "puppet", "agent", "--test", "--noop",
            "--server", self.server, "--serverport", str(self.port),
            "--environment", self.environment,
            "--certname", self.ident.certname, "--ssldir", str(self.ident.ssldir),
            "--vardir", str(d / "var"), "--rundir", str(d / "run"),
            "--logdir", str(d / "log"), "--publicdir", str(d / "public"),
        ]  # fmt: skip

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        n = 0
        try:
            while not self._stop.is_set():
                n += 1
                log_path = self.dir / f"run{n:03d}.log"
                with open(log_path, "wb") as log:
                    with self._lock:
                        self.current_start = time.monotonic()
                        self.current = subprocess.Popen(
                            self.command(), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=clean_env(), start_new_session=True,
                        )  # fmt: skip
                    code = self.current.wait()
                with self._lock:
                    if self._killed:
                        self.cut += 1
                        self.current, self.current_start = None, None
                        return
                    self.runs.append(
                        AgentRunRecord(
                            self.ident.certname, n, self.current_start, time.monotonic(), code, log_path
                        )
                    )
                    self.current, self.current_start = None, None
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.error = e

    def in_flight(self) -> bool:
        with self._lock:
            return self.current is not None

    def finish(self, timeout: float = 180) -> None:
        """Let the run under way end, and start no other."""
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise StackError(f"the run of {self.ident.certname} did not end within {timeout}s")
        if self.error is not None:
            raise StackError(f"agent loop {self.ident.certname} broke: {self.error!r}")

    def kill(self) -> None:
        """Stop at once: the run under way is stopped by its PID, and not recorded."""
        self._stop.set()
        with self._lock:
            self._killed = True
            proc = self.current
        if proc is not None:
            stop_pid(proc, f"puppet agent {self.ident.certname}", term_timeout=5)
        self._thread.join(10)
