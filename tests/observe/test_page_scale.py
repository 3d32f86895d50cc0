"""The state page's bars are drawn to scale, with an axis; partitions sort by lag;
health and the circuit breaker are shown (issue 19, item 6).

Users saw committed 4326, processed 4349, next 4360 drawn as 12% / 60% / 28%:
a fixed lead for "below committed" and no axis. Here the real
:class:`~htmqc.observe.ObserveServer` serves a fixed ``/state.json`` (a stub
source, a stub health) to a real headless Chromium, and the test reads where the
page *drew* things (``getBoundingClientRect`` over the DevTools protocol,
:mod:`tests.observe.cdp`) and compares that with what it computes from the
offsets itself, never from what the page wrote in its attributes.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from htmqc.observe import ObserveServer
from tests.observe.cdp import Chromium

#: Largest allowed difference between a drawn and a computed length or position.
PIXEL = 1.0


def part(topic: str, partition: int, committed: int, processed: int, next_: int,
         high: int | None, *, in_flight: tuple[tuple[int, str], ...] = (),
         finished: tuple[int, ...] = (), paused: bool = False) -> dict[str, Any]:
    """One partition entry of the state document (schema: htmqc.observe.state)."""
    return {
        "topic": topic, "partition": partition, "name": f"{topic}/{partition}", "epoch": 1,
        "committed": committed, "requested": committed, "processed": processed,
        "next": next_, "high": high,
        "lag": None if high is None else max(0, high - committed),
        "draining": False, "paused": paused, "in_flight_count": len(in_flight),
        "in_flight": [{"offset": o, "state": s} for o, s in in_flight],
        "finished_above": list(finished), "truncated": False,
    }


PARTITIONS = [
    # The example, with a high watermark: lag 74.
    part("clicks", 0, 4326, 4349, 4360, 4400,
         in_flight=((4349, "Processing"), (4352, "Failed")), finished=(4350, 4351)),
    # Lag 1,000,000: the first two segments are far under a pixel (a ▲ each).
    part("clicks", 1, 40, 41, 50, 1_000_040, in_flight=((41, "Pending"),)),
    # Caught up: nothing between committed and high (lag 0).
    part("clicks", 2, 7, 7, 7, 7),
    # High watermark unknown: the bar ends at next, lag unknown (sorts last).
    part("orders", 0, 100, 130, 160, None, in_flight=((130, "Processing"),), paused=True),
    # Lag 74 too: ties keep the (topic, partition) order.
    part("orders", 1, 0, 0, 0, 74),
]
DEFAULT_ORDER = [p["name"] for p in PARTITIONS]
BY_LAG_DESC = ["clicks/1", "clicks/0", "orders/1", "clicks/2", "orders/0"]
BY_LAG_ASC = ["clicks/2", "clicks/0", "orders/1", "clicks/1", "orders/0"]

OPEN_BREAKER = {
    "state": "Open", "reason": "consecutive", "error_class": "app.errors.DbDown",
    "trips": 2, "backoff": 2.0, "held_for": 1.5, "streak": 10,
    "window_calls": 20, "window_failures": 12,
}


def document(breaker: dict[str, Any] | None = None) -> dict[str, Any]:
    """The fixed state document the stub source serves."""
    extra: dict[str, Any] = {"mode": "at-least-once"}
    if breaker is not None:
        extra["breaker"] = breaker
    return {
        "version": 1, "generated_at": 1_763_850_000.25, "started_at": 1_763_849_000.0,
        "partitions": copy.deepcopy(PARTITIONS),
        "in_flight": sum(p["in_flight_count"] for p in PARTITIONS),
        "paused_partitions": sum(p["paused"] for p in PARTITIONS),
        "flow": None, "dlq": {}, "extra": extra,
    }


class FixedSource:
    """A state source serving ``doc``; counts the reads (each page refresh is one)."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.reads = 0
        self._lock = threading.Lock()

    def state(self) -> dict[str, Any]:
        with self._lock:
            self.reads += 1
            return self.doc


