"""ops/: the alert rules (promtool), the dashboard, and a real Prometheus scraping us."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from htmqc.loopback import free_port
from htmqc.observe import Metrics, ObserveServer
from tests.observe.conftest import Scenario
from tests.observe.test_metrics import EXPOSED
from tests.services import require_tool

OPS = Path(__file__).resolve().parents[2] / "ops"
RULES = OPS / "prometheus-alerts.yml"
RULE_TESTS = OPS / "prometheus-alerts.test.yml"
DASHBOARD = OPS / "grafana-dashboard.json"
Served = tuple[Scenario, Metrics, ObserveServer]


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = require_tool("promtool", "prometheus")
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60, cwd=OPS)


def test_alert_rules_are_valid() -> None:
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 rules found" in done.stdout


def test_alert_rules_fire_when_they_should() -> None:
    done = _promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def _rules() -> dict[str, str]:
    """Each alert's text block (name -> its lines), without a YAML dependency."""
    blocks = re.split(r"\n\s*- alert: ", RULES.read_text())[1:]
    return {b.split("\n", 1)[0].strip(): b for b in blocks}


def test_alert_rules_say_what_the_brief_asks() -> None:
    rules = _rules()
    assert set(rules) == {"HtmqcConsumerLagHigh", "HtmqcErrorRateHigh",
                          "HtmqcPoisonMessages", "HtmqcContractViolation"}
    lag = rules["HtmqcConsumerLagHigh"]
    assert "(htmqc_consumer_lag) > 50000" in lag and "for: 2m" in lag
    assert 'outcome="failed"' in rules["HtmqcErrorRateHigh"]
    assert "> 0.01" in rules["HtmqcErrorRateHigh"]
    assert 'increase(htmqc_dlq_total{kind="poison"}[1h])) > 10' in rules["HtmqcPoisonMessages"]
    assert "increase(htmqc_contract_violations_total" in rules["HtmqcContractViolation"]
    assert "> 0" in rules["HtmqcContractViolation"]
    readme = (OPS / "README.md").read_text()
    assert all(name in readme for name in rules)


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def test_dashboard_covers_the_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for word in ("throughput", "lag", "in flight", "window", "latency", "dead letters",
                 "rebalances", "offsets"):
        assert word in titles, word
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    used = " ".join(_dashboard_exprs())
    for name in EXPOSED - {"htmqc_state_up"}:
        assert name.removesuffix("_bucket") in used, name


@contextmanager
def run_prometheus(target_port: int, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus on loopback scraping ``127.0.0.1:target_port`` every 0.5 s;
    yields its base URL."""
    binary = require_tool("prometheus", "prometheus")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 500ms\n  evaluation_interval: 500ms\n"
        "scrape_configs:\n  - job_name: htmqc\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{target_port}']\n"
    )
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()


@pytest.fixture
def prometheus(served: Served, tmp_path: Path) -> Iterator[tuple[str, Served]]:
    """A real Prometheus on loopback scraping the served scenario."""
    with run_prometheus(served[2].port, tmp_path) as base:
        yield base, served


def query(base: str, expr: str) -> dict:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def wait_for_series(base: str, expr: str, deadline: float) -> list[dict]:
    last: object = None
    while time.monotonic() < deadline:
        try:
            answer = query(base, expr)
            if answer["status"] == "success" and answer["data"]["result"]:
                return answer["data"]["result"]
            last = answer
        except OSError as exc:  # not listening yet
            last = exc
        time.sleep(0.3)
    raise AssertionError(f"Prometheus never answered {expr!r}: {last}")


def test_prometheus_scrapes_the_server(prometheus: tuple[str, Served]) -> None:
    base, (_, metrics, _) = prometheus
    metrics.processed("orders", 0, "succeeded", 41)
    metrics.processed("orders", 0, "failed", 1)
    result = wait_for_series(base, 'htmqc_messages_processed_total{outcome="succeeded"}',
                       time.monotonic() + 30)
    assert [(r["metric"]["topic"], r["metric"]["partition"], float(r["value"][1]))
            for r in result] == [("orders", "0", 41.0)]
    lag = wait_for_series(base, 'htmqc_consumer_lag{topic="orders",partition="0"}',
                    time.monotonic() + 10)
    assert float(lag[0]["value"][1]) == 80
    up = wait_for_series(base, 'up{job="htmqc"}', time.monotonic() + 5)
    assert float(up[0]["value"][1]) == 1
    # Every dashboard query is valid PromQL for this Prometheus.
    for expr in _dashboard_exprs():
        concrete = re.sub(r"\$\w+", ".*", expr)
        answer = query(base, concrete)
        assert answer["status"] == "success", (expr, answer)
