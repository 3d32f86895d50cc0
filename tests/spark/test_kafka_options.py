"""``htmqc-kafka``'s options: Spark's connector's names, and every bad option or
value refused with one line naming it (issue 21's list), without Spark."""

from __future__ import annotations

import pytest

from htmqc.errors import UsageError
from htmqc.spark.kafka_options import EARLIEST, LATEST, Offsets, Timestamps, parse_options
from tests.services import require_module

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}


def test_spark_names_and_defaults() -> None:
    stream = parse_options(BASE, batch=False)
    assert stream.subscribe == ("t",)
    assert stream.starting == Offsets("latest")  # Spark's streaming default
    assert stream.fail_on_data_loss is True
    assert stream.consumer_config() == {
        "isolation.level": "read_committed",
        "bootstrap.servers": "127.0.0.1:9092",
    }
    batch = parse_options(BASE, batch=True)
    assert (batch.starting, batch.ending) == (Offsets("earliest"), Offsets("latest"))
    given = parse_options(
        {
            "kafka.bootstrap.servers": "h:1",
            "ASSIGN": '{"t": [1, 0]}',
            "startingOffsets": "Earliest",  # the issue: a JSONDecodeError
            "maxOffsetsPerTrigger": "10",
            "includeHeaders": "TRUE",
            "failOnDataLoss": "false",
            "kafka.security.protocol": "PLAINTEXT",
        },
        batch=False,
    )
    assert given.assign == (("t", 0), ("t", 1))
    assert given.starting == Offsets("earliest")
    assert (given.max_offsets_per_trigger, given.include_headers) == (10, True)
    assert given.fail_on_data_loss is False
    assert given.kafka["security.protocol"] == "PLAINTEXT"
    offsets = parse_options({**BASE, "startingOffsets": '{"t": {"0": 5, "1": -2}}'}, batch=False)
    assert offsets.starting == Offsets("specific", {("t", 0): 5, ("t", 1): EARLIEST})
    ending = parse_options({**BASE, "endingOffsets": '{"t": {"0": -1}}'}, batch=True)
    assert ending.ending == Offsets("specific", {("t", 0): LATEST})
    timed = parse_options(
        {**BASE, "startingTimestamp": "1700000000000", "startingOffsets": "latest"}, batch=False
    )
    assert timed.starting == Timestamps(everywhere=1700000000000)  # time wins, as in Spark


@pytest.mark.parametrize(
    ("options", "batch", "named"),
    [
        ({"subscribe": "t"}, False, "kafka.bootstrap.servers"),
        ({"kafka.bootstrap.servers": "h:1"}, False, "subscribe, subscribePattern, assign"),
        ({**BASE, "assign": '{"t": [0]}'}, False, "takes only one of"),
        ({"bootstrap": "h:1", "topics": "t"}, False, "bootstrap was renamed"),
        ({**BASE, "maxOffsetsPerTrigger": "0"}, False, "maxOffsetsPerTrigger='0' is below 1"),
        ({**BASE, "maxOffsetsPerTrigger": "-5"}, False, "maxOffsetsPerTrigger='-5' is below 1"),
        ({**BASE, "maxOffsetsPerTrigger": "many"}, False, "is not an integer"),
        ({**BASE, "maxOffsetsPerTrigger": "10"}, True, "streaming queries only"),
        ({**BASE, "endingOffsets": "latest"}, False, "batch queries only"),
        ({**BASE, "startingOffsets": "soon"}, False, "startingOffsets='soon' is not JSON"),
        ({**BASE, "startingOffsets": "latest"}, True, "not allowed for a batch read"),
        ({**BASE, "endingOffsets": "earliest"}, True, "endingOffsets='earliest' is not allowed"),
        ({**BASE, "startingOffsets": '{"u": {"0": 1}}'}, False, "names u/0, which this query"),
        ({**BASE, "startingOffsets": '{"t": {"0": -3}}'}, False, "has -3 for t/0"),
        ({**BASE, "startingOffsets": '{"t": {"x": 1}}'}, False, "has partition 'x'"),
        ({**BASE, "endingOffsets": '{"t": {"0": -2}}'}, True, "has -2 for t/0"),
        ({**BASE, "failOnDataLoss": "yes"}, False, "failOnDataLoss='yes' is not a boolean"),
        ({**BASE, "includeHeaders": "1"}, False, "includeHeaders='1' is not a boolean"),
        ({**BASE, "subscribe": None, "subscribePattern": "("}, False, "is not a regex"),
        ({**BASE, "subscribe": "a b"}, False, "names an invalid topic 'a b'"),
        ({**BASE, "minPartitions": "4"}, False, "minPartitions is not supported"),
        ({**BASE, "kafka.group.id": "g"}, False, "kafka.group.id is not supported"),
        ({**BASE, "kafka.isolation.level": "dirty"}, False, "kafka.isolation.level='dirty'"),
        ({**BASE, "startingTimestamp": "-1"}, False, "startingTimestamp='-1' is below 0"),
        ({**BASE, "startingOffsetsByTimestampStrategy": "x"}, False, "is unknown"),
        ({**BASE, "colour": "red"}, False, "unknown option 'colour'"),
    ],
)
def test_bad_options_are_one_line_naming_them(
    options: dict[str, str | None], batch: bool, named: str
) -> None:
    given = {k: v for k, v in options.items() if v is not None}
    with pytest.raises(UsageError) as caught:
        parse_options(given, batch=batch)
    line = caught.value.line()
    assert named in line
    assert "\n" not in line
    assert caught.value.fix


class _Reading:
    """Records what a ``spark.read``/``readStream`` chain was asked for."""

    def __init__(self, kind: str, log: list[tuple[str, str, dict[str, str]]]) -> None:
        self.kind, self.log = kind, log
        self.fmt, self.opts = "", {}

    def format(self, name: str) -> _Reading:
        self.fmt = name
        return self

    def options(self, **opts: str) -> _Reading:
        self.opts = opts
        return self

    def load(self) -> str:
        self.log.append((self.kind, self.fmt, self.opts))
        return f"{self.kind} frame"


class _Session:
    def __init__(self) -> None:
        self.log: list[tuple[str, str, dict[str, str]]] = []

    @property
    def read(self) -> _Reading:
        return _Reading("read", self.log)

    @property
    def readStream(self) -> _Reading:
        return _Reading("readStream", self.log)


def test_an_option_of_the_other_read_kind_fails_where_the_frame_is_defined() -> None:
    """``load()`` cannot tell a stream from a batch read; ``stream_kafka`` and
    ``read_kafka`` can, so a misplaced option fails there, before Spark plans."""
    require_module("pyspark")  # under CI a missing pyspark fails, never skips
    from htmqc.spark.kafka_source import read_kafka, stream_kafka

    spark = _Session()
    with pytest.raises(UsageError, match=r"(?i)endingOffsets applies to batch"):
        stream_kafka(spark, **BASE, endingOffsets="latest")
    with pytest.raises(UsageError, match=r"(?i)maxOffsetsPerTrigger applies to stream"):
        read_kafka(spark, **BASE, maxOffsetsPerTrigger="10")
    assert spark.log == []  # nothing reached Spark
    assert stream_kafka(spark, **BASE, maxOffsetsPerTrigger="10") == "readStream frame"
    assert read_kafka(spark, **BASE, endingOffsets="latest") == "read frame"
    assert spark.log == [
        ("readStream", "htmqc-kafka", {**BASE, "maxOffsetsPerTrigger": "10"}),
        ("read", "htmqc-kafka", {**BASE, "endingOffsets": "latest"}),
    ]
