"""The live page in a real headless Chromium: its bars say what /state.json says."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest

from htmqc.observe import Metrics, ObserveServer
from tests.observe.conftest import Scenario
from tests.services import require_tool

Served = tuple[Scenario, Metrics, ObserveServer]
SCREENSHOT = Path(__file__).resolve().parents[2] / "build" / "observe" / "state.png"


class _Bars(HTMLParser):
    """Collects each partition row's data attributes, segments, marks and figures."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict] = {}
        self.ids: dict[str, dict[str, str]] = {}
        self._row: dict | None = None
        self._field: tuple[dict, str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if "id" in a:
            self.ids[a["id"]] = a
        if "partition" in classes and "data-topic" in a:
            self._row = {"attrs": a, "segments": {}, "marks": [], "figures": {}}
            self.rows[f"{a['data-topic']}/{a['data-partition']}"] = self._row
        elif self._row is not None and "data-segment" in a:
            self._row["segments"][a["data-segment"]] = int(a["data-size"])
        elif self._row is not None and "mark" in classes:
            self._row["marks"].append((int(a["data-offset"]), a["data-state"]))
        elif self._row is not None and "data-field" in a:
            self._field = (self._row, a["data-field"])

    def handle_data(self, data: str) -> None:
        if self._field is not None:
            row, name = self._field
            row["figures"][name] = data
            self._field = None


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    browser = require_tool("chromium", "chromium")
    cmd = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=3000", *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def assert_page_matches(dom: str, doc: dict) -> None:
    """The page's DOM (as Chromium rendered it) draws exactly ``doc`` (/state.json)."""
    page = _Bars()
    page.feed(dom)
    assert page.ids["parts"] is not None
    assert set(page.rows) == {p["name"] for p in doc["partitions"]}, "every partition drawn"
    for p in doc["partitions"]:
        row = page.rows[p["name"]]
        a = row["attrs"]
        for key in ("epoch", "committed", "processed", "next"):
            assert int(a[f"data-{key}"]) == p[key], (p["name"], key)
        assert a["data-high"] == ("" if p["high"] is None else str(p["high"]))
        assert a["data-paused"] == str(p["paused"]).lower()
        assert ("paused" in a["class"].split()) == p["paused"]
        # The bar spans [committed, max(next, high)] (drawn to scale: test_page_scale).
        end = max(p["next"], p["next"] if p["high"] is None else p["high"])
        assert row["segments"] == {
            "done": p["processed"] - p["committed"],
            "window": p["next"] - p["processed"],
            "unfetched": end - p["next"],
        }
        want_marks = [(m["offset"], m["state"]) for m in p["in_flight"]]
        want_marks += [(o, "finished") for o in p["finished_above"]]
        assert row["marks"] == want_marks
        for key in ("committed", "processed", "next", "in_flight_count"):
            assert row["figures"][key] == str(p[key])
        assert row["figures"]["finished_above"] == str(len(p["finished_above"]))
        assert row["figures"]["lag"] == ("–" if p["lag"] is None else str(p["lag"]))
    assert page.ids["flow-window"]["data-window"] == str(doc["flow"]["window"])
    assert page.ids["dlq-total"]["data-total"] == str(sum(doc["dlq"].values()))


def render(url: str, tmp_path: Path) -> str:
    """The DOM of ``url`` after its scripts ran, from headless Chromium."""
    done = chromium(tmp_path, "--dump-dom", url)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow  # starts Chromium
def test_page_bars_match_state_json(served: Served, tmp_path: Path) -> None:
    _, _, server = served
    dom = render(server.url + "/state", tmp_path)
    with urllib.request.urlopen(server.url + "/state.json", timeout=5) as r:
        doc = json.loads(r.read())
    assert_page_matches(dom, doc)


@pytest.mark.slow  # starts Chromium
def test_page_screenshot(served: Served, tmp_path: Path) -> None:
    _, _, server = served
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    SCREENSHOT.unlink(missing_ok=True)
    done = chromium(tmp_path, "--window-size=1200,640", f"--screenshot={SCREENSHOT}",
                     "--hide-scrollbars", server.url + "/state")
    assert done.returncode == 0, done.stderr[-2000:]
    assert SCREENSHOT.stat().st_size > 10_000
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("path", ["/state", "/"])
def test_page_is_served_at(served: Served, path: str) -> None:
    _, _, server = served
    with urllib.request.urlopen(server.url + path, timeout=5) as r:
        assert b"htmqc" in r.read()
