"""The user's handler: checked against the mode before the first poll, and
called the same way whether it is ``def`` or ``async def``.

Theory of operation
-------------------
At-least-once calls ``handler(msg)``; exactly-once calls ``handler(msg, tx)``
with the open sink transaction's handle. :func:`check_handler` binds that many
positional arguments to the handler's signature (:func:`inspect.signature`
follows ``functools.partial``, bound methods and callable objects, and
``*args`` and defaults count) before anything connects, so a handler written
for the other mode is one usage error (exit 2), not a stream of dead letters.
A callable without a readable signature (some builtins) is accepted.

``async def`` handlers (also a ``partial`` of one, or an object with an
``async def __call__``) run on one event loop shared by every worker, in its
own daemon thread (:class:`EventLoopThread`). The worker thread that called
waits for its call's result, so nothing changes for ordering: a key's messages
still run one after the other on their lane, and an exactly-once handler still
runs inside its message scope, on the transaction's connection, one at a time.
Why one shared loop rather than one per worker: async clients (HTTP sessions,
connection pools) are bound to the loop that created them, so a handler that
keeps one client in a module global would fail on every loop but the first. The
coroutine runs in a copy of the calling worker's :mod:`contextvars` context,
which is how a sink's message scope (:mod:`htmqc.sinks.kafka`) follows it.

An exactly-once ``async def`` handler's ``tx``: the engine offers the loop to
the sink (:meth:`htmqc.ports.Sink.serve_async_handler`) before the first claim.
The PostgreSQL sink takes it: its connection becomes a
``psycopg.AsyncConnection`` on this loop and ``tx`` a ``psycopg.AsyncCursor``
(:class:`htmqc.ports.AsyncSqlTx`, awaited), in the same transaction as the
positions (:mod:`htmqc.sinks.loop_bridge`). SQLite and Kafka keep their
synchronous handle (a quick in-process cursor; ``send`` only queues).

A ``def`` handler that returns an awaitable anyway (a lambda around a
coroutine function, a decorator that hid ``async``) would have its work
silently skipped; the lanes check the result and stop the run with
:class:`HandlerMisuse`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from concurrent.futures import Future
from typing import Any

from htmqc.errors import UsageError
from htmqc.runtime.options import EXACTLY_ONCE
from htmqc.runtime.retry_topic import retry_topic

#: What a retry topic's name adds to its source topic's.
RETRY_SUFFIX = retry_topic("")

#: The arguments each mode passes, for the error messages.
_CALLS = {EXACTLY_ONCE: "handler(msg, tx)"}
_DEFAULT_CALL = "handler(msg)"


class HandlerMisuse(UsageError):
    """The handler does not fit the way the runtime calls it (found while running)."""


def arity(mode: str) -> int:
    """How many positional arguments ``mode`` passes to the handler."""
    return 2 if mode == EXACTLY_ONCE else 1


def describe(handler: Callable[..., Any]) -> str:
    """A short name of ``handler`` for messages."""
    target = handler.func if isinstance(handler, functools.partial) else handler
    module = getattr(target, "__module__", None) or "?"
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}:{name}"


def check_handler(handler: Callable[..., Any], mode: str) -> None:
    """Refuse a handler that cannot take the arguments ``mode`` passes (module docs).

    :raises UsageError: the signature does not bind ``(msg)`` / ``(msg, tx)``.
    """
    call = _CALLS.get(mode, _DEFAULT_CALL)
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        return  # no signature to read (a builtin): the first call will tell
    try:
        signature.bind(*([None] * arity(mode)))
    except TypeError as exc:
        other = _DEFAULT_CALL if mode == EXACTLY_ONCE else _CALLS[EXACTLY_ONCE]
        raise UsageError(
            f"handler {describe(handler)}{signature} cannot be called as {call} "
            f"(--mode {mode}): {exc}",
            f"give it the parameters of {call}; {other} is for the other mode",
        ) from None


def is_async(handler: Callable[..., Any]) -> bool:
    """Whether calling ``handler`` gives a coroutine (module docs)."""
    target: Any = handler
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.iscoroutinefunction(target):
        return True
    if inspect.isfunction(target) or inspect.ismethod(target) or not callable(target):
        return False
    return inspect.iscoroutinefunction(type(target).__call__)


def by_topic(
    handlers: Mapping[str, Callable[..., Any]], default: Callable[..., Any] | None
) -> Callable[..., Any]:
    """One handler that calls ``handlers[topic]`` for a message (or a batch, whose
    messages share one partition) of ``topic``, else ``default``; a message of a
    retry topic goes to its source topic's handler. All ``def`` or all ``async
    def`` (the runtime calls one kind per consumer).

    :raises UsageError: ``def`` and ``async def`` handlers mixed, or none given.
    """
    table = dict(handlers)
    every = [*table.values(), *([default] if default is not None else [])]
    if not every:
        raise UsageError("no handler registered", "register one per topic, or a default")
    if len({is_async(fn) for fn in every}) > 1:
        raise UsageError(
            "the per-topic handlers mix def and async def",
            "make them all def or all async def",
        )

    def pick(first: Any) -> Callable[..., Any]:
        topic = (first[0] if isinstance(first, list) else first).topic()
        fn = table.get(topic) or table.get(topic.removesuffix(RETRY_SUFFIX), default)
        if fn is None:
            raise HandlerMisuse(  # the run stops; nothing is committed past it
                f"no handler for topic {topic!r}",
                f"register one (consumer.handler(fn, topic={topic!r})) or a default",
            )
        return fn

    if is_async(every[0]):

        async def call_async(first: Any, *rest: Any) -> Any:
            return await pick(first)(first, *rest)

        return call_async

    def call(first: Any, *rest: Any) -> Any:
        return pick(first)(first, *rest)

    return call


def check_result(result: object) -> None:
    """Called by the lanes on a ``def`` handler's result when it is not ``None``.

    :raises HandlerMisuse: the result is awaitable (its work would never run)."""
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # no "never awaited" warning on top of the error
        raise HandlerMisuse(
            "the handler returned an awaitable from a plain def: its work would never run",
            "declare it async def (htmqc awaits async handlers) or await inside it",
        )


class EventLoopThread:
    """The one asyncio loop that runs ``async def`` handlers (module docs)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    try:
                        loop.run_forever()
                    finally:
                        for task in asyncio.all_tasks(loop):
                            task.cancel()  # abandoned calls
                        loop.close()

                threading.Thread(target=serve, name="htmqc-asyncio", daemon=True).start()
                ready.wait()
                self._loop = loop
            return self._loop

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started on first use): where an async sink
        connection lives (:meth:`htmqc.ports.Sink.serve_async_handler`)."""
        return self._started()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the loop, in a copy of the caller's context; wait for it."""
        loop = self._started()
        context = contextvars.copy_context()
        done: Future[Any] = Future()

        def start() -> None:
            task = loop.create_task(coro, context=context)
            task.add_done_callback(lambda t: _settle(t, done))

        loop.call_soon_threadsafe(start)
        return done.result()

    def close(self) -> None:
        """Stop the loop (calls still running are abandoned with it)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)


def _settle(task: asyncio.Task[Any], done: Future[Any]) -> None:
    if task.cancelled():
        done.set_exception(asyncio.CancelledError())
    elif task.exception() is not None:
        done.set_exception(task.exception())
    else:
        done.set_result(task.result())


def synchronous(
    handler: Callable[..., Any], loop: EventLoopThread | None
) -> Callable[..., Any]:
    """``handler`` as a plain call: an ``async def`` one runs on ``loop`` and the
    caller waits (a ``def`` one is returned as it is)."""
    if not is_async(handler):
        return handler
    runner = loop if loop is not None else EventLoopThread()
    coroutine: Callable[..., Awaitable[Any]] = handler

    def call(*args: Any) -> Any:
        return runner.run(coroutine(*args))  # type: ignore[arg-type]

    return call
