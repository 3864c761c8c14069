"""The Puppet Server driver: one real Puppet Server on HOST:8140, run by hand as user ``puppet``
from a configuration of its own in a temp dir, started, checked and stopped as a service manager
does (see ctl.py), whatever it is for. Two layouts:

* ``PuppetServer.system(dir, settings)``: the host's Puppet on 127.0.0.1 (the session's server,
  the demo's). The package's conf.d is copied and changed only where a test run must not touch
  the host: ``ssl-host`` (loopback), ``server-run-dir`` (the temp dir), logging (files in the
  temp dir). The ssldir (/var/lib/puppet/ssl) and the CA are the real ones: the first start
  creates them, as on a fresh install.
* ``PuppetServer.master(dir, name, host, certname, ca)``: a compile master of its own on a
  loopback address of its own (the whole 127.0.0.0/8 is local on Linux), with its own conf.d,
  bootstrap directory, puppet.conf, ssldir and vardir in the temp dir. One holds a throwaway CA
  made by Puppet's own tool (`puppetserver ca setup`); the others run with the CA service
  disabled, as compile masters do, with certificates that CA signed. Nothing of the host's Puppet
  (its ssldir, its CA) is touched. `pmcheck cycle` restarts one with tests/e2e/puppetserver_ctl.py.

What a test may vary (the JVM's options, the JRuby pool and the rest of puppetserver.conf's
jruby-puppet section) is a ``Tuning``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import ctl
from .clients import TLSReply, https_request, tls_context
from .pki import Identity, PuppetSettings, ca_sign
from .proc import LOOPBACK, StackError, run_checked

PUPPET_PORT = 8140
PUPPETSERVER_JAR = "/usr/share/puppetserver/puppetserver.jar"
PUPPETSERVER_CONFD = "/etc/puppet/puppetserver/conf.d"
PUPPETSERVER_SERVICES_D = "/etc/puppet/puppetserver/services.d"
JRUBY_LIB = "/usr/share/jruby/lib"
CA_SERVICE = "puppetlabs.services.ca.certificate-authority-service/certificate-authority-service"
CA_DISABLED_SERVICE = (
    "puppetlabs.services.ca.certificate-authority-disabled-service/certificate-authority-disabled-service"
)
# the restart program `pmcheck cycle` runs in the tests
CTL = Path(__file__).resolve().parent.parent / "puppetserver_ctl.py"
# The name agents use for the load balancer: /etc/hosts maps it to 127.0.0.1 on every Debian
# host, so nothing global is edited. Every master's certificate carries it as a DNS alt name.
LB_NAME = "localhost"

# --------------------------------------------------------------------------
# what a test may vary

# two JRuby instances (MAX_ACTIVE_INSTANCES) at about 512 MB each, plus the rest of the server
DEFAULT_JAVA_ARGS = (
    "-Xms1g -Xmx1536m -XX:TieredStopAtLevel=1 "
    "-Djruby.logger.class=com.puppetlabs.jruby_utils.jruby.Slf4jLogger"
)
# A pool of two, so that warming (one of two created) and busy (none free, requests
# waiting) can be seen on a 2-core machine, where Puppet Server's default is cores - 1 = 1.
MAX_ACTIVE_INSTANCES = 2
# half of DEFAULT_JAVA_ARGS: two JVMs share the machine, each with a pool of MASTER_INSTANCES
MASTER_JAVA_ARGS = (
    "-Xms512m -Xmx768m -XX:TieredStopAtLevel=1 "
    "-Djruby.logger.class=com.puppetlabs.jruby_utils.jruby.Slf4jLogger"
)
MASTER_INSTANCES = 1


@dataclass(frozen=True)
class Tuning:
    """The JVM's options, and settings of puppetserver.conf's ``jruby-puppet`` section as HOCON
    values (``max-active-instances``; ``multithreaded``, ``max-requests-per-instance``,
    ``borrow-timeout``...): a setting the shipped file has, commented out or not, is set where
    it is, another is added to the section. ``with_jruby`` makes a changed copy:
    ``session_tuning().with_jruby(multithreaded=True, max_active_instances=4)``."""

    java_args: str
    jruby: dict[str, str] = field(default_factory=dict)

    def with_jruby(self, **settings: object) -> Tuning:
        values = {
            k.replace("_", "-"): str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in settings.items()
        }
        return replace(self, jruby={**self.jruby, **values})

    @property
    def instances(self) -> int | None:
        """``max-active-instances``, None when Puppet Server picks it (cores - 1)."""
        value = self.jruby.get("max-active-instances")
        return None if value is None else int(value)


def session_tuning() -> Tuning:
    """The host's Puppet Server: PMCHECK_E2E_JAVA_ARGS (else DEFAULT_JAVA_ARGS), a pool of two."""
    java_args = os.environ.get("PMCHECK_E2E_JAVA_ARGS") or DEFAULT_JAVA_ARGS
    return Tuning(java_args, {"max-active-instances": str(MAX_ACTIVE_INSTANCES)})


