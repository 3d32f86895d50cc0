"""``htmqc-kafka``'s loss paths without a JVM or a broker: a loss fails the query
(``failOnDataLoss=true``) or is logged (``false``), and records deleted while a
batch reads them (retention or ``delete_records`` between planning and
reading, which no test on a broker can time) are a loss too, not a silent skip."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from htmqc.spark.kafka_offsets import DataLoss, DataLossError
from htmqc.spark.kafka_options import parse_options
from tests.services import require_module

require_module("pyspark")
from confluent_kafka import KafkaError  # noqa: E402

from htmqc.spark import kafka_source  # noqa: E402
from htmqc.spark.kafka_source import KafkaRange, _Planner, read_range  # noqa: E402

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}
LOSS = DataLoss("t", 0, "deleted", "next offset 100 < earliest 150", 50)


def test_a_loss_fails_the_query_or_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    strict = _Planner(parse_options(BASE, batch=False))
    with pytest.raises(DataLossError, match=r"data loss: t/0 deleted: next offset 100 < earliest"):
        strict.on_loss([LOSS])
    lenient = _Planner(parse_options({**BASE, "failOnDataLoss": "false"}, batch=False))
    with caplog.at_level(logging.WARNING, logger="htmqc.spark.kafka"):
        lenient.on_loss([LOSS])
    assert caplog.messages == [
        "htmqc-kafka: data loss (failOnDataLoss=false): t/0 deleted: next offset 100 < earliest 150"
    ]


class _Message:
    def __init__(self, offset: int, error: int | None = None) -> None:
        self._offset, self._error = offset, error

    def error(self) -> KafkaError | None:
        return None if self._error is None else KafkaError(self._error)

    def offset(self) -> int:
        return self._offset

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return f"{self._offset:012d}".encode()

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_700_000_000_000

    def headers(self) -> None:
        return None


class _DeletingConsumer:
    """Offsets 100..119 arrive; then 120..149 are deleted (the next fetch is out
    of range and the earliest offset is 150); 150..199 follow, then the end."""

    def __init__(self) -> None:
        self.position = 0

    def assign(self, partitions: list[Any]) -> None:
        self.position = partitions[0].offset

    def unassign(self) -> None:
        pass

    def get_watermark_offsets(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        return 150, 200

    def consume(self, count: int, timeout: float) -> list[_Message]:
        if self.position < 120:
            out = [_Message(o) for o in range(self.position, 120)]
            self.position = 120
            return out
        if self.position < 150:
            return [_Message(self.position, KafkaError.OFFSET_OUT_OF_RANGE)]
        out = [_Message(o) for o in range(self.position, 200)]
        self.position = 200
        return [*out, _Message(200, KafkaError._PARTITION_EOF)]


@pytest.fixture
def deleting(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(kafka_source, "_cached_consumer", lambda config: _DeletingConsumer())
    yield


def offsets_read(options: dict[str, str]) -> list[int]:
    part = KafkaRange("t", 0, 100, 200)
    batches = read_range(parse_options(options, batch=False), part)
    return [o for batch in batches for o in batch.column("offset").to_pylist()]


def test_records_deleted_while_a_batch_reads_them_fail_it(deleting: None) -> None:
    with pytest.raises(DataLossError, match=r"t/0 deleted: offsets 120\.\.149 were deleted"):
        offsets_read(BASE)


def test_records_deleted_while_a_batch_reads_them_are_logged_and_skipped(
    deleting: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="htmqc.spark.kafka"):
        read = offsets_read({**BASE, "failOnDataLoss": "false"})
    assert read == [*range(100, 120), *range(150, 200)]
    assert caplog.messages == [
        "htmqc-kafka: data loss (failOnDataLoss=false): "
        "t/0 deleted: offsets 120..149 were deleted while the batch read them"
    ]


def test_a_wrong_address_fails_the_first_planning_quickly_naming_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No broker at the address: the query's first planning fails within its
    first-contact budget (not the patience an outage mid-query gets), naming the
    address and librdkafka's reason; a planner that reached the cluster waits longer."""
    import time

    from htmqc.loopback import free_port

    nowhere = f"127.0.0.1:{free_port()}"
    monkeypatch.setattr(kafka_source, "FIRST_CONTACT_SECONDS", 1.0)
    monkeypatch.setattr(kafka_source, "PATIENCE_SECONDS", 3.0)
    planner = _Planner(parse_options({**BASE, "kafka.bootstrap.servers": nowhere}, batch=False))
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError) as caught:
            planner.snapshot(first=True)
        first = time.monotonic() - started
        assert f"cannot list topics at {nowhere} (" in str(caught.value)
        assert "Connection refused" in str(caught.value)
        planner._reached = True  # as after a planning that reached the cluster
        started = time.monotonic()
        with pytest.raises(RuntimeError):
            planner.snapshot()
        assert first < 3.0 <= time.monotonic() - started
    finally:
        planner.close()


def test_records_deleted_while_a_batch_reads_them_leave_a_note_for_the_planner(
    deleting: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With failOnDataLoss=false the reader leaves a loss note (the planner
    counts it in "@lost"); the note covers only this batch's range."""
    from htmqc.spark import loss_notes
    from htmqc.spark.kafka_offsets import LossNote

    notes: list[tuple[str, tuple[str, int], LossNote]] = []
    monkeypatch.setattr(
        loss_notes, "write_note", lambda config, group, tp, note: notes.append((group, tp, note))
    )
    options = parse_options({**BASE, "failOnDataLoss": "false"}, batch=False)
    part = KafkaRange("t", 0, 100, 200, notes="htmqc-spark-losses-x")
    assert sum(len(b) for b in read_range(options, part)) == 70
    assert notes == [("htmqc-spark-losses-x", ("t", 0), LossNote(200, 100, 30))]
    # Deleted past the range's end: this batch's share ends at its end.
    notes.clear()
    monkeypatch.setattr(_DeletingConsumer, "get_watermark_offsets", lambda *a, **k: (260, 300))
    part = KafkaRange("t", 0, 100, 200, notes="g")
    assert sum(len(b) for b in read_range(options, part)) == 20
    assert notes == [("g", ("t", 0), LossNote(200, 100, 80))]
    # A query that keeps no notes (none given) writes none.
    notes.clear()
    assert sum(len(b) for b in read_range(options, KafkaRange("t", 0, 100, 200))) == 20
    assert notes == []