class FixedHealth:
    """A ``Health`` whose answers the test sets."""

    def __init__(self) -> None:
        self.live_answer: tuple[bool, str] = (True, "")
        self.ready_answer: tuple[bool, str] = (True, "")

    def live(self) -> tuple[bool, str]:
        return self.live_answer

    def ready(self) -> tuple[bool, str]:
        return self.ready_answer


def serve(source: FixedSource, health: FixedHealth | None = None) -> ObserveServer:
    server = ObserveServer(source=source, request_timeout=1.0, health=health)
    server.start()
    return server


@pytest.fixture
def page(tmp_path: Path) -> Iterator[tuple[Chromium, FixedSource]]:
    """Chromium on /state of a server with the fixed document (no health)."""
    source = FixedSource(document())
    server = serve(source)
    try:
        with Chromium(server.url + "/state", tmp_path / "profile") as browser:
            browser.wait_for("document.body.dataset.loaded === 'true'")
            yield browser, source
    finally:
        server.stop()


# Everything drawn for each row, in the order the rows are shown.
MEASURE = """
(() => [...document.querySelectorAll('#parts .partition')].map((row) => {
  const box = (e) => { const r = e.getBoundingClientRect();
                       return {left: r.left, right: r.right, width: r.width}; };
  const bar = row.querySelector('.bar');
  return {
    name: row.querySelector('.pname').textContent,
    bar: box(bar),
    segments: Object.fromEntries([...bar.querySelectorAll('.seg')]
      .map((s) => [s.dataset.segment, box(s)])),
    ticks: [...row.querySelectorAll('.axis .tick')].map((t) => ({
      end: t.classList.contains('lo') ? 'lo' : t.classList.contains('hi') ? 'hi' : null,
      label: t.textContent, x: t.getBoundingClientRect().left,
      text: box(t.querySelector('span'))})),
    tiny: [...row.querySelectorAll('.tiny')].map((t) => [t.dataset.tiny, box(t)]),
    marks: [...row.querySelectorAll('.mark')].map((m) => [Number(m.dataset.offset), box(m)]),
    nums: Object.fromEntries([...row.querySelectorAll('[data-num]')]
      .map((n) => [n.dataset.num, n.textContent])),
    numsBox: box(row.querySelector('.nums')),
  };
}))()
"""


def order(browser: Chromium) -> list[str]:
    return list(browser.evaluate(
        "[...document.querySelectorAll('#parts .partition .pname')].map((e) => e.textContent)"
    ))


