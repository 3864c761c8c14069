"""What code each master serves, as the real Prometheus compares it.

Two `pmcheck serve`, each reading its own environmentpath, deployed by Debian's real r10k from
one local git control repository (`file://` remote). The real Prometheus scrapes both with the
shipped rules: while one master holds an older commit of production, PmcheckCodeDiverged is
pending; once both hold the same commit, it clears. The commits Prometheus sees are git's own.
No Puppet Server is needed: the deploy record is read whatever the verdict.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import e2e_stack as st
from conftest import record, unavailable

# CI runs it on both stacks: it needs no Puppet Server (conftest.py).
pytestmark = pytest.mark.ci_on("debian12", "debian13")

ALERT = "PmcheckCodeDiverged"


def run(cmd: list[str], cwd: Path | None = None) -> str:
    cp = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120, env=st.clean_env())
    assert cp.returncode == 0, f"{' '.join(cmd)} -> {cp.returncode}:\n{cp.stdout}{cp.stderr}"
    return cp.stdout.strip()


def commit(repo: Path, text: str) -> str:
    """A new commit of the control repository's production branch; its id."""
    (repo / "manifests" / "site.pp").write_text(f"notify {{ '{text}': }}\n")
    run(["git", "add", "-A"], cwd=repo)
    run(["git", "-c", "user.name=e2e", "-c", "user.email=e2e@example.test", "commit", "-qm", text], cwd=repo)
    return run(["git", "rev-parse", "HEAD"], cwd=repo)


class Master:
    """One master's code directory, deployed by r10k, and its puppet.conf naming it."""

    def __init__(self, testdir: Path, name: str, control: Path):
        self.dir = testdir / name
        self.environments = self.dir / "environments"
        self.environments.mkdir(parents=True)
        self.r10k_yaml = self.dir / "r10k.yaml"
        self.r10k_yaml.write_text(
            f"cachedir: {self.dir / 'cache'}\n"
            f"sources:\n  control:\n    remote: file://{control}\n    basedir: {self.environments}\n"
        )
        self.puppet_conf = self.dir / "puppet.conf"
        # A first directory without the environment: Puppet (and pmcheck) look on along the path.
        self.puppet_conf.write_text(f"[server]\nenvironmentpath = {self.dir / 'empty'}:{self.environments}\n")

    def deploy(self) -> None:
        run(["r10k", "deploy", "environment", "production", "--config", str(self.r10k_yaml)])


def test_prometheus_sees_masters_disagree_then_agree(pmcheck, prometheus, testdir):
    for program in ("r10k", "git"):
        if shutil.which(program) is None:
            unavailable(f"{program} is not installed (scripts/e2e installs Debian's r10k and git)")
    control = testdir / "control"
    (control / "manifests").mkdir(parents=True)
    run(["git", "init", "-q", "-b", "production", str(control)])
    (control / "Puppetfile").write_text("")
    first = commit(control, "first")
    a, b = Master(testdir, "a", control), Master(testdir, "b", control)
    a.deploy()
    b.deploy()
    second = commit(control, "second")
    a.deploy()
    record_text = (a.environments / "production" / ".r10k-deploy.json").read_text()
    assert f'"signature": "{second}"' in record_text, record_text

    dead = f"{st.LOOPBACK}:{st.free_port()}"
    serves = [
        pmcheck.serve(testdir / f"state-{m.dir.name}", "--puppet-conf", str(m.puppet_conf), "--puppet-addr", dead,
                      name=m.dir.name)
        for m in (a, b)
    ]  # fmt: skip
    prom = prometheus([s.listen for s in serves])

    def commits() -> dict[str, str]:
        return {
            labels.split('instance="')[1].split('"')[0]: labels.split('commit="')[1].split('"')[0]
            for labels in prom.query('pmcheck_code_info{environment="production"}')
        }

    seen, took = st.wait_until(
        "Prometheus to see both masters' commits", lambda: len(c := commits()) == 2 and c, 60,
        interval=0.25, alive=prom.check_alive,
    )  # fmt: skip
    assert seen == {serves[0].listen: second, serves[1].listen: first}, seen
    pending, took = st.wait_until(
        f"{ALERT} pending while the masters differ", lambda: prom.alerts(ALERT), 60,
        interval=0.25, alive=prom.check_alive,
    )  # fmt: skip
    assert [(x["labels"]["environment"], x["labels"]["cause"], x["state"]) for x in pending] == [
        ("production", "diverged", "pending")
    ], pending
    record("PmcheckCodeDiverged pending after both masters were scraped", f"{took:.1f}s")
    status = pmcheck.run("status", "--url", serves[1].url)
    assert f"code:   production {first[:12]} deployed " in status.stdout, status.stdout

    b.deploy()
    _, took = st.wait_until(
        f"{ALERT} to clear once both masters hold {second[:12]}",
        lambda: commits() == {s.listen: second for s in serves} and not prom.alerts(ALERT), 60,
        interval=0.25, alive=prom.check_alive,
    )  # fmt: skip
    record("PmcheckCodeDiverged cleared after the second master's deploy", f"{took:.1f}s")
    success = prom.query('pmcheck_code_deploy_success{environment="production"}')
    assert sorted(success.values()) == [1.0, 1.0], success
