"""The SIGKILL duplicate measurement of the peer harness, at tiny size on the broker.

Each contender the main venv has is killed by its own meter right after the
500th handler call, restarted in the same group, and its stored effects are
audited by :func:`htmqc.audit.audit` (:mod:`benchmarks.peers.kill`). The raw
loop stores its effect before committing the offset, so the message in hand
at the kill is always stored twice; htmqc's exactly-once modes store none
twice and lose none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.peers import kill, runner
from benchmarks.peers.contenders import BY_KEY, Slot
from htmqc.broker import Broker

pytestmark = pytest.mark.broker

COUNT = 1000


def _measure(broker: Broker, key: str) -> dict[str, Any]:
    def command(slot: Slot, topic: str, n: int, group: str, out: Path,
                **options: Any) -> list[str]:
        return runner.worker_command(slot, broker.bootstrap, topic, n, group, out,
                                     timeout=60, **options)

    return kill.duplicates_after_kill(broker.bootstrap, BY_KEY[key], COUNT, 60, command,
                                      runner.spawn)


def test_raw_loop_stores_the_message_in_hand_twice(broker: Broker) -> None:
    result = _measure(broker, "raw")
    assert "error" not in result, result
    assert result["killed_after"] == COUNT // 2 and result["store"] == "SQLite effects table"
    assert result["lost"] == 0 and result["duplicates"] >= 1 and not result["audit_ok"]
    assert result["effects"] == COUNT + result["extra_effects"]
    assert result["anomalies"] == {"duplicate": result["duplicates"]}
    assert result["restart_handled"] == COUNT - COUNT // 2 + result["extra_effects"]


@pytest.mark.parametrize("key", ["htmqc_eo", "htmqc_kk"])
def test_htmqc_exactly_once_stores_every_effect_once(broker: Broker, key: str) -> None:
    result = _measure(broker, key)
    assert "error" not in result, result
    assert result["audit_ok"], result
    assert (result["effects"], result["duplicates"], result["lost"]) == (COUNT, 0, 0)
    assert result["restart_handled"] > 0  # the restart did finish the topic
    if key == "htmqc_kk":
        assert result["output_settled"] is True
