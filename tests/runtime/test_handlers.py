"""The handler: its signature checked against the mode, ``async def`` run, a
coroutine returned from a plain ``def`` refused (no broker)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections import defaultdict
from typing import Any

import pytest

from htmqc.errors import UsageError
from htmqc.runtime import Engine, RunOptions
from htmqc.runtime.handlers import (
    EventLoopThread,
    HandlerMisuse,
    check_handler,
    is_async,
    synchronous,
)
from htmqc.testing import FakeConsumer, make_logs

ALO, EO = "at-least-once", "exactly-once"


def one(msg: Any) -> None: ...


def two(msg: Any, tx: Any) -> None: ...


def three(msg: Any, tx: Any, extra: Any) -> None: ...


def star(*args: Any) -> None: ...


def defaulted(msg: Any, tx: Any = None) -> None: ...


def keyword_only(msg: Any, *, tx: Any) -> None: ...


async def coro_one(msg: Any) -> None: ...


class Handlers:
    def method_one(self, msg: Any) -> None: ...

    def method_two(self, msg: Any, tx: Any) -> None: ...

    @staticmethod
    def static_two(msg: Any, tx: Any) -> None: ...


class CallOne:
    def __call__(self, msg: Any) -> None: ...


class AsyncCallTwo:
    async def __call__(self, msg: Any, tx: Any) -> None: ...


FITS = {
    ALO: [one, star, defaulted, Handlers().method_one, CallOne(), functools.partial(two, tx=1),
          functools.partial(three, 1, 2), coro_one, print],
    EO: [two, star, defaulted, Handlers().method_two, Handlers.static_two, AsyncCallTwo(),
         functools.partial(three, extra=3), print],
}  # fmt: skip
MISFITS = {
    ALO: [two, three, keyword_only, Handlers().method_two, AsyncCallTwo()],
    EO: [one, three, keyword_only, Handlers().method_one, CallOne(), coro_one,
         functools.partial(two, 1)],
}  # fmt: skip


@pytest.mark.parametrize("mode", [ALO, EO])
def test_handlers_that_fit_the_mode_are_accepted(mode: str) -> None:
    for handler in FITS[mode]:
        check_handler(handler, mode)


@pytest.mark.parametrize("mode", [ALO, EO])
def test_handlers_for_the_other_mode_are_one_usage_error(mode: str) -> None:
    for handler in MISFITS[mode]:
        with pytest.raises(UsageError) as caught:
            check_handler(handler, mode)
        line = caught.value.line()
        assert "cannot be called as" in line and "\n" not in line, line


def test_the_engine_checks_the_handler_too() -> None:
    consumer = FakeConsumer.from_logs(make_logs("t", 1, 1, keys=1))
    with pytest.raises(UsageError, match="cannot be called"):
        Engine(two, RunOptions(bootstrap="f:1", topic="t", group="g"), consumer)


def test_async_is_recognised_through_partials_and_call_methods() -> None:
    assert is_async(coro_one) and is_async(functools.partial(coro_one))
    assert is_async(AsyncCallTwo()) and is_async(functools.partial(AsyncCallTwo(), 1))
    assert not is_async(one) and not is_async(CallOne()) and not is_async(Handlers().method_one)


def test_the_loop_runs_coroutines_in_the_callers_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("v", default="none")
    seen: list[tuple[str, str]] = []

    async def handler(msg: str) -> str:
        await asyncio.sleep(0)
        seen.append((msg, var.get()))
        return msg.upper()

    loop = EventLoopThread()
    call = synchronous(handler, loop)
    try:

        def worker(name: str) -> None:
            var.set(name)
            assert call(name) == name.upper()

        threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b", "c")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
    finally:
        loop.close()
    assert sorted(seen) == [("a", "a"), ("b", "b"), ("c", "c")]


def test_async_handlers_run_in_key_order_and_are_committed() -> None:
    consumer = FakeConsumer.from_logs(make_logs("t", 2, 200, keys=5))
    seen: dict[tuple[int, bytes | None], list[int]] = defaultdict(list)

    async def handler(msg: Any) -> None:
        await asyncio.sleep(0)
        seen[(msg.partition(), msg.key())].append(msg.offset())

    opts = RunOptions(bootstrap="f:1", topic="t", group="g", workers=3, max_messages=400)
    engine = Engine(handler, opts, consumer)
    consumer.on_commit = engine.on_commit
    assert engine.run(install_signals=False) == 400
    assert sum(map(len, seen.values())) == 400
    assert all(v == sorted(v) for v in seen.values())
    assert {tp: c[0] for tp, c in consumer.commits.items()} == {("t", 0): 200, ("t", 1): 200}


def test_a_coroutine_returned_by_a_plain_def_stops_the_run() -> None:
    """Not a message failure (it would be retried, dead-lettered and committed
    past): the run stops with a usage error and nothing is committed."""
    consumer = FakeConsumer.from_logs(make_logs("t", 1, 10, keys=2))

    def hidden(msg: Any) -> Any:
        return coro_one(msg)

    opts = RunOptions(bootstrap="f:1", topic="t", group="g", max_messages=10)
    engine = Engine(hidden, opts, consumer)
    consumer.on_commit = engine.on_commit
    with pytest.raises(HandlerMisuse) as caught:
        engine.run(install_signals=False)
    assert "declare it async def" in caught.value.line()
    assert consumer.commits == {}
