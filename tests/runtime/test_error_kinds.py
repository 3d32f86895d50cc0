"""``--permanent-errors`` / ``--retryable-errors``: the user's exception types."""

from __future__ import annotations

from typing import Any

import pytest

from htmqc.core.retry import FailureKind
from htmqc.errors import UsageError
from htmqc.runtime import Engine, RunOptions
from htmqc.runtime.launch import load_error_kinds
from htmqc.testing import FakeConsumer, FakeProducer, make_logs
from tests.runtime.failure_handlers import BadPayload
from tests.runtime.test_engine_unit import TOPIC


def _options(**kw: Any) -> RunOptions:
    return RunOptions(bootstrap="x:1", topic="t", group="g", **kw)


def test_names_are_loaded_and_classified() -> None:
    kinds = load_error_kinds(_options(
        permanent_errors="tests.runtime.failure_handlers:BadPayload, json:JSONDecodeError",
        retryable_errors="builtins:TimeoutError",
    ))
    assert kinds == {
        BadPayload: FailureKind.PERMANENT,
        __import__("json").JSONDecodeError: FailureKind.PERMANENT,
        TimeoutError: FailureKind.RETRYABLE,
    }


@pytest.mark.parametrize(("kw", "needle"), [
    ({"permanent_errors": "nope"}, "--permanent-errors"),
    ({"retryable_errors": "no_such_module_x:E"}, "--retryable-errors"),
    ({"permanent_errors": "json:dumps"}, "not an exception class"),
    ({"permanent_errors": "builtins:KeyError", "retryable_errors": "builtins:KeyError"},
     "both"),
])
def test_bad_names_are_one_line_usage_errors(kw: dict[str, str], needle: str) -> None:
    with pytest.raises(UsageError) as caught:
        load_error_kinds(_options(**kw))
    assert needle in caught.value.line()


def test_a_permanent_user_error_is_dead_lettered_on_first_failure() -> None:
    calls: dict[int, int] = {}

    def handler(msg: Any) -> None:
        calls[msg.offset()] = calls.get(msg.offset(), 0) + 1
        if msg.offset() == 3:
            raise BadPayload("bad")

    consumer = FakeConsumer.from_logs(make_logs(TOPIC, 1, 10, keys=2))
    producer = FakeProducer()
    engine = Engine(
        handler,
        RunOptions(bootstrap="f:1", topic=TOPIC, group="g", max_messages=10, backoff_ms=1.0),
        consumer,
        producer_factory=lambda: producer,
        error_kinds={BadPayload: FailureKind.PERMANENT},
    )
    engine.run(install_signals=False)
    assert calls[3] == 1, "a permanent error was retried"
    assert engine.dlq_counts == {"permanent": 1}
    assert [r[0] for r in producer.records] == [f"{TOPIC}.dlq"]
