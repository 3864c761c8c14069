"""pmcheck's /metrics as the real Prometheus server sees it (Debian's prometheus package).

One Prometheus scrapes one pmcheck every second with the shipped alert rules loaded. The
test asks Prometheus's HTTP API, not pmcheck, for the verdict and Puppet Server's pool, and
follows them through a drain, an undrain and a stop of the real Puppet Server. `promtool
check metrics` lints pmcheck's scrape in each state. It runs after the capacity test and
leaves Puppet Server stopped: the rolling-restart test after it needs 127.0.0.1:8140 free, and
the `puppetserver` fixture starts it again for anything else.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import time

import pytest

import e2e_stack as st
from conftest import record

# CI runs it on Debian 13, where one Puppet Server serves all of these (conftest.py).
pytestmark = pytest.mark.ci_on("debian13")


def promtool_check_metrics(serve: st.PmcheckServe, state: str) -> None:
    scrape = serve.get("/metrics")
    assert scrape.status == 200, scrape
    assert scrape.headers["content-type"].startswith("text/plain; version=0.0.4"), scrape.headers
    lint = subprocess.run(
        ["promtool", "check", "metrics"], input=scrape.body, capture_output=True, text=True, timeout=30
    )
    said = (lint.stdout + lint.stderr).strip()
    assert lint.returncode == 0 and not said, f"promtool on the {state} scrape: {said}\n{scrape.body}"


def openssl_date(*args: str) -> int:
    """`openssl x509 -enddate` / `openssl crl -nextupdate`: `notAfter=Nov 20 10:00:00 2031 GMT`."""
    out = subprocess.run(["openssl", *args, "-noout"], capture_output=True, text=True, timeout=30, check=True)
    text = out.stdout.strip().split("=", 1)[1]
    when = datetime.datetime.strptime(text, "%b %d %H:%M:%S %Y %Z")
    return int(when.replace(tzinfo=datetime.UTC).timestamp())


def certificate_dates_match_openssl(pmcheck: st.Pmcheck, serve: st.PmcheckServe) -> None:
    """The real Puppet Server's certificates and CRL, as pmcheck's /metrics dates them, are
    the dates openssl reads from the files `pmcheck config` names."""
    config = pmcheck.run("config")
    assert config.returncode == 0, config.stderr
    paths = {line.split()[0]: line.split()[1] for line in config.stdout.splitlines() if line.split()}
    want = {
        'pmcheck_certificate_expiry_timestamp_seconds{file="hostcert",position="leaf"}': openssl_date(
            "x509", "-enddate", "-in", paths["hostcert"]
        ),
    }
    with open(paths["localcacert"]) as f:
        if f.read().count("BEGIN CERTIFICATE") == 1:
            series = 'pmcheck_certificate_expiry_timestamp_seconds{file="localcacert",position="root"}'
            want[series] = openssl_date("x509", "-enddate", "-in", paths["localcacert"])
    crl = paths["hostcrl"]
    assert os.path.exists(crl), f"the real master's CRL {crl} (from `pmcheck config`) is missing"
    want["pmcheck_crl_next_update_timestamp_seconds"] = openssl_date("crl", "-nextupdate", "-in", crl)
    got = {}
    for line in serve.get("/metrics").body.splitlines():
        name, _, value = line.rpartition(" ")
        if name in want:
            got[name] = int(float(value))
    assert got == want, f"pmcheck's dates {got} are not openssl's {want}"
    record("certificate dates, as openssl reads them", ", ".join(f"{k} {v}" for k, v in want.items()))


def test_prometheus_follows_a_drain_and_a_stop(pmcheck, puppetserver, prometheus, testdir):
    state = testdir / "state"
    serve = pmcheck.serve(state, "--interval", "500ms")
    serve.wait_verdict(200)
    promtool_check_metrics(serve, "healthy")
    certificate_dates_match_openssl(pmcheck, serve)
    prom = prometheus(serve.listen)

    def wait(what: str, promql: str, pred, timeout: float = 30) -> float:
        value, took = st.wait_until(
            f"Prometheus: {what} ({promql})",
            lambda: (v := prom.value(promql)) is not None and pred(v) and (v,),
            timeout, interval=0.25, alive=prom.check_alive,
        )  # fmt: skip
        return value[0]

    wait("pmcheck scraped", 'up{job="pmcheck"}', lambda v: v == 1)
    wait("the verdict OK", 'pmcheck_verdict{verdict="OK"}', lambda v: v == 1)
    size = puppetserver.pool()["num-jrubies"]
    assert wait("the pool's size", "pmcheck_puppetserver_jruby_pool_size", lambda v: v == size) == size
    free = wait("the free JRubies", "pmcheck_puppetserver_jruby_free", lambda v: 0 <= v <= size)
    record("Prometheus: Puppet Server's pool", f"size {size}, free {free:.0f}")
    groups = prom.api("rules")["groups"]
    rules = sorted((r["name"], r["health"]) for g in groups for r in g["rules"])
    names = (
        ["PmcheckAgentCheckUnreachable"]
        + ["PmcheckCertificateExpiresSoon"] * 2
        + ["PmcheckCodeDiverged"] * 2
        + ["PmcheckCrlStale"]
        + ["PmcheckDrainedTooLong"] * 2
        + [
            "PmcheckNoHealthyCompileMaster",
            "PmcheckPoolSaturated",
            "PmcheckProbeFailing",
        ]
    )
    assert rules == [(name, "ok") for name in names], rules

    # a drain: DRAINED and drained in Prometheus, with the drain's start
    t0 = time.monotonic()
    drained_at = time.time()
    assert pmcheck.run("drain", "--reason", "e2e prometheus", "--state-dir", str(state)).returncode == 0
    wait("the verdict DRAINED", 'pmcheck_verdict{verdict="DRAINED"}', lambda v: v == 1)
    record("drain -> Prometheus sees DRAINED (scrape_interval 1s)", f"{time.monotonic() - t0:.2f}s")
    assert prom.value('pmcheck_verdict{verdict="OK"}') == 0
    wait("drained", "pmcheck_drained", lambda v: v == 1)
    started = wait("the drain's start", "pmcheck_drain_started_timestamp_seconds", lambda v: v > 0)
    assert abs(started - drained_at) < 5, (started, drained_at)
    promtool_check_metrics(serve, "drained")

    assert pmcheck.run("undrain", "--state-dir", str(state)).returncode == 0
    wait("the verdict OK again", 'pmcheck_verdict{verdict="OK"}', lambda v: v == 1)
    wait("not drained", "pmcheck_drained", lambda v: v == 0)

    # Puppet Server stopped: DOWN, failures by cause, no pool, the alert pending
    t0 = time.monotonic()
    puppetserver.stop()
    wait("the verdict DOWN", 'pmcheck_verdict{verdict="DOWN"}', lambda v: v == 1)
    record(
        "Puppet Server stopped -> Prometheus sees DOWN",
        f"{time.monotonic() - t0:.2f}s after the stop returned",
    )
    wait("refused probes", 'pmcheck_probe_failures_total{cause="refused"}', lambda v: v >= 1)
    st.wait_until(
        "the pool series to go stale in Prometheus",
        lambda: prom.value("pmcheck_puppetserver_jruby_pool_size") is None,
        30, interval=0.25, alive=prom.check_alive,
    )  # fmt: skip
    assert prom.value('pmcheck_probe_failures_total{cause="tls"}') == 0
    alerts, took = st.wait_until(
        "PmcheckNoHealthyCompileMaster pending",
        lambda: {
            a["labels"]["alertname"]: a["state"]
            for a in prom.api("alerts")["alerts"]
            if a["labels"]["alertname"] == "PmcheckNoHealthyCompileMaster"
        },
        30, interval=0.25, alive=prom.check_alive,
    )  # fmt: skip
    record("Prometheus: alerts after the stop", repr(alerts))
    assert alerts["PmcheckNoHealthyCompileMaster"] in ("pending", "firing"), alerts
    promtool_check_metrics(serve, "down")
