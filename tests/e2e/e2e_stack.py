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
import threading
import time
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


# --------------------------------------------------------------------------
# small utilities


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
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
        text, n = re.subn(
            r"(?m)^(\s*)#?\s*max-active-instances\s*[:=].*$",
            rf"\g<1>max-active-instances: {MAX_ACTIVE_INSTANCES}",
            text,
        )
        if n != 1:
            raise StackError(f"expected one `max-active-instances` in puppetserver.conf, found {n}")
        ps.write_text(text)
        (self.dir / "logback.xml").write_text(LOGBACK)
        glob = self.confd / "global.conf"
        glob.write_text(_hocon_set(glob.read_text(), "logging-config", str(self.dir / "logback.xml")))
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
def slow_environment(name: str, seconds: int):
    """A Puppet environment NAME whose catalog takes ``seconds`` to compile (``generate`` runs
    /bin/sleep on the server, holding a JRuby instance), created in the host's environmentpath
    and removed afterwards, with any directory it had to create."""
    env = ENVIRONMENTS / name
    created = [d for d in (ENVIRONMENTS.parent, ENVIRONMENTS) if not d.exists()]
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
        self, state_dir: Path, *extra: str, env: dict[str, str] | None = None, name: str = "serve"
    ) -> PmcheckServe:
        d = PmcheckServe(self, state_dir, list(extra), env, self.dir / f"pmcheck-{name}.log")
        self.daemons.append(d)
        d.start()
        return d

    def stop_all(self) -> None:
        for d in self.daemons:
            d.stop()


class PmcheckServe:
    def __init__(self, pm: Pmcheck, state_dir: Path, extra: list[str], env, log: Path):
        self.pm = pm
        self.state_dir = state_dir
        self.extra = extra
        self.env = env if env is not None else clean_env(RUST_LOG=os.environ.get("RUST_LOG", "info"))
        self.log = log
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def listen(self) -> str:
        return f"{LOOPBACK}:{self.port}"

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
            http_request(self.port, timeout=2)
            return True
        except OSError:
            return False

    def get(self, path: str = "/", **kw) -> Reply:
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
) -> tuple[str, str, list[str]]:
    """Turn packaging/haproxy/pmcheck.cfg into a loopback-only config.

    * every ``bind`` gets the loopback address and ``frontend_port``;
    * every active ``server`` line gets ``backend_addr`` and ``check port <check_port>``;
    * its ``agent-port`` becomes ``agent_port`` (without one, a free port nothing listens on:
      HAProxy then changes nothing for the agent, and the HTTP check decides alone);
    * with ``timing`` (``"inter 300ms rise 2 fall 2"``, ``"... agent-inter 300ms"``: pairs of a
      keyword the shipped line has and a value) those keywords of the server lines are replaced
      by it, the others are kept as shipped.
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
        rest, n = re.subn(r"(?<![\w-])port\s+\d+", f"port {check_port}", rest)
        if n != 1:
            raise StackError(f"server line without exactly one `port N`: {m[0]!r}")
        rest, n = re.subn(r"\bagent-port\s+\d+", f"agent-port {agent}", rest)
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
        return f"{m['indent']}server {m['name']} {backend_addr}{rest}"

    out = SERVER_LINE.sub(fix_server, out)
    if not names:
        raise StackError("packaging/haproxy/pmcheck.cfg has no active `server` line")
    backends = re.findall(r"(?m)^backend\s+(\S+)", out)
    if len(backends) != 1:
        raise StackError(f"expected exactly one backend in the shipped HAProxy file, found {backends}")
    # nothing in it may point anywhere but loopback
    for m in re.finditer(r"(?m)^\s*(bind|server)\s.*$", out):
        if LOOPBACK not in m[0]:
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
