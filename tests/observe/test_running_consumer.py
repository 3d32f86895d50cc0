"""Observability of a real ``htmqc run`` process: /metrics, /state.json, the page
in Chromium and a real Prometheus, all against the same running consumer.

The handler stalls on the ids ending in 7 while a flag file exists, so the
consumer settles into a steady state with work in flight and offsets finished
out of order; everything observed must agree with /state.json then. Removing
the flag lets it finish; it then exits on its own (``--idle-exit``).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from htmqc.broker import Broker
from htmqc.loopback import free_port
from htmqc.produce import produce
from tests.observe.test_ops import run_prometheus, wait_for_series
from tests.observe.test_page import assert_page_matches, render
from tests.runtime.test_run_broker import finish, htmqc_run, wait_for

pytestmark = pytest.mark.broker
COUNT = 400


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return bytes(r.read())


def _state(base: str) -> dict[str, Any]:
    return dict(json.loads(_get(base + "/state.json")))


def _steady(base: str) -> dict[str, Any]:
    """/state.json once two reads 0.5 s apart agree on every partition."""
    deadline = time.monotonic() + 60
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        try:
            doc = _state(base)
        except OSError:
            time.sleep(0.2)
            continue
        stalled = doc["in_flight"] > 0 and doc["extra"]["finished"] > 0
        if stalled and last is not None and last["partitions"] == doc["partitions"]:
            return doc
        last = doc
        time.sleep(0.5)
    raise AssertionError(f"the consumer never settled: {last}")


@pytest.fixture
def running(broker: Broker, new_topic: Any, tmp_path: Path) -> Iterator[tuple[str, Path, Any]]:
    """A stalled at-least-once consumer with --metrics-port; yields its base URL,
    the flag file and the process."""
    topic = new_topic(partitions=2)
    produce(broker.bootstrap, topic, COUNT, keys=20)
    flag = tmp_path / "stall"
    flag.write_text("")
    port = free_port()
    log = tmp_path / "run.log"
    proc = htmqc_run(
        broker.bootstrap, topic, "tests.observe.handlers:stall_sevens",
        "--group", "g-observe", "--workers", "4", "--commit-ms", "100",
        "--metrics-port", str(port), "--idle-exit", "2", "--log-format", "json",
        env={"HTMQC_TEST_FLAG": str(flag)}, log=log,
    )
    try:
        yield f"http://127.0.0.1:{port}", flag, proc
    finally:
        flag.unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for line in log.read_text().splitlines():  # --log-format json: every line is JSON
            json.loads(line)


def test_metrics_page_and_prometheus_agree_with_the_state(
    running: tuple[str, Path, Any], tmp_path: Path
) -> None:
    base, flag, proc = running
    doc = _steady(base)
    parts = doc["partitions"]
    assert len(parts) == 2
    assert any(p["finished_above"] for p in parts), "no out-of-order finish to show"
    assert all(p["committed"] <= p["processed"] <= p["next"] for p in parts)

    # /metrics says what /state.json says.
    families = {f.name: f for f in text_string_to_metric_families(_get(base + "/metrics").decode())}
    offsets = {
        (s.labels["partition"], s.labels["kind"]): s.value
        for s in families["htmqc_offset"].samples
    }
    for p in parts:
        for kind in ("committed", "processed", "next"):
            assert offsets[(str(p["partition"]), kind)] == p[kind]
    done = sum(
        s.value for s in families["htmqc_messages_processed"].samples
        if s.name.endswith("_total") and s.labels["outcome"] == "succeeded"
    )
    assert done == doc["extra"]["finished"]
    in_flight = [s.value for s in families["htmqc_in_flight"].samples]
    assert in_flight == [doc["in_flight"]]
    latency = {s.name: s.value for s in families["htmqc_processing_latency_seconds"].samples}
    assert latency["htmqc_processing_latency_seconds_count"] == done

    # The page, rendered by Chromium, draws the same state.
    assert_page_matches(render(base + "/state", tmp_path), _state(base))

    # A real Prometheus scrapes the running consumer.
    with run_prometheus(int(base.rsplit(":", 1)[1]), tmp_path) as prom:
        series = wait_for_series(
            prom, 'sum(htmqc_messages_processed_total{outcome="succeeded"})',
            time.monotonic() + 30,
        )
        assert float(series[0]["value"][1]) == done

    flag.unlink()
    assert finish(proc, 60) == 0
    wait_for(lambda: proc.poll() is not None, 5, "exit")
