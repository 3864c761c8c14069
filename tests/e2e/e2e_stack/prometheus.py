"""Debian's Prometheus server, scraping pmcheck (one or several) with the shipped alert rules, asked
through its HTTP API."""

from __future__ import annotations

import subprocess
import urllib.parse
from pathlib import Path

from .clients import Reply, http_request
from .proc import LOOPBACK, StackError, clean_env, free_port, stop_pid, tail, wait_until

PROMETHEUS_CONFIG = """\
# written by tests/e2e/e2e_stack/prometheus.py: a throwaway Prometheus scraping pmcheck
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - {rules}
scrape_configs:
  - job_name: pmcheck
    static_configs:
      - targets: [{targets}]
"""


class Prometheus:
    """Debian's Prometheus server on a free loopback port, scraping ``target`` (one address, or
    several: the masters of one job) every second with the shipped alert rules; its data in the
    test's dir. Stopped by PID."""

    def __init__(self, workdir: Path, target: str | list[str], rules: Path):
        self.dir = workdir / "prometheus"
        self.dir.mkdir(mode=0o755, exist_ok=True)
        self.cfg = self.dir / "prometheus.yml"
        self.log = self.dir / "prometheus.log"
        targets = [target] if isinstance(target, str) else target
        self.cfg.write_text(
            PROMETHEUS_CONFIG.format(rules=rules, targets=", ".join(f'"{t}"' for t in targets))
        )
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

    def alerts(self, name: str) -> list[dict]:
        """The alerts named ``name``, pending or firing: each with its ``labels`` and ``state``."""
        return [a for a in self.api("alerts")["alerts"] if a["labels"].get("alertname") == name]

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc, "prometheus", term_timeout=20)
