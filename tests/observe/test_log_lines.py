"""Log lines people can act on (issue 19, item 5), driven through the engine's
real failure path on fakes (no broker):

* a failure line carries the exception's class, its message (one line, cut
  with an ellipsis) and the attempt number;
* a dead-letter line names where the dead letter really went: the DLQ topic
  the producer wrote to, or the SQL sink's database and table;
* repeated lines are rate-limited (:class:`htmqc.logs.RateLimit`), htmqc's own
  and librdkafka's (through confluent-kafka's ``logger`` setting);
* ``--log-format json`` lines hold only the fields of
  :data:`htmqc.logs.JSON_FIELDS`, which the README documents one for one.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from htmqc import Permanent
from htmqc.core import RetryPolicy
from htmqc.logs import (
    ERROR_LIMIT,
    JSON_FIELDS,
    LIBRDKAFKA_LOGGER,
    LIMITED_LOGGERS,
    REQUIRED_FIELDS,
    JsonFormatter,
    RateLimit,
    ScrubbingFormatter,
    limit_repeats,
    one_line,
    unlimit_repeats,
)
from htmqc.runtime import Engine, RunOptions
from htmqc.sinks import open_sink
from htmqc.testing import FakeConsumer, FakeProducer

TOPIC = "payments-f"
README = Path(__file__).parents[2] / "README.md"


class Lines(logging.Handler):
    """Every record that reaches it (after the loggers' filters)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, start: str = "") -> list[str]:
        return [r.getMessage() for r in self.records if r.getMessage().startswith(start)]

    def first(self, start: str) -> logging.LogRecord:
        return next(r for r in self.records if r.getMessage().startswith(start))


@pytest.fixture
def lines() -> Iterator[Lines]:
    """The records of htmqc's loggers and of ``htmqc.librdkafka``; no rate
    limit installed before or after (a test installs its own)."""
    unlimit_repeats()
    handler = Lines()
    names = (*LIMITED_LOGGERS, LIBRDKAFKA_LOGGER)
    for name in names:
        logging.getLogger(name).addHandler(handler)
    yield handler
    unlimit_repeats()
    for name in names:
        logging.getLogger(name).removeHandler(handler)


class Clock:
    """A monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run_at_least_once(handler: Any, count: int, **options: Any) -> FakeProducer:
    """Run ``handler`` over ``count`` messages of partition 2 (one key) at least
    once, as ``htmqc run`` does once the engine is built
    (:func:`~htmqc.runtime.launch.serve`); the dead letters go to the returned
    fake producer."""
    from htmqc.runtime.launch import serve

    consumer = FakeConsumer.from_logs({(TOPIC, 2): [(b"k", b"v%d" % i) for i in range(count)]})
    producer = FakeProducer()
    opts = RunOptions(bootstrap="f:1", topic=TOPIC, group="g", max_messages=count, **options)
    engine = Engine(handler, opts, consumer, producer_factory=lambda: producer, seed=1,
                    retry=RetryPolicy(max_retries=opts.max_retries, base_delay=0.001,
                                      max_delay=0.002))
    consumer.on_commit = engine.on_commit
    assert serve(engine, None, opts, install_signals=False) == count
    return producer


# -- 1. failure lines: class, message, attempt -------------------------------------------


def test_a_failure_line_says_the_class_the_message_on_one_line_and_the_attempt(
    lines: Lines,
) -> None:
    long = "x" * 2000

    def handler(msg: Any) -> None:
        raise RuntimeError(f"insert failed:\n  connection reset by peer\r\n{long}")

    run_at_least_once(handler, 1, max_retries=2)
    failed = [r for r in lines.records if r.getMessage().startswith("handler failed")]
    assert [getattr(r, "attempt", None) for r in failed] == [1, 2, 3]
    text = failed[0].getMessage()
    assert text.startswith(
        f"handler failed on {TOPIC}/2@0 (attempt 1): "
        "RuntimeError: insert failed: connection reset by peer xxx"
    ), text
    assert "\n" not in text and "\r" not in text
    error = failed[0].error  # type: ignore[attr-defined]
    assert len(error) == ERROR_LIMIT and error.endswith("x...") and error in text
    doc = json.loads(JsonFormatter().format(failed[2]))
    assert (doc["attempt"], doc["error"]) == (3, error)
    assert ScrubbingFormatter().format(failed[2]).endswith(f"[{TOPIC}/2@0]")


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("a\nb\r\n  c", 300, "a b c"),
        ("  spaced  out  ", 300, "spaced  out"),
        ("abcdefghij", 10, "abcdefghij"),
        ("abcdefghijk", 10, "abcdefg..."),
        ("line\u2028sep", 300, "line sep"),
    ],
)
def test_one_line_folds_breaks_and_cuts_with_an_ellipsis(
    text: str, limit: int, expected: str
) -> None:
    assert one_line(text, limit) == expected


# -- 2. dead-letter lines: the real destination ------------------------------------------


@pytest.mark.parametrize(("exc", "kind"), [(Permanent("no such account"), "permanent"),
                                           (RuntimeError("flaky"), "failed")])
def test_the_dead_letter_line_names_the_topic_the_dead_letter_was_written_to(
    lines: Lines, exc: Exception, kind: str
) -> None:
    def handler(msg: Any) -> None:
        raise exc

    producer = run_at_least_once(handler, 1, max_retries=1)
    [written] = producer.records
    record = lines.first("dead-lettered")
    assert written.topic == f"{TOPIC}.dlq"
    name = type(exc).__name__
    assert record.getMessage() == (
        f"dead-lettered {TOPIC}/2@0 to {written.topic} ({kind}): {name}: {exc}"
    )
    assert record.destination == written.topic  # type: ignore[attr-defined]


def run_exactly_once(url: str) -> None:
    """Exactly-once into the sink at ``url``: offset 1 of two messages fails
    permanently, so its dead letter is written in the sink's transaction."""
    sink = open_sink(url)
    sink.open("g")
    consumer = FakeConsumer.from_logs({(TOPIC, 2): [(b"k", b"v0"), (b"k", b"v1")]})
    opts = RunOptions(bootstrap="f:1", topic=TOPIC, group="g", mode="exactly-once", sink=url,
                      max_messages=2)

    def handler(msg: Any, tx: Any) -> None:
        if msg.offset() == 1:
            raise Permanent("amount is negative")

    Engine(handler, opts, consumer, sink=sink, seed=1).run(install_signals=False)


@pytest.mark.parametrize("prefix", ["", "shop_"])
def test_the_dead_letter_line_of_a_sqlite_sink_names_its_database_and_table(
    lines: Lines, tmp_path: Path, prefix: str
) -> None:
    """Exactly-once into SQLite: the dead letter is a row of the sink's table,
    and the line says which database and table, not a DLQ topic."""
    db = tmp_path / "out.db"
    url = f"sqlite:///{db}" + (f"?table_prefix={prefix}" if prefix else "")
    table = f"{prefix or 'htmqc_'}dead_letters"
    run_exactly_once(url)
    record = lines.first("dead-lettered")
    assert record.getMessage() == (
        f"dead-lettered {TOPIC}/2@1 to {url} table {table} (permanent): "
        "Permanent: amount is negative"
    )
    with sqlite3.connect(db) as conn:  # the row is really there
        rows = conn.execute(f'SELECT topic, "offset", kind FROM {table}').fetchall()
    assert rows == [(TOPIC, 1, "permanent")]
    doc = json.loads(JsonFormatter().format(record))
    assert doc["destination"] == f"{url} table {table}"


def test_the_dead_letter_line_of_a_postgresql_sink_names_its_table_without_the_password(
    lines: Lines,
) -> None:
    import psycopg

    from tests.services import postgres_url

    base = postgres_url()
    prefix = f"l{uuid.uuid4().hex[:10]}_"
    url = f"{base}?password=hunter2-pw&table_prefix={prefix}"
    try:
        run_exactly_once(url)
        message = lines.first("dead-lettered").getMessage()
        shown = url.replace("hunter2-pw", "***")
        assert message.startswith(
            f"dead-lettered {TOPIC}/2@1 to {shown} table {prefix}dead_letters (permanent): "
        ), message
        with psycopg.connect(base) as conn:
            rows = conn.execute(f'SELECT topic, "offset" FROM {prefix}dead_letters').fetchall()
        assert rows == [(TOPIC, 1)]
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {prefix}dead_letters, {prefix}positions")


@contextmanager
def limited(name: str, limit: RateLimit) -> Iterator[tuple[logging.Logger, Lines]]:
    """Logger ``name`` behind ``limit``, its lines collected (not propagated)."""
    logger = logging.getLogger(name)
    shown = Lines()
    logger.addHandler(shown)
    logger.addFilter(limit)
    logger.propagate = False
    try:
        yield logger, shown
    finally:
        logger.removeFilter(limit)
        logger.removeHandler(shown)


# -- 3. repeated lines --------------------------------------------------------------------


def test_rate_limit_lets_the_first_lines_through_then_one_summary() -> None:
    clock = Clock()
    limit = RateLimit(burst=3, window=60.0, clock=clock)
    with limited("htmqc.test.limit", limit) as (logger, shown):
        for i in range(50):
            logger.warning("handler failed on t/0@%d: boom", i)
            clock.now += 0.5
        logger.warning("something else")  # a distinct line: always its first occurrence
        logger.error("handler failed on t/0@%d: boom", 99)  # another level: another kind
        assert shown.messages() == [
            "handler failed on t/0@0: boom", "handler failed on t/0@1: boom",
            "handler failed on t/0@2: boom", "something else", "handler failed on t/0@99: boom",
        ]
        clock.now = 1000.0 + 60.0  # the first window closes
        logger.warning("handler failed on t/0@%d: boom", 100)
        assert shown.messages()[5:] == [
            "handler failed on t/0@49: boom (suppressed 47 similar lines in the last 60 s)",
            "handler failed on t/0@100: boom",
        ]
        assert shown.records[5].suppressed == 47  # type: ignore[attr-defined]
        assert shown.records[5].levelno == logging.WARNING
        for i in range(5):
            logger.warning("handler failed on t/0@%d: boom", 200 + i)
        clock.now += 2.5
        limit.flush()  # end of run: what is held is said
        assert shown.messages()[-1] == (
            "handler failed on t/0@204: boom (suppressed 3 similar lines in the last 2 s)"
        )
        assert limit.held_total == 50


def test_a_closed_window_is_summarized_at_the_next_line_of_any_kind() -> None:
    clock = Clock()
    limit = RateLimit(burst=1, window=10.0, clock=clock)
    with limited("htmqc.test.sweep", limit) as (logger, shown):
        for _ in range(4):
            logger.warning("Connection refused")
        clock.now += 11
        logger.warning("Connected")
        assert shown.messages() == [
            "Connection refused",
            "Connection refused (suppressed 3 similar lines in the last 11 s)",
            "Connected",
        ]
        # a window that closes between two sweeps (one a second): closed by its next line
        logger.warning("Connection refused")
        logger.warning("Connection refused")
        clock.now += 9.5
        logger.warning("Connected")  # sweeps: nothing closed yet
        clock.now += 0.5
        logger.warning("Connection refused")
        assert shown.messages()[3:] == [
            "Connection refused",
            "Connection refused (suppressed 1 similar lines in the last 10 s)",
            "Connection refused",
        ]


def test_the_first_of_every_distinct_line_is_shown() -> None:
    """Lines that differ in more than their numbers are different lines, even
    when they share a ``%`` template (confluent-kafka logs every librdkafka
    line as ``"%s [%s] %s"``)."""
    limit = RateLimit(burst=1, window=60.0, clock=Clock())
    with limited("htmqc.test.distinct", limit) as (logger, shown):
        for port in (9092, 9093, 9094):
            logger.error("%s [%s] %s", "FAIL", "rdkafka#consumer-1",
                         f"Connect to ipv4#127.0.0.1:{port} failed: Connection refused")
        logger.error("%s [%s] %s", "ERROR", "rdkafka#consumer-1", "1/1 brokers are down")
        logger.error("%s [%s] %s", "FAIL", "rdkafka#consumer-1", "SSL handshake failed")
        assert [m.split("] ", 1)[1] for m in shown.messages()] == [
            "Connect to ipv4#127.0.0.1:9092 failed: Connection refused",
            "1/1 brokers are down",
            "SSL handshake failed",
        ]


def test_past_max_kinds_the_oldest_kind_is_summarized_and_forgotten() -> None:
    limit = RateLimit(burst=1, window=60.0, clock=Clock(), max_kinds=2)
    with limited("htmqc.test.kinds", limit) as (logger, shown):
        for text in ("a", "a", "b", "b", "c", "a"):
            logger.warning(text)
        assert shown.messages() == [
            "a", "b", "a (suppressed 1 similar lines in the last 0 s)", "c",
            "b (suppressed 1 similar lines in the last 0 s)", "a",
        ]


def test_htmqc_failure_lines_are_rate_limited_on_the_engine_path(lines: Lines) -> None:
    clock = Clock()
    limit_repeats(htmqc=RateLimit(burst=2, window=60.0, clock=clock))

    def handler(msg: Any) -> None:
        raise Permanent(f"bad amount in {msg.value().decode()}")

    producer = run_at_least_once(handler, 20, breaker_consecutive=1000, breaker_min_calls=1000)
    assert len(producer.records) == 20
    shown = [r for r in lines.records if not hasattr(r, "suppressed")]
    assert [r.getMessage().split(" ")[0] for r in shown] == [
        "handler", "dead-lettered", "handler", "dead-lettered"
    ]
    # the end of the run (serve) said what was held: one summary per kind of line
    summaries = [r for r in lines.records if getattr(r, "suppressed", None)]
    assert sorted((r.getMessage().split(" ")[0], r.suppressed) for r in summaries) == [  # type: ignore[attr-defined]
        ("dead-lettered", 18), ("handler", 18)
    ]
    assert "(suppressed 18 similar lines in the last 0 s)" in summaries[0].getMessage()


def test_librdkafka_lines_from_confluent_kafka_are_rate_limited(lines: Lines) -> None:
    """A consumer whose broker is down: librdkafka says ``Connection refused``
    many times a second through the ``logger`` setting the runtime gives it
    (:func:`~htmqc.runtime.launch.librdkafka_logger`); one line passes, and the
    rest are counted in the summary."""
    from confluent_kafka import Consumer

    from htmqc.runtime.launch import librdkafka_logger

    logger = librdkafka_logger()
    _, limit = limit_repeats()
    consumer = Consumer({
        "bootstrap.servers": "127.0.0.1:1", "group.id": "g", "logger": logger,
        "reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 20,
    })
    try:
        consumer.subscribe(["t"])
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline and limit.held_total < 5:
            consumer.poll(0.05)
    finally:
        consumer.close()
    refused = [m for m in lines.messages() if "Connection refused" in m]
    assert limit.held_total >= 5
    assert len(refused) == 1, refused
    held = limit.held_total
    unlimit_repeats()
    [summary] = [m for m in lines.messages() if "suppressed" in m]
    assert "Connection refused" in summary
    assert re.search(r"\(suppressed (\d+) similar lines in the last \d+ s\)$", summary)
    assert int(re.findall(r"suppressed (\d+)", summary)[0]) <= held


def test_build_engine_limits_htmqc_and_librdkafka_lines(
    lines: Lines, monkeypatch: pytest.MonkeyPatch
) -> None:
    import confluent_kafka

    from htmqc.runtime import launch

    configs: list[dict[str, Any]] = []
    real = confluent_kafka.Consumer

    def consumer(config: dict[str, Any]) -> Any:
        configs.append(config)
        return real(config)

    monkeypatch.setattr(launch, "check_topic", lambda *args: None)
    monkeypatch.setattr(confluent_kafka, "Consumer", consumer)
    opts = RunOptions(bootstrap="127.0.0.1:1", topic=TOPIC, group="g")
    engine = launch.build_engine(lambda msg: None, opts)
    try:
        htmqc, librdkafka = limit_repeats()
        for name in LIMITED_LOGGERS:
            assert htmqc in logging.getLogger(name).filters, name
        assert librdkafka in logging.getLogger(LIBRDKAFKA_LOGGER).filters
        assert (htmqc.burst, htmqc.window, librdkafka.burst, librdkafka.window) == (
            10, 60.0, 1, 30.0
        )
        [config] = configs
        assert config["logger"] is logging.getLogger(LIBRDKAFKA_LOGGER)
    finally:
        engine.discard()


# -- 4. the JSON schema, documented ------------------------------------------------------


def readme_fields() -> dict[str, str]:
    """The table of the README's "Log lines" section: field -> description."""
    text = README.read_text()
    section = text.split("#### Log lines", 1)[1].split("\n#", 1)[0]
    return dict(re.findall(r"^\| `(\w+)` +\| (.+?) *\|$", section, flags=re.M))


def test_the_readme_documents_exactly_the_json_fields() -> None:
    documented = readme_fields()
    assert list(documented) == list(JSON_FIELDS)
    for name, description in JSON_FIELDS.items():
        assert documented[name] == description.replace("|", "\\|"), name


def test_a_json_line_of_the_engine_holds_only_documented_fields(
    lines: Lines, tmp_path: Path
) -> None:
    def handler(msg: Any) -> None:
        raise Permanent("card\nexpired")

    run_at_least_once(handler, 1)
    fmt = JsonFormatter()
    docs = [json.loads(fmt.format(r)) for r in lines.records]
    dead = next(d for d in docs if d["msg"].startswith("dead-lettered"))
    assert list(dead) == [
        "ts", "level", "logger", "msg", "topic", "partition", "offset", "error", "attempt",
        "destination",
    ]
    assert (dead["partition"], dead["offset"], dead["attempt"]) == (2, 0, 1)
    assert dead["error"] == "Permanent: card expired"
    for doc in docs:
        assert set(REQUIRED_FIELDS) <= set(doc) <= set(JSON_FIELDS), doc
        keys = [k for k in JSON_FIELDS if k in doc]
        assert list(doc) == keys, "fields out of the documented order"
    record = logging.LogRecord("htmqc.runtime", logging.WARNING, __file__, 1, "x", (), None)
    record.suppressed = 4
    assert set(json.loads(fmt.format(record))) <= set(JSON_FIELDS)


def test_librdkafkas_own_suppressed_count_does_not_make_a_new_kind_of_line() -> None:
    """librdkafka appends ``, N identical error(s) suppressed`` to a line it has
    repeated; that line is still the same kind (a loaded box showed it passing the
    limit as a second 'Connection refused' line)."""
    from htmqc.logs import line_kind

    def record(text: str) -> logging.LogRecord:
        return logging.LogRecord("librdkafka", logging.ERROR, __file__, 0, text, None, None)

    first = "FAIL [c] 127.0.0.1:1: Connect failed: Connection refused (after 0ms in state CONNECT)"
    again = ("FAIL [c] 127.0.0.1:1: Connect failed: Connection refused (after 0ms in state "
             "CONNECT, 1 identical error(s) suppressed)")  # fmt: skip
    assert line_kind(record(first)) == line_kind(record(again))
