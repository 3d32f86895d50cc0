"""Observability: Prometheus metrics, the live state page and ``/state.json``.

An adapter over a :class:`~htmqc.observe.state.StateSource`; it does not depend
on the runtime's internals. Typical wiring::

    source = CoreStateSource(core, lock=lock, flow=flow)
    metrics = Metrics(source)
    server = ObserveServer(metrics)
    port = server.start(port=9108)      # 127.0.0.1 unless host= is given
    ...
    metrics.processed("orders", 0, "succeeded", len(batch))
    server.stop()
"""

from htmqc.observe.metrics import DLQ_KINDS, OUTCOMES, BatchHistogram, Metrics
from htmqc.observe.server import ObserveServer
from htmqc.observe.state import SCHEMA_VERSION, CoreStateSource, StateSource, core_state

__all__ = [
    "DLQ_KINDS",
    "OUTCOMES",
    "SCHEMA_VERSION",
    "BatchHistogram",
    "CoreStateSource",
    "Metrics",
    "ObserveServer",
    "StateSource",
    "core_state",
]