@pytest.mark.slow  # starts Chromium
def test_bars_are_to_scale_with_an_axis(page: tuple[Chromium, FixedSource]) -> None:
    browser, _ = page
    rows = {r["name"]: r for r in browser.evaluate(MEASURE)}
    assert list(rows) == DEFAULT_ORDER
    for p in PARTITIONS:
        row = rows[p["name"]]
        lo = p["committed"]
        hi = max(p["next"], p["next"] if p["high"] is None else p["high"])
        span = hi - lo
        bar = row["bar"]
        assert bar["width"] > 500, "a bar as wide as the page allows"

        def x(offset: int, bar: dict[str, float] = bar, lo: int = lo, span: int = span) -> float:
            return bar["left"] + (bar["width"] * (offset - lo) / span if span else 0.0)

        # Each segment starts and ends where its offsets are on the bar's scale.
        want = {"done": (p["committed"], p["processed"]), "window": (p["processed"], p["next"]),
                "unfetched": (p["next"], hi)}
        assert set(row["segments"]) == set(want), p["name"]
        for seg, (a, b) in want.items():
            got = row["segments"][seg]
            assert got["left"] == pytest.approx(x(a), abs=PIXEL), (p["name"], seg)
            assert got["width"] == pytest.approx(x(b) - x(a), abs=PIXEL), (p["name"], seg)
        if span:
            drawn = sum(s["width"] for s in row["segments"].values())
            assert drawn == pytest.approx(bar["width"], abs=PIXEL), "segments fill the bar"
        # The axis: its end labels are the range's ends, at the bar's ends; inner
        # ticks sit at their offsets; no two labels overlap.
        ends = {t["end"]: t for t in row["ticks"] if t["end"]}
        assert ends["lo"]["label"] == str(lo)
        assert ends["lo"]["x"] == pytest.approx(bar["left"], abs=PIXEL)
        if span:
            assert ends["hi"]["label"] == str(hi)
            assert ends["hi"]["x"] == pytest.approx(bar["right"], abs=PIXEL)
        else:
            assert set(ends) == {"lo"}, "an empty range has one end"
        for t in row["ticks"]:
            if t["end"] is None:
                offset = int(t["label"])
                assert lo < offset < hi
                assert t["x"] == pytest.approx(x(offset), abs=PIXEL), (p["name"], offset)
        labels = sorted((t["text"] for t in row["ticks"]), key=lambda b: b["left"])
        for left, right in itertools.pairwise(labels):
            assert left["right"] <= right["left"], (p["name"], "axis labels overlap")
        # In-flight and finished-out-of-order marks sit at their offsets.
        for offset, box in row["marks"]:
            assert box["left"] == pytest.approx(x(offset), abs=PIXEL), (p["name"], offset)
        # The numbers, written to the right of the bar.
        assert row["nums"] == {
            "done": str(p["processed"] - p["committed"]),
            "window": str(p["next"] - p["processed"]),
            "unfetched": str(hi - p["next"]),
            "lag": "–" if p["lag"] is None else str(p["lag"]),
        }
        assert row["numsBox"]["left"] >= bar["right"]

    # The example: 23 / 11 / 40 of 74, not 12% / 60% / 28%.
    seg = rows["clicks/0"]["segments"]
    width = rows["clicks/0"]["bar"]["width"]
    for name, size in (("done", 23), ("window", 11), ("unfetched", 40)):
        assert seg[name]["width"] == pytest.approx(width * size / 74, abs=PIXEL)
    # Segments too short to see are drawn to scale (not widened) and marked by a ▲
    # at their start; the others are not marked.
    tiny = rows["clicks/1"]
    assert [name for name, _ in tiny["tiny"]] == ["done", "window"]
    for name, box in tiny["tiny"]:
        assert tiny["segments"][name]["width"] < PIXEL
        centre = box["left"] + box["width"] / 2
        assert centre == pytest.approx(tiny["segments"][name]["left"], abs=PIXEL)
    assert all(not rows[n]["tiny"] for n in rows if n != "clicks/1")
    # The page states its scale.
    note = browser.evaluate("document.getElementById('scale-note').textContent")
    assert "one per partition" in note and "proportional" in note


def wait_order(browser: Chromium, want: list[str]) -> None:
    """Wait until the rows are shown in ``want``'s order (or fail with the last one)."""
    shown = json.dumps(json.dumps(want, separators=(",", ":")))
    try:
        browser.wait_for(
            "JSON.stringify([...document.querySelectorAll('#parts .pname')]"
            f".map((e) => e.textContent)) === {shown}", timeout=5,
        )
    except AssertionError:
        assert order(browser) == want


@pytest.mark.slow  # starts Chromium
def test_sorting_by_lag_reorders_rows(page: tuple[Chromium, FixedSource]) -> None:
    browser, source = page
    assert order(browser) == DEFAULT_ORDER
    browser.click("#sort-lag")
    wait_order(browser, BY_LAG_DESC)
    # The order survives the page's refreshes (one a second).
    reads = source.reads
    deadline = time.monotonic() + 10
    while source.reads < reads + 2:
        assert time.monotonic() < deadline, "the page stopped refreshing"
        time.sleep(0.1)
    assert order(browser) == BY_LAG_DESC
    browser.click("#sort-lag")
    wait_order(browser, BY_LAG_ASC)
    assert browser.evaluate("document.getElementById('sort-lag').getAttribute('aria-pressed')") \
        == "true"
    browser.click("#sort-name")
    wait_order(browser, DEFAULT_ORDER)


