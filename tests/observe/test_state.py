"""The state document: it says exactly what the core holds."""

from __future__ import annotations

import json
import threading

from htmqc.core import ConsumerCore
from htmqc.observe import SCHEMA_VERSION, StateSource, core_state
from htmqc.observe.state import CoreStateSource, LastSnapshot
from tests.observe.conftest import AUDIT_3, ORDERS_0, ORDERS_1, Scenario


def _by_name(doc: dict) -> dict[str, dict]:
    return {p["name"]: p for p in doc["partitions"]}


def test_partitions_match_the_core_snapshot(scenario: Scenario) -> None:
    doc = scenario.source().state()
    snap = scenario.core.snapshot()
    parts = _by_name(doc)
    assert list(parts) == sorted(snap)  # sorted by (topic, partition)
    for name, want in snap.items():
        got = parts[name]
        for key in ("epoch", "next", "processed", "committed", "requested", "draining"):
            assert got[key] == want[key], (name, key)
        assert {str(m["offset"]): m["state"] for m in got["in_flight"]} == want["in_flight"]
        assert got["finished_above"] == want["finished_above"]
        assert got["in_flight_count"] == len(want["in_flight"])
        assert got["committed"] <= got["processed"] <= got["next"]


def test_figures_of_the_scenario(scenario: Scenario) -> None:
    doc = scenario.source().state()
    parts = _by_name(doc)
    o0, o1, a3 = parts["orders/0"], parts["orders/1"], parts["audit.events/3"]
    assert (o0["committed"], o0["processed"], o0["next"]) == (120, 130, 160)
    assert o0["finished_above"] == [140, 141, 150]
    assert (o0["high"], o0["lag"]) == (200, 80)
    assert (o1["processed"], o1["next"], o1["paused"]) == (40, 50, True)
    assert {m["offset"]: m["state"] for m in o1["in_flight"]} == {
        40: "Retrying", 41: "Processing", 42: "Processing", 45: "Pending", 46: "Pending"
    }
    assert (a3["high"], a3["lag"], a3["paused"]) == (None, None, False)
    assert doc["in_flight"] == o0["in_flight_count"] + 5 == 27 + 5
    assert doc["paused_partitions"] == 1
    assert doc["flow"] == {
        "window": 1050, "limit": 1050, "max_in_flight": 10_000,
        "min_window": 16, "max_window": 10_000, "paused": False,
    }
    assert doc["dlq"] == {"failed": 2, "poison": 1}
    assert doc["extra"] == {"mode": "at-least-once"}
    assert doc["version"] == SCHEMA_VERSION
    json.dumps(doc)  # JSON-ready


def test_state_follows_the_core(scenario: Scenario) -> None:
    core, e = scenario.core, scenario.epochs[ORDERS_0]
    core.succeeded_many(ORDERS_0, e, [*range(130, 140)])
    doc = _by_name(scenario.source().state())
    assert doc["orders/0"]["processed"] == 142
    assert doc["orders/0"]["finished_above"] == [150]
    core.revoked(AUDIT_3)
    assert "audit.events/3" not in _by_name(scenario.source().state())


def test_a_published_snapshot_is_a_copy_built_by_its_first_reader(scenario: Scenario) -> None:
    """``publish`` copies the core under the lock; the document, built later by the
    first reader (without the lock), shows the core as it was at ``publish``, and
    later readers share it until the next ``publish``."""
    source = scenario.source()
    snapshot = LastSnapshot(source)
    snapshot.publish()
    then = source.state()
    core, e = scenario.core, scenario.epochs[ORDERS_0]
    core.succeeded(ORDERS_0, e, 130)  # the watermark moves...
    core.revoked(AUDIT_3)  # ...and a partition goes, after the copy
    built: list[dict] = []
    with scenario.lock:  # built without the runtime's lock
        reader = threading.Thread(target=lambda: built.append(snapshot.state()), daemon=True)
        reader.start()
        reader.join(2)
    [doc] = built
    assert doc["partitions"] == then["partitions"]
    assert snapshot.state() is doc
    snapshot.publish()
    now = _by_name(snapshot.state())
    assert now["orders/0"]["in_flight_count"] == _by_name(then)["orders/0"]["in_flight_count"] - 1
    assert "audit.events/3" not in now


def test_lists_are_capped_but_counts_exact() -> None:
    core = ConsumerCore()
    e = core.assign(ORDERS_1, 0)
    core.fetched(ORDERS_1, e, range(0, 50))
    doc = core_state(core, max_offsets=10, now=5.0)
    p = doc["partitions"][0]
    assert len(p["in_flight"]) == 10 and p["in_flight_count"] == 50 and p["truncated"]
    assert doc["in_flight"] == 50 and doc["generated_at"] == 5.0
    assert doc["flow"] is None and doc["dlq"] == {}


def test_source_reads_under_the_runtime_lock(scenario: Scenario) -> None:
    source = scenario.source()
    assert isinstance(source, StateSource)
    done = threading.Event()
    with scenario.lock:
        reader = threading.Thread(target=lambda: (source.state(), done.set()))
        reader.start()
        assert not done.wait(0.2), "state() must wait for the runtime's lock"
    assert done.wait(2)
    reader.join()


def test_lag_never_negative() -> None:
    core = ConsumerCore()
    core.assign(ORDERS_0, 10)
    source = CoreStateSource(core, high_watermarks=lambda: {ORDERS_0: 5})
    assert source.state()["partitions"][0]["lag"] == 0
