"""The runtime: the poll loop that drives :mod:`htmqc.core` against Kafka and a sink.

* :mod:`htmqc.runtime.loop`: :class:`Engine`, one ``step(now)`` turn at a time,
  shutdown within its bound;
* :mod:`htmqc.runtime.intake`: consumed batches to the core and the workers;
* :mod:`htmqc.runtime.ownership`: assignment, claims, revokes, the partition gate;
* :mod:`htmqc.runtime.failures_io`: what happens when a handler raised;
* :mod:`htmqc.runtime.workers` and :mod:`htmqc.runtime.lanes`: the threads that
  run handlers, key-ordered; the exactly-once transaction worker;
* :mod:`htmqc.runtime.handlers`: the handler's signature check, ``async def`` handlers;
* :mod:`htmqc.runtime.delivery`: at-least-once Kafka commits, the exactly-once
  commit handshake, dead letters;
* :mod:`htmqc.runtime.stats`: counters and metrics;
* :mod:`htmqc.runtime.launch`: loading the handler and checking the input.
"""

from htmqc.runtime.launch import build_engine, load_handler, run
from htmqc.runtime.loop import Engine, MessageTooLarge
from htmqc.runtime.options import AT_LEAST_ONCE, EXACTLY_ONCE, MODES, RunOptions

__all__ = [
    "AT_LEAST_ONCE",
    "EXACTLY_ONCE",
    "MODES",
    "Engine",
    "MessageTooLarge",
    "RunOptions",
    "build_engine",
    "load_handler",
    "run",
]
