"""The consumer's live state as plain, JSON-ready data (what ``/state.json`` returns).

Theory of operation
-------------------
Observability never reaches into the runtime. It reads a :class:`StateSource`:
anything with ``state() -> dict`` returning the document below. The runtime
plugs in a :class:`CoreStateSource` (or its own source built on
:func:`core_state`); tests drive a real :class:`~htmqc.core.ConsumerCore` by hand.
``state()`` is called from the HTTP server's threads, once per scrape or page
refresh, so a source must be safe to call from another thread:
:class:`CoreStateSource` takes the runtime's lock around the read.

Schema (version 1)
------------------
::

    {
      "version": 1,
      "generated_at": 1763850000.25,        # unix seconds, when this document was made
      "started_at": 1763849000.0 | null,    # unix seconds, when the source started
      "partitions": [                       # sorted by (topic, partition)
        {
          "topic": "orders", "partition": 0, "name": "orders/0",
          "epoch": 3,                       # assignment epoch (core)
          "committed": 100,                 # durable watermark (Kafka convention: next to read)
          "requested": 100,                 # highest commit requested and not failed
          "processed": 120,                 # every offset below is finished
          "next": 130,                      # one past the highest fetched offset
          "high": 150 | null,               # broker high watermark, when the runtime knows it
          "lag": 50 | null,                 # high - committed, when high is known
          "draining": false,                # being revoked
          "paused": false,                  # fetching paused (flow control)
          "in_flight_count": 9,             # unfinished offsets in [processed, next)
          "in_flight": [{"offset": 120, "state": "Processing"}, ...],
          "finished_above": [125, 127],     # finished out of order, above processed
          "truncated": false                # the two lists were cut at max_offsets
        }
      ],
      "in_flight": 9,                       # sum of in_flight_count
      "paused_partitions": 0,
      "flow": {"window": 1000, "limit": 1000, "max_in_flight": 10000,
               "min_window": 16, "max_window": 10000, "paused": false} | null,
      "dlq": {"failed": 2, "poison": 1},    # messages dead-lettered, by kind
      "extra": {...},                       # free-form, JSON-ready, from the runtime
      "health": {"live":  {"ok": true,  "reason": ""},            # only from the HTTP
                 "ready": {"ok": false, "reason": "no partitions assigned"}}  # server
    }

``extra`` is the runtime's; the engine (:meth:`htmqc.runtime.loop.Engine.state_source`)
puts, among others, ``"breaker"`` there: the circuit breaker's
:meth:`~htmqc.core.breaker.Breaker.snapshot` (``state``: ``Closed``, ``Open``,
``HalfOpen`` or ``Probing``; ``reason``, ``error_class``, ``trips``, ``held_for``
seconds, ``window_calls``, ``window_failures``...), which ``/metrics`` and the page read.

``health`` is not made here: :class:`~htmqc.observe.server.ObserveServer` adds it
to ``/state.json`` (with :func:`health_state`) when it was given a ``health``, asking
``live()`` and ``ready()`` at request time, exactly as ``/healthz`` and ``/readyz``
do. A document published by the poll loop could not say that the poll loop
stopped; the server, answering from its own thread, can. Without a ``health`` the
key is absent (and the page says "not reported").

Invariant carried over from the core: ``committed <= processed <= next`` and every
in-flight or finished-above offset lies in ``[processed, next)``.
Nothing here carries a secret: topic names, numbers and state names only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from htmqc.core import ConsumerCore, MessageState, TopicPartition
from htmqc.core.flow import FlowWindow

#: Version of the document layout above; bumped on incompatible changes.
SCHEMA_VERSION = 1

#: Default cap on the offsets listed per partition (the counts stay exact).
MAX_OFFSETS = 1000


@runtime_checkable
class StateSource(Protocol):
    """Something that can describe the consumer's state (see module docs)."""

    def state(self) -> dict[str, Any]:
        """The state document; must be safe to call from another thread."""
        ...


def flow_state(flow: FlowWindow) -> dict[str, Any]:
    """The flow window's figures as plain data."""
    p = flow.policy
    return {
        "window": flow.window,
        "limit": flow.limit,
        "max_in_flight": p.max_in_flight,
        "min_window": p.min_window,
        "max_window": p.max_window,
        "paused": flow.paused,
    }


def health_state(live: tuple[bool, str], ready: tuple[bool, str]) -> dict[str, Any]:
    """The ``health`` entry of the document (module docs) from the answers of
    ``live()`` and ``ready()`` (each ``(ok, reason)``; the reason is dropped when ok)."""
    return {
        name: {"ok": bool(ok), "reason": "" if ok else str(reason)}
        for name, (ok, reason) in (("live", live), ("ready", ready))
    }


def core_state(core: ConsumerCore, **options: Any) -> dict[str, Any]:
    """The state document (module docs) of ``core`` now: :func:`core_capture`'s
    document, built at once (the same arguments). Reads ``core`` only; the caller
    must keep it still meanwhile (hold the runtime's lock)."""
    return core_capture(core, **options)()


#: ``MessageState.value`` by state (the enum's ``value`` is a Python-level descriptor).
_STATE_NAMES = {state: state.value for state in MessageState}


