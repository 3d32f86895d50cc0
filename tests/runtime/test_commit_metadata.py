"""At-least-once's backstop (:meth:`AtLeastOnce.metadata`): a finished-above set
too long for the broker's metadata limit is cut to its longest prefix of runs,
so Kafka takes the commit (the position moves) and the offsets left out merely
run again after a restart; and the limit follows ``--commit-metadata-bytes``."""

from __future__ import annotations

from typing import Any

from htmqc.core.decisions import Commit
from htmqc.core.metadata_budget import DEFAULT_LIMIT
from htmqc.runtime.delivery import AtLeastOnce
from htmqc.sinks.encoding import METADATA_PREFIX, decode_metadata, encode_metadata

TP = ("t", 0)


def _no_producer() -> Any:
    raise AssertionError("no producer needed")


def test_a_set_that_fits_is_sent_whole() -> None:
    alo = AtLeastOnce(None, _no_producer)
    commit = Commit(tp=TP, epoch=1, offset=100, finished_above=(102, 103, 110))
    assert alo.metadata(commit) == encode_metadata(100, (102, 103, 110))
    assert alo.truncated == 0


def test_a_set_too_long_keeps_the_longest_prefix_of_runs_that_fits() -> None:
    alo = AtLeastOnce(None, _no_producer)
    above = tuple(range(101, 101 + 2 * 5000, 2))  # "1,1,1,...": ~10000 bytes
    whole = encode_metadata(100, above)
    assert len(whole) > DEFAULT_LIMIT
    text = alo.metadata(Commit(tp=TP, epoch=1, offset=100, finished_above=above))
    assert len(text) <= DEFAULT_LIMIT and whole.startswith(text)
    assert len(text) > DEFAULT_LIMIT - 3  # as much as fits (an item here is two bytes)
    kept = decode_metadata(100, text)
    assert kept == above[: len(kept)] and text.startswith(METADATA_PREFIX)
    assert alo.truncated == 1


def test_the_limit_is_the_option() -> None:
    alo = AtLeastOnce(None, _no_producer, metadata_limit=100)
    above = tuple(range(101, 400, 2))
    text = alo.metadata(Commit(tp=TP, epoch=1, offset=100, finished_above=above))
    assert 97 <= len(text) <= 100


def test_the_intakes_budget_is_the_option_capped_by_the_kafka_sinks_limit() -> None:
    """Exactly-once Kafka->Kafka: the sink refuses a commit whose metadata is over
    its ``metadata_max_bytes``, so the intake's budget must never exceed it; a
    sink that writes no Kafka metadata (SQL) gets no budget; at-least-once gets
    the option, thinned past half of it."""
    from types import SimpleNamespace

    from htmqc.runtime.intake import metadata_budget

    def engine(mode: str, sink: Any, source: str = "kafka") -> Any:
        options = SimpleNamespace(commit_metadata_bytes=4096, mode=mode, source=source)
        return SimpleNamespace(options=options, sink=sink)

    kafka_sink = SimpleNamespace(writes_kafka=True, metadata_max_bytes=1000)
    assert metadata_budget(engine("exactly-once", kafka_sink)) == (1000, None)
    kafka_sink.metadata_max_bytes = 9000
    assert metadata_budget(engine("exactly-once", kafka_sink)) == (4096, None)
    sql_sink = SimpleNamespace(writes_kafka=False, metadata_max_bytes=None)
    assert metadata_budget(engine("exactly-once", sql_sink)) is None
    assert metadata_budget(engine("at-least-once", None)) == (4096, 2048)
    assert metadata_budget(engine("at-least-once", None, source="nats")) is None