def health_and_breaker(browser: Chromium) -> dict[str, str]:
    return dict(browser.evaluate("""(() => {
      const t = (id) => document.getElementById(id).textContent;
      return {health: t('health'), live: t('health-live'), ready: t('health-ready'),
              healthCard: document.getElementById('health-card').className,
              breaker: t('breaker'), detail: t('breaker-detail'),
              breakerCard: document.getElementById('breaker-card').className};
    })()"""))


@pytest.mark.slow  # starts Chromium
def test_health_and_breaker_are_shown(tmp_path: Path) -> None:
    source = FixedSource(document(OPEN_BREAKER))
    health = FixedHealth()
    health.ready_answer = (False, "the circuit breaker is Open")
    server = serve(source, health)
    try:
        with Chromium(server.url + "/state", tmp_path / "profile") as browser:
            browser.wait_for("document.body.dataset.loaded === 'true'")
            got = health_and_breaker(browser)
            assert got["health"] == "not ready"
            assert got["live"] == "live: yes"
            assert got["ready"] == "not ready: the circuit breaker is Open"
            assert got["healthCard"].split() == ["card", "bad"]
            assert got["breaker"] == "Open"
            for words in ("consecutive", "app.errors.DbDown", "trips 2", "1.5 s",
                          "failures 12 of 20"):
                assert words in got["detail"], (words, got["detail"])
            assert got["breakerCard"].split() == ["card", "bad"]
            # Both follow the server on the next refresh.
            health.live_answer = (False, "the poll loop has not turned for 31.0 s")
            health.ready_answer = (True, "")
            source.doc = document({**OPEN_BREAKER, "state": "Closed", "reason": "",
                                   "error_class": None, "held_for": 0.0})
            browser.wait_for("document.getElementById('breaker').textContent === 'Closed'")
            got = health_and_breaker(browser)
            assert got["health"] == "not live"
            assert got["live"] == "not live: the poll loop has not turned for 31.0 s"
            assert got["ready"] == "ready: yes"
            assert got["breakerCard"].split() == ["card", "good"]
            assert "consecutive" not in got["detail"] and "trips 2" in got["detail"]
    finally:
        server.stop()


@pytest.mark.slow  # starts Chromium
def test_without_health_or_breaker_the_page_says_not_reported(
    page: tuple[Chromium, FixedSource],
) -> None:
    browser, _ = page
    got = health_and_breaker(browser)
    assert (got["health"], got["breaker"]) == ("–", "–")
    assert got["live"] == "live: not reported" and got["detail"] == "not reported"


def test_state_json_carries_health_asked_at_request_time() -> None:
    """``health`` is added by the server (at request time, not cached), the
    source's document is left alone, and without a ``health`` there is none."""
    doc = document(OPEN_BREAKER)
    source = FixedSource(doc)
    health = FixedHealth()
    health.ready_answer = (False, "no partitions assigned")

    def get(server: ObserveServer) -> dict[str, Any]:
        with urllib.request.urlopen(server.url + "/state.json", timeout=5) as r:
            return dict(json.loads(r.read()))

    with serve(source, health) as server:
        got = get(server)
        assert got.pop("health") == {"live": {"ok": True, "reason": ""},
                                     "ready": {"ok": False, "reason": "no partitions assigned"}}
        assert got == doc and "health" not in doc
        health.ready_answer = (True, "")
        assert get(server)["health"]["ready"] == {"ok": True, "reason": ""}
    with serve(source) as server:
        assert get(server) == doc