def core_capture(
    core: ConsumerCore,
    *,
    flow: FlowWindow | None = None,
    paused: Iterable[TopicPartition] = (),
    dlq_counts: Mapping[str, int] | None = None,
    high_watermarks: Mapping[TopicPartition, int] | None = None,
    extra: Mapping[str, Any] | None = None,
    started_at: float | None = None,
    now: float | None = None,
    max_offsets: int = MAX_OFFSETS,
) -> Callable[[], dict[str, Any]]:
    """The state document (module docs) in two steps: copy what it needs from
    ``core`` now (the caller holds the runtime's lock; the copies are flat and
    cheap), and return a function that builds the document from the copies later,
    on any thread, without the lock: the sorting and the per-offset entries are
    the reader's cost, not the poll thread's. The rest are the runtime's extras;
    ``now`` defaults to the wall clock."""
    paused_set = set(paused)
    highs = dict(high_watermarks or {})
    generated_at = time.time() if now is None else now
    flow_doc = None if flow is None else flow_state(flow)
    dlq = dict(sorted((dlq_counts or {}).items()))
    extras = dict(extra or {})
    copies = [
        (tp, epoch, tracker.committed, tracker.requested, tracker.processed, tracker.next,
         tracker.draining, tracker.in_flight(), tracker.finished_above())
        for tp, epoch, tracker in core.partitions()
    ]  # fmt: skip

    def render() -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        total_in_flight = 0
        names = _STATE_NAMES
        for tp, epoch, committed, requested, processed, nxt, draining, live, finished in sorted(
            copies, key=lambda item: item[0]
        ):
            offsets = sorted(live)
            high = highs.get(tp)
            total_in_flight += len(live)
            parts.append(
                {
                    "topic": tp[0],
                    "partition": tp[1],
                    "name": f"{tp[0]}/{tp[1]}",
                    "epoch": epoch,
                    "committed": committed,
                    "requested": requested,
                    "processed": processed,
                    "next": nxt,
                    "high": high,
                    "lag": None if high is None else max(0, high - committed),
                    "draining": draining,
                    "paused": tp in paused_set,
                    "in_flight_count": len(live),
                    "in_flight": [
                        {"offset": o, "state": names[live[o]]} for o in offsets[:max_offsets]
                    ],
                    "finished_above": list(finished[:max_offsets]),
                    "truncated": len(offsets) > max_offsets or len(finished) > max_offsets,
                }
            )
        return {
            "version": SCHEMA_VERSION,
            "generated_at": generated_at,
            "started_at": started_at,
            "partitions": parts,
            "in_flight": total_in_flight,
            "paused_partitions": sum(1 for p in parts if p["paused"]),
            "flow": flow_doc,
            "dlq": dlq,
            "extra": extras,
        }

    return render


class CoreStateSource:
    """A :class:`StateSource` over a live :class:`ConsumerCore`.

    ``lock``: the lock the runtime holds while it mutates the core (and the
    flow window); taken around each read so a scrape sees one consistent state.
    The callables, if given, are called under the lock and return the paused
    partitions, DLQ counts by kind, broker high watermarks and free-form extras.
    """

    def __init__(
        self,
        core: ConsumerCore,
        *,
        lock: threading.Lock | threading.RLock | None = None,
        flow: FlowWindow | None = None,
        paused: Callable[[], Iterable[TopicPartition]] | None = None,
        dlq_counts: Callable[[], Mapping[str, int]] | None = None,
        high_watermarks: Callable[[], Mapping[TopicPartition, int]] | None = None,
        extra: Callable[[], Mapping[str, Any]] | None = None,
        max_offsets: int = MAX_OFFSETS,
    ) -> None:
        self.core = core
        self.flow = flow
        self._lock = lock if lock is not None else threading.Lock()
        self._paused = paused
        self._dlq = dlq_counts
        self._highs = high_watermarks
        self._extra = extra
        self._max_offsets = max_offsets
        self.started_at = time.time()

    def state(self) -> dict[str, Any]:
        """The state document (module docs), read under the runtime's lock."""
        return self.capture()()

    def capture(self) -> Callable[[], dict[str, Any]]:
        """Copy the state under the runtime's lock; the returned function builds
        the document from the copies, without the lock (:func:`core_capture`)."""
        with self._lock:
            return core_capture(
                self.core,
                flow=self.flow,
                paused=self._paused() if self._paused else (),
                dlq_counts=self._dlq() if self._dlq else None,
                high_watermarks=self._highs() if self._highs else None,
                extra=self._extra() if self._extra else None,
                started_at=self.started_at,
                max_offsets=self._max_offsets,
            )


class LastSnapshot:
    """A :class:`StateSource` serving the document last published by the poll
    thread (:meth:`publish`): a reader never takes the engine's lock, so an HTTP
    request, a scrape or the Redis mirror answers at once even while the engine
    is inside a long rebalance callback or a slow sink call; what it serves is at
    most one publishing period old (``published_at`` says when, monotonic).

    Over a :class:`CoreStateSource`, :meth:`publish` only copies the state
    (:meth:`CoreStateSource.capture`); the first reader of that copy builds the
    document, which later readers of the same copy share. Any other source is
    read whole at :meth:`publish`.

    :meth:`state` raises :class:`LookupError` before the first :meth:`publish`
    (the server answers 500: nothing to show yet).
    """

    def __init__(self, source: StateSource) -> None:
        self.source = source
        self._capture = source.capture if isinstance(source, CoreStateSource) else None
        #: The latest copy's builder and, once built, its document (one tuple,
        #: replaced whole, so a reader never pairs a builder with another's document).
        self._latest: tuple[Callable[[], dict[str, Any]], list[dict[str, Any]]] | None = None
        self.published_at: float | None = None

    def publish(self) -> None:
        """Copy ``source`` now (the caller may hold the engine's lock) and keep it."""
        if self._capture is not None:
            render = self._capture()
        else:
            doc = self.source.state()
            render = lambda: doc  # noqa: E731
        self._latest = (render, [])
        self.published_at = time.monotonic()

    def state(self) -> dict[str, Any]:
        """The last published document."""
        latest = self._latest
        if latest is None:
            raise LookupError("no state published yet")
        render, built = latest
        if not built:
            built.append(render())
        return built[0]
