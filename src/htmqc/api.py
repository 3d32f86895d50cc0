"""The library API: :class:`Consumer`, the object ``htmqc run`` builds too.

::

    from htmqc import Consumer, Message, SqlTx

    consumer = Consumer(bootstrap="127.0.0.1:9092", topics=["payments"], group="ledger",
                        mode="exactly-once", sink="postgresql://localhost/app")

    @consumer.handler
    def handle(msg: Message, tx: SqlTx) -> None:
        tx.execute("INSERT INTO payments (id, body) VALUES (%s, %s)", (msg.key(), msg.value()))

    consumer.run()            # blocks until SIGTERM/SIGINT (or max_messages, idle_exit)

or, embedded in an application or a test::

    consumer.start()          # checked and connected when it returns; runs on a thread
    ...
    finished = consumer.stop()

``tx`` is the sink's transaction: a :class:`~htmqc.SqlTx` (the DB-API cursor of
an ``sqlite:`` or ``postgresql:`` sink) or a :class:`~htmqc.KafkaTx` (a ``kafka:``
sink's ``send``); both are runtime-checkable Protocols, for annotations.
``topics`` (or ``topic``) takes a list of topic names, or ``--topic``'s text.

Options are the keyword arguments: every option of ``htmqc run`` under its
Python name (``--max-in-flight`` is ``max_in_flight``; ``htmqc run --help``
lists them), plus ``kafka_config`` (librdkafka settings). They are resolved as
the command line's are, without the environment or a TOML file: what is given
wins, then the ``profile``'s values, then the sink's defaults (a ``kafka:``
sink commits 10,000 messages per transaction), then the schema's. A bad option
is a :class:`~htmqc.errors.UsageError` when the consumer is built; a handler
whose signature does not fit the mode, when it is registered.

Decoded messages (:mod:`htmqc.runtime.decode`): with ``value_format`` (or
``key_format``) other than ``"bytes"`` the handler gets a
:class:`~htmqc.runtime.decode.DecodedMessage`, whose ``decoded_value()`` /
``decoded_key()`` are the decoded ones (``value()`` stays the raw bytes); a
record that does not decode is dead-lettered (a :class:`~htmqc.Permanent`)::

    consumer = Consumer(bootstrap=..., topic="payments", group="ledger",
                        value_format="protobuf", protobuf_type=payment_pb2.Payment,
                        schema_registry="http://127.0.0.1:8081")

``protobuf_type`` / ``key_protobuf_type`` take the message class itself here, or
its ``"module:Class"`` as on the command line.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar, overload

from htmqc.config import FIELDS, resolve
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.runtime.decode import check_formats
from htmqc.runtime.handlers import by_topic, check_handler
from htmqc.runtime.launch import prepare, serve
from htmqc.runtime.options import RunOptions
from htmqc.runtime.subscription import Subscription, join_topics

Handler = TypeVar("Handler", bound=Callable[..., Any])


class Consumer:
    """One consumer group member (module docs).

    ``handler``: the handler, or register it later with :meth:`handler` (one per
    topic if ``topic`` lists several).
    ``topics``: the topics to read, a list (``["orders", "refunds"]``) or a string
    as ``--topic`` takes it (one name, ``"orders,refunds"``, or one ``^`` pattern);
    ``topic=`` takes the same. Give one of the two.
    ``**options``: ``htmqc run``'s options by their Python names.

    :raises UsageError: an unknown or invalid option, a missing required one; an
        empty topic list or one holding a non-string, blank or comma'd name; a
        name listed twice or a pattern beside names; ``topic`` and ``topics`` both.
    """

    def __init__(
        self,
        handler: Callable[..., Any] | None = None,
        *,
        topics: str | Sequence[str] | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        if topics is not None:
            if options.get("topic") is not None:
                raise UsageError("both topic= and topics= given", "pass one of them")
            options["topic"] = join_topics(topics, "topics")
        elif isinstance(options.get("topic"), (list, tuple)):
            options["topic"] = join_topics(options["topic"], "topic")
        unknown = sorted(set(options) - set(FIELDS))
        if unknown:
            raise UsageError(
                f"unknown option {unknown[0]!r}",
                "use htmqc run's option names with _ for -, e.g. max_in_flight",
            )
        kafka = {k: str(v).lower() if isinstance(v, bool) else str(v)
                 for k, v in (kafka_config or {}).items()}
        classes = {
            side: options.pop(name)
            for side, name in (("value", "protobuf_type"), ("key", "key_protobuf_type"))
            if isinstance(options.get(name), type)
        }
        resolved = resolve(options, kafka, environ={})
        if classes:
            resolved = replace(resolved, message_types=classes)
        self._init(resolved, handler)

    @classmethod
    def from_options(
        cls, options: RunOptions, handler: Callable[..., Any] | None = None
    ) -> Consumer:
        """A consumer of options resolved already (``htmqc run`` builds its own so)."""
        consumer = cls.__new__(cls)
        consumer._init(options, handler)
        return consumer

    def _init(self, options: RunOptions, handler: Callable[..., Any] | None) -> None:
        Subscription.of(options.topic, options.retry_topic)  # a bad subscription fails here
        check_formats(options)
        self.options = options
        self._handlers: dict[str | None, Callable[..., Any]] = {}
        self._thread: threading.Thread | None = None
        self._stop: Callable[[], None] | None = None
        self._began = False
        self._lock = threading.Lock()
        self._finished: int | None = None
        self._error: BaseException | None = None
        if handler is not None:
            self.handler(handler)

    @overload
    def handler(self, fn: Handler, *, topic: str | None = None) -> Handler: ...

    @overload
    def handler(self, *, topic: str | None = None) -> Callable[[Handler], Handler]: ...

    def handler(
        self, fn: Handler | None = None, *, topic: str | None = None
    ) -> Handler | Callable[[Handler], Handler]:
        """Register ``fn`` as the handler (usable as a decorator, bare or as
        ``@consumer.handler(topic="refunds")``); returns it.

        ``topic``: ``fn`` handles that topic's messages only (one of ``--topic``'s,
        or any a pattern matches); a handler without ``topic`` handles the rest.
        Handlers of one consumer are all ``def`` or all ``async def``.

        :raises UsageError: a handler is registered already for ``topic`` (or as
            the default), ``topic`` is not one the consumer reads, or ``fn``
            cannot be called the way the mode calls it (``handler(msg)``
            at-least-once, ``handler(msg, tx)`` exactly-once).
        """
        if fn is None:
            return lambda f: self.handler(f, topic=topic)
        if topic in self._handlers:
            where = f"for topic {topic!r}" if topic is not None else "(the default)"
            raise UsageError(
                f"this consumer has a handler already {where}",
                "register one handler per topic, and at most one without a topic",
            )
        subscription = Subscription.parse(self.options.topic)
        if topic is not None and not (
            topic in subscription.topics or (subscription.pattern and subscription.wants(topic)
                                             and re.search(subscription.topics[0], topic))
        ):
            raise UsageError(
                f"topic {topic!r} is not one this consumer reads (--topic {self.options.topic!r})",
                "add it to topic=, or register the handler without a topic",
            )
        check_handler(fn, self.options.mode)
        self._handlers[topic] = fn
        return fn

    def _begin(self) -> Callable[..., Any]:
        """The handler, once: a consumer runs (or starts) one time, even after a failure."""
        with self._lock:
            if not self._handlers:
                raise UsageError("no handler registered", "decorate one with @consumer.handler")
            if self._began:
                raise UsageError("this consumer ran already", "build a new Consumer to run again")
            default = self._handlers.get(None)
            per_topic = {t: fn for t, fn in self._handlers.items() if t is not None}
            if not per_topic:
                assert default is not None
                handler = default
            else:
                subscription = Subscription.parse(self.options.topic)
                missing = [t for t in subscription.topics if t not in per_topic]
                if default is None and subscription.pattern:
                    raise UsageError(
                        "per-topic handlers on a pattern need a default for the other topics "
                        "it matches", "register a handler without topic= too",
                    )
                if default is None and missing:
                    raise UsageError(
                        f"no handler for topic {missing[0]!r}",
                        "register one with topic=, or a default handler without topic=",
                    )
                handler = by_topic(per_topic, default)
            self._began = True
            return handler

    def run(self) -> int:
        """Run on this thread until stopped; return the messages finished. On the
        main thread SIGTERM and SIGINT stop it within ``shutdown_seconds``; from any
        thread, :meth:`stop` does. Logging is the application's: configure it as
        usual (``log_level``/``log_format`` are ``htmqc run``'s)."""
        engine, metrics = prepare(self._begin(), self.options)
        self._stop = engine.stop
        main = threading.current_thread() is threading.main_thread()
        self._finished = serve(engine, metrics, self.options, install_signals=main)
        return self._finished

    def start(self) -> None:
        """Check, connect, start the metrics server (if any), then run on a
        background thread (no signal handlers); :meth:`stop` ends it.

        :raises UsageError: see :meth:`run`.
        :raises Exception: what failed before the run began (the broker, the sink,
            the metrics port): raised here, nothing left open.
        """
        engine, metrics = prepare(self._begin(), self.options)
        self._stop = engine.stop
        ready = threading.Event()

        def main() -> None:
            try:
                self._finished = serve(engine, metrics, self.options, install_signals=False,
                                       ready=ready)
            except BaseException as exc:  # re-raised by stop()
                self._error = exc

        self._thread = threading.Thread(target=main, name="htmqc-consumer", daemon=True)
        self._thread.start()
        while not ready.wait(0.05):
            if not self._thread.is_alive():
                self._thread.join()
                assert self._error is not None
                raise self._error

    @property
    def running(self) -> bool:
        """Whether :meth:`start`'s thread is still running."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> int | None:
        """Stop the consumer as SIGTERM would (no new handler call, running ones
        finish up to ``shutdown_seconds``, everything finished committed). Started
        with :meth:`start`: wait for it and return the messages finished. Running
        :meth:`run` on another thread: ask it to stop and return ``None`` at once
        (``run()`` returns the count).

        :raises RuntimeFailure: it did not stop within ``timeout`` seconds.
        :raises Exception: what ended a started run, if it failed.
        """
        if self._stop is None:
            raise UsageError("this consumer is not running", "call start() or run() first")
        self._stop()
        if self._thread is None:
            return None
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeFailure(
                f"the consumer did not stop within {timeout:g} s",
                "give stop() more time (shutdown_seconds bounds a clean stop)",
            )
        if self._error is not None:
            raise self._error
        assert self._finished is not None
        return self._finished
