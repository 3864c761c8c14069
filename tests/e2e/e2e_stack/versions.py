"""What the suite runs against: the Debian release and its real components' versions, as dpkg
says. scripts/e2e runs the suite on this machine (Debian 12: Puppet Server 7.9, HAProxy 2.6)
and, with --trixie, in a Debian 13 root (Puppet Server 8.7, HAProxy 3.0, with 3.2 and 3.4
beside it: ``haproxy.release_of`` names those); a test that meets a difference between the two
names it with these."""

from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("puppetserver", "puppet-agent", "haproxy", "xinetd", "prometheus")


@dataclass(frozen=True)
class Stack:
    """Debian's ``VERSION_ID`` and each package's upstream version ('' when not installed)."""

    debian: str
    versions: dict[str, str]

    def version(self, package: str) -> str:
        return self.versions.get(package, "")

    def release(self, package: str) -> tuple[int, int]:
        """Major and minor, (0, 0) when unknown: ``stack().release("haproxy") >= (3, 0)``."""
        m = re.match(r"(\d+)\.(\d+)", self.version(package))
        return (int(m[1]), int(m[2])) if m else (0, 0)

    @property
    def haproxy(self) -> str:
        """``HAProxy 2.6``: as the tests name the load balancer they read."""
        major, minor = self.release("haproxy")
        return f"HAProxy {major}.{minor}"

    def __str__(self) -> str:
        names = {"puppetserver": "Puppet Server", "puppet-agent": "puppet-agent", "haproxy": "HAProxy"}
        parts = [f"{label} {self.version(p)}" for p, label in names.items() if self.version(p)]
        return f"Debian {self.debian or '?'} ({', '.join(parts)})"


def _upstream(version: str) -> str:
    """``1:2.6.12-1+deb12u2`` -> ``2.6.12``."""
    return version.split(":", 1)[-1].rsplit("-", 1)[0]


@functools.cache
def stack() -> Stack:
    """This machine's (or this root's) stack, read once."""
    debian = ""
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_ID="):
                debian = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    versions: dict[str, str] = {}
    for package in PACKAGES:
        try:
            out = subprocess.run(
                ["dpkg-query", "-W", "-f", "${db:Status-Status} ${Version}", package],
                capture_output=True, text=True, timeout=30,
            ).stdout  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            continue
        status, _, version = out.partition(" ")
        if status == "installed":
            versions[package] = _upstream(version)
    return Stack(debian, versions)
