"""``htmqc inspect``: the table, and one-line errors for bad or dead URLs."""

from __future__ import annotations

import threading
import time

import pytest

from htmqc.cli import main
from htmqc.cli.inspect_cmd import state_url
from htmqc.errors import UsageError
from htmqc.observe import Metrics, ObserveServer
from tests.observe.conftest import Scenario

Served = tuple[Scenario, Metrics, ObserveServer]


def _rows(out: str) -> dict[str, list[str]]:
    rows = {}
    for line in out.splitlines():
        cells = line.split()
        if cells and "/" in cells[0] and not cells[0].startswith("http"):
            rows[cells[0]] = cells[1:]
    return rows


def test_prints_the_state_table(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    scenario, _, server = served
    assert main(["inspect", "--url", server.url]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert set(rows) == set(scenario.core.snapshot())
    # epoch committed processed next high lag in-flight out-of-order status
    assert rows["orders/0"] == ["1", "120", "130", "160", "200", "80", "27", "3", "running"]
    assert rows["orders/1"] == ["2", "40", "40", "50", "80", "40", "5", "0", "paused"]
    assert rows["audit.events/3"] == ["3", "7", "7", "7", "–", "–", "0", "0", "running"]
    assert "window 1050" in out and "failed 2, poison 1" in out


def test_accepts_the_page_or_json_url(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    _, _, server = served
    for url in (server.url + "/state", server.url + "/state.json", server.url + "/"):
        assert main(["inspect", "--url", url]) == 0
    assert capsys.readouterr().out.count("orders/0") == 3


def test_watch_refreshes_until_ctrl_c(
    served: Served, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario, _, server = served
    sleeps: list[float] = []
    real_sleep, caller = time.sleep, threading.current_thread()

    def fake_sleep(seconds: float) -> None:
        # ``time.sleep`` is patched for the whole process: a thread another test left
        # (py4j's, a server's) sleeps for real and is not counted (counting it made the
        # watch miss its third sleep and spin, which once hung a CI worker).
        if threading.current_thread() is not caller:
            real_sleep(seconds)
            return
        sleeps.append(seconds)
        if len(sleeps) == 1:  # the consumer moves on between two refreshes
            scenario.core.succeeded_many(("orders", 0), scenario.epochs[("orders", 0)],
                                         [*range(130, 140)])
        if len(sleeps) >= 3:
            raise KeyboardInterrupt

    monkeypatch.setattr("htmqc.cli.inspect_cmd.time.sleep", fake_sleep)
    assert main(["inspect", "--url", server.url, "--watch", "--interval", "0.5"]) == 130
    assert sleeps == [0.5, 0.5, 0.5]
    out = capsys.readouterr().out
    assert "142" in out  # the refreshed processed offset of orders/0


@pytest.mark.parametrize(
    ("url", "code", "words"),
    [
        ("ftp://127.0.0.1:1", 2, "is not an http URL"),
        ("127.0.0.1:9108", 2, "is not an http URL"),
        ("http://127.0.0.1:99999", 2, "invalid port"),
        ("http://127.0.0.1:1", 1, "cannot reach http://127.0.0.1:1/state.json"),
    ],
)
def test_bad_urls_give_one_line(
    url: str, code: int, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", "--url", url]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "Traceback" not in err
    assert err.startswith("htmqc: error: ")


def test_a_server_that_is_not_htmqc(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    _, _, server = served
    assert main(["inspect", "--url", server.url + "/nothing"]) == 1
    assert "answered HTTP 404" in capsys.readouterr().err
    assert main(["inspect", "--url", server.url + "/healthz/state.json"]) == 1


def test_state_url() -> None:
    assert state_url("http://h:1") == "http://h:1/state.json"
    assert state_url("http://h:1/state") == "http://h:1/state.json"
    assert state_url("https://h/x/state.json?a=1") == "https://h/x/state.json"
    with pytest.raises(UsageError):
        state_url("h:1")


def test_bad_interval(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--url", "http://127.0.0.1:1", "--interval", "0"]) == 2
    assert "--interval" in capsys.readouterr().err
