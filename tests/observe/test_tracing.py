"""``--otel``: a span per handler run with the messaging attributes, handler spans
nested under it, commit spans; a missing OpenTelemetry is a one-line usage error."""

from __future__ import annotations

import builtins
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from htmqc.errors import UsageError
from htmqc.observe.tracing import batch_spans
from tests.runtime.fakes import FakeConsumer, make_logs
from tests.runtime.test_engine_unit import TOPIC, engine_for

_EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))
trace.set_tracer_provider(_PROVIDER)  # once per process: OpenTelemetry refuses a second


@pytest.mark.parametrize("workers", [1, 3])
def test_batches_and_commits_are_spans_and_handler_spans_nest(workers: int) -> None:
    _EXPORTER.clear()
    tracer = trace.get_tracer("test-handler")

    def handler(msg: Any) -> None:
        with tracer.start_as_current_span("handle"):
            pass

    consumer = FakeConsumer(TOPIC, make_logs(TOPIC, 2, 50, keys=5))
    engine = engine_for(handler, consumer, workers=workers, max_messages=100, otel=True)
    engine.run(install_signals=False)
    spans = _EXPORTER.get_finished_spans()
    batches = [s for s in spans if s.name == "htmqc.process"]
    handled = [s for s in spans if s.name == "handle"]
    commits = [s for s in spans if s.name == "htmqc.commit"]
    assert len(handled) == 100
    assert sum(s.attributes["messaging.batch.message_count"] for s in batches) == 100
    assert {s.attributes["messaging.destination.name"] for s in batches} == {TOPIC}
    assert {s.attributes["messaging.destination.partition.id"] for s in batches} == {"0", "1"}
    by_id = {s.context.span_id: s for s in batches}
    for h in handled:
        assert h.parent is not None and h.parent.span_id in by_id, "handler span not nested"
    for b in batches:
        assert b.attributes["htmqc.first_offset"] <= b.attributes["htmqc.last_offset"]
    assert commits and commits[0].attributes["htmqc.mode"] == "at-least-once"


def test_missing_opentelemetry_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_otel(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("opentelemetry"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_otel)
    with pytest.raises(UsageError) as caught:
        batch_spans()
    assert "htmqc[otel]" in caught.value.line()
