"""The runtime: the poll loop that drives :mod:`htmqc.core` against Kafka and a sink.

* :mod:`htmqc.runtime.engine`: the poll loop, rebalances, flow control;
* :mod:`htmqc.runtime.lanes`: key-ordered execution on worker threads;
* :mod:`htmqc.runtime.delivery`: at-least-once Kafka commits and exactly-once
  sink transactions, and dead letters;
* :mod:`htmqc.runtime.launch`: loading the handler and checking the input.
"""

from htmqc.runtime.engine import Engine, MessageTooLarge
from htmqc.runtime.launch import build_engine, load_handler, run
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