def master_tuning() -> Tuning:
    """A compile master: PMCHECK_E2E_MASTER_JAVA_ARGS (else MASTER_JAVA_ARGS), a pool of one."""
    java_args = os.environ.get("PMCHECK_E2E_MASTER_JAVA_ARGS") or MASTER_JAVA_ARGS
    return Tuning(java_args, {"max-active-instances": str(MASTER_INSTANCES)})


# --------------------------------------------------------------------------
# configuration files

# auth.conf: the first rule (``allow_admin_api``); the shipped file has no rule for the admin
# API, so its last one, `puppetlabs deny all`, answers 403
ADMIN_RULE = """
    {{
        # added by tests/e2e/e2e_stack/puppetserver.py: the suite may flush the JRuby pool
        match-request: {{
            path: "/puppet-admin-api/v1/jruby-pool"
            type: path
            method: delete
        }}
        allow: [{names}]
        sort-order: 400
        name: "pmcheck e2e jruby pool flush"
    }},"""

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


def _jruby_set(conf: str, key: str, value: str) -> str:
    """puppetserver.conf with ``key: value`` in its jruby-puppet section: the line that sets it,
    commented out or not, replaced (there may be one at most), else a line added to the section."""
    m = re.search(r"(?ms)^jruby-puppet:\s*\{\n(.*?)^\}", conf)
    if m is None:
        raise StackError("puppetserver.conf has no `jruby-puppet: {...}` section")
    section, n = re.subn(rf"(?m)^(\s*)#?\s*{re.escape(key)}\s*[:=].*$", rf"\g<1>{key}: {value}", m[1])
    if n > 1:
        raise StackError(f"expected at most one `{key}` in puppetserver.conf's jruby-puppet, found {n}")
    if n == 0:
        section += f"    {key}: {value}\n"
    return conf[: m.start(1)] + section + conf[m.end(1) :]


def _log_to_workdir(confd: Path, workdir: Path) -> None:
    """Puppet Server logs through workdir/logback.xml, named in confd's global.conf."""
    (workdir / "logback.xml").write_text(LOGBACK)
    glob = confd / "global.conf"
    glob.write_text(_hocon_set(glob.read_text(), "logging-config", str(workdir / "logback.xml")))


def _chown_puppet(*paths: Path) -> None:
    pw = pwd.getpwnam("puppet")
    for p in paths:
        os.chown(p, pw.pw_uid, pw.pw_gid)


# --------------------------------------------------------------------------
# the driver


class PuppetServer:
    """One real Puppet Server on ``host``:8140 (see the module's doc for the two layouts).

    With ``own`` (a compile master): ``ca=True`` holds the CA, made by ``setup_ca``; otherwise its
    bootstrap has the CA service disabled, and ``issue_own_cert`` gets its certificate from the CA
    master. Either way its spec (ctl.py) is written to ``spec_file``: ``start``, ``stop``, ``pid``
    work from it here, and ``ctl_argv`` runs them as a separate program, as `pmcheck cycle` does.
    """

    def __init__(
        self,
        workdir: Path,
        ident: Identity,
        tuning: Tuning,
        *,
        name: str,
        host: str = LOOPBACK,
        own: bool = False,
        ca: bool = False,
        alt_names: Iterable[str] = (LB_NAME,),
        codedir: Path | None = None,
    ):
        self.dir, self.ident, self.tuning = workdir, ident, tuning
        self.name, self.host, self.own, self.ca = name, host, own, ca
        self.alt_names = list(alt_names)
        self.java_args = tuning.java_args.split()
        self.instances = tuning.instances
        self.confd = workdir / "conf.d"
        self.rundir = workdir / "run"
        self.restart_file = self.rundir / "restart"
        self.log = workdir / "puppetserver.log"
        self.access_log = workdir / "puppetserver-access.log"
        self.pidfile = workdir / "puppetserver.pid"
        self.spec_file = workdir / "ctl.json"
        # a compile master's own Puppet: its confdir, CA dir, var and log dirs, bootstrap, and code
        # dir (with a `production` environment, which Puppet Server would otherwise try to create
        # at start as user puppet): the host's /etc/puppet is left alone
        self.confdir = workdir / "puppet"
        self.puppet_conf = self.confdir / "puppet.conf"
        self.codedir = codedir or workdir / "code"
        self.cadir = workdir / "ca"
        self.vardir, self.logdir = workdir / "var", workdir / "log"
        self.bootstrap = workdir / "services.d" if own else Path(PUPPETSERVER_SERVICES_D)
        self._jvm: subprocess.Popen | None = None  # started by start(): this process's child
        self._prepare()

    @classmethod
    def system(cls, workdir: Path, settings: PuppetSettings, tuning: Tuning | None = None) -> PuppetServer:
        """The host's Puppet (its puppet.conf, ssldir and CA) on 127.0.0.1:8140."""
        return cls(workdir, settings.identity(), tuning or session_tuning(), name=f"{LOOPBACK}:{PUPPET_PORT}")

    @classmethod
    def master(
        cls, workdir: Path, name: str, host: str, certname: str, ca: bool, tuning: Tuning | None = None, **kw
    ) -> PuppetServer:
        """A compile master of its own on ``host``:8140 (``alt_names``, ``codedir``: see __init__)."""
        ident = Identity(certname, workdir / "ssl")
        return cls(workdir, ident, tuning or master_tuning(), name=name, host=host, own=True, ca=ca, **kw)

    @property
    def addr(self) -> str:
        return f"{self.host}:{PUPPET_PORT}"

    # -- configuration

    def _prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)
        if self.own:
            self._write_puppet_conf()
        shutil.copytree(PUPPETSERVER_CONFD, self.confd)
        web = self.confd / "webserver.conf"
        text = _hocon_set(web.read_text(), "ssl-host", self.host)
        text = _hocon_set(text, "ssl-port", str(PUPPET_PORT))
        (self.dir / "request-logging.xml").write_text(REQUEST_LOGGING.format(access_log=self.access_log))
        text = _hocon_set(text, "access-log-config", str(self.dir / "request-logging.xml"))
        web.write_text(text)
        text = (self.confd / "puppetserver.conf").read_text()
        dirs = {"server-run-dir": self.rundir}
        if self.own:
            dirs |= {"server-conf-dir": self.confdir, "server-code-dir": self.codedir}
            dirs |= {"server-var-dir": self.vardir, "server-log-dir": self.logdir}
        for key, value in dirs.items():
            text = _hocon_set(text, key, str(value))
        self._puppetserver_conf = text  # before the tuning: retune() starts from it again
        self._write_tuning()
        _log_to_workdir(self.confd, self.dir)
        if self.own:
            self._write_bootstrap()
        for p in [*self.confd.rglob("*"), *(self.bootstrap.rglob("*") if self.own else [])]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        if self.own:
            for d in (self.vardir, self.rundir, self.logdir):
                d.mkdir(mode=0o750)
                _chown_puppet(d)
        else:
            self.rundir.mkdir(mode=0o755, exist_ok=True)
            _chown_puppet(self.rundir)
        self.access_log.touch()
        _chown_puppet(self.access_log)
        self.spec_file.write_text(json.dumps(self.spec(), indent=2))

    def _write_tuning(self) -> None:
        text = self._puppetserver_conf
        for key, value in self.tuning.jruby.items():
            text = _jruby_set(text, key, value)
        (self.confd / "puppetserver.conf").write_text(text)

    def retune(self, tuning: Tuning) -> None:
        """Another ``Tuning`` (JVM options, jruby-puppet settings) for the next start; the server
        must be stopped."""
        if self.running():
            raise StackError(f"Puppet Server {self.name} runs: stop it before changing its tuning")
        self.tuning, self.java_args, self.instances = tuning, tuning.java_args.split(), tuning.instances
        self._write_tuning()
        self.spec_file.write_text(json.dumps(self.spec(), indent=2))

    def allow_admin_api(self, certnames: Iterable[str]) -> None:
        """auth.conf lets ``certnames`` flush the JRuby pool (``DELETE
        /puppet-admin-api/v1/jruby-pool``), which the shipped rules refuse to anyone with 403: a
        rule of its own, first in the list. Takes effect at the next start."""
        auth = self.confd / "auth.conf"
        names = ", ".join(json.dumps(n) for n in certnames)
        text, n = re.subn(
            r"(?m)^(\s*rules\s*:\s*\[)[ \t]*$",
            lambda m: m[1] + ADMIN_RULE.format(names=names),
            auth.read_text(),
        )
        if n != 1:
            raise StackError(f"expected exactly one `rules: [` line in {auth}, found {n}")
        auth.write_text(text)

    def _write_puppet_conf(self) -> None:
        self.confdir.mkdir(mode=0o755)
        for d in (self.codedir, self.codedir / "environments", self.codedir / "environments" / "production"):
            d.mkdir(mode=0o755, exist_ok=True)
        self.puppet_conf.write_text(
            "# written by tests/e2e/e2e_stack/puppetserver.py: a compile master of its own\n"
            f"[main]\ncertname = {self.ident.certname}\nssldir = {self.ident.ssldir}\n"
            # only `puppetserver ca setup` makes keys from this; 2048 bits take a second, not five
            "keylength = 2048\n"
            # no module of the host's (/usr/share/puppet/modules may hold stdlib, concat...): the
            # agents have no plugins to sync, and a run borrows a JRuby a handful of times, not
            # hundreds (one per plugin file)
            f"basemodulepath = {self.codedir}/modules\n"
            f"[server]\ncadir = {self.cadir}\n"
        )

    def _write_bootstrap(self) -> None:
        """The package's services.d, where ca.cfg names the CA service and, commented out, the
        disabled one (and other services): a master without the CA swaps the two."""
        shutil.copytree(PUPPETSERVER_SERVICES_D, self.bootstrap)
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

    def spec(self) -> dict:
        """What ctl.py (here, or in puppetserver_ctl.py) needs to start, check and stop it."""
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

    # -- certificates (a compile master of its own)

    def setup_ca(self) -> None:
        """The CA (root and intermediate) and this master's certificate, with `puppetserver ca
        setup`, offline, as on a fresh CA host."""
        if not (self.own and self.ca):
            raise StackError(f"{self.name} does not hold a CA of its own")
        run_checked(
            ["puppetserver", "ca", "setup", "--config", str(self.puppet_conf),
             "--subject-alt-names", ",".join(self.alt_names), "--ca-name", "pmcheck e2e CA"],
            "puppetserver ca setup",
        )  # fmt: skip

    def issue(self, ident: Identity, alt_names: Iterable[str] = ()) -> None:
        """A certificate for ``ident`` signed by this master's CA."""
        if not (self.own and self.ca):
            raise StackError(f"{self.name} does not hold a CA of its own")
        ca_sign(self.cadir, self.ident.ssldir, ident, alt_names)

    def issue_own_cert(self, ca_master: PuppetServer) -> None:
        """This (CA-less) master's certificate, from the CA master, readable by user puppet."""
        ca_master.issue(self.ident, self.alt_names)
        _chown_puppet(self.ident.ssldir, *self.ident.ssldir.rglob("*"))

    # -- lifecycle: by the PID in the pidfile (ctl.py), here or through puppetserver_ctl.py

    def start(self, timeout: float = 300.0) -> float:
        """Start and wait until ready; the seconds it took."""
        took, self._jvm = ctl.start(self.spec(), timeout)
        return took

    def stop(self) -> float | None:
        """Stop by PID and wait until the port is closed; the seconds it took, None when it was
        not running."""
        took = ctl.stop(self.spec())
        if self._jvm is not None:  # our child: reaped, not left a zombie
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._jvm.wait(timeout=10)
            self._jvm = None
        return took

    def pid(self) -> int | None:
        return ctl.running_pid(self.spec())

    def running(self) -> bool:
        return self.pid() is not None

    def status(self) -> TLSReply:
        return ctl.status(self.spec())

    def ctl_argv(self, action: str) -> list[str]:
        """The command line of puppetserver_ctl.py ACTION (start, stop, restart) for this server."""
        return [sys.executable, str(CTL), action, str(self.spec_file)]

    def flush_pool(self, admin: Identity, timeout: float = 30) -> TLSReply:
        """``DELETE /puppet-admin-api/v1/jruby-pool`` with ``admin``'s certificate (see
        ``allow_admin_api``), the server verified as its certname against ``admin``'s CA bundle:
        Puppet Server answers 204 at once and replaces every JRuby instance behind it."""
        ctx = tls_context(str(admin.localcacert), str(admin.hostcert), str(admin.hostprivkey))
        return https_request(
            PUPPET_PORT, self.ident.certname, ctx, "/puppet-admin-api/v1/jruby-pool", method="DELETE",
            host=self.host, timeout=timeout,
        )  # fmt: skip

    def pool(self) -> dict | None:
        """The JRuby pool as it reports it (``status.experimental.metrics`` of ``jruby-metrics``),
        or None while it does not answer."""
        ctx = tls_context(str(self.ident.localcacert))
        try:
            r = https_request(
                PUPPET_PORT, self.ident.certname, ctx, "/status/v1/services/jruby-metrics?level=debug",
                host=self.host, timeout=5,
            )  # fmt: skip
            return json.loads(r.body)["status"]["experimental"]["metrics"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
