"""Fuzzing every decoder of outside input (Hypothesis): only the documented
error type ever escapes, never anything else.

| decoder | input | documented error |
|---|---|---|
| ``htmqc.sinks.encoding.decode_metadata`` | Kafka commit metadata | ``ValueError`` |
| ``htmqc.config.load_toml`` / ``resolve`` | ``--config`` file, ``HTMQC_*``, CLI | ``UsageError`` |
| ``htmqc.sinks.urls.parse_sink_url`` (+ ``redact_url``) | ``--sink`` | ``UsageError`` (never) |
| ``htmqc.audit.load`` loaders | audit input files, ``sqlite:///`` sources | ``UsageError`` |
| ``model_checks.trace_validation`` | ``--trace`` files | ``UsageError`` (unreadable) |
| ``htmqc.replay.segment.SegmentReader`` | ``htmqc capture`` segment files | ``SegmentError`` |
| ``htmqc.dlq.headers.parse_headers`` | DLQ record headers | ``ValueError`` |

Each decoder gets arbitrary bytes/text and, where raw noise would stop at the
first check, structured input that gets past it (JSON lines of any shape,
TOML of known keys with values of any type, segment files with correct
checksums around arbitrary content, DLQ headers with the right names).
"""

from __future__ import annotations

import json
import math
import sqlite3
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from htmqc import secrets
from htmqc.audit import load
from htmqc.config import FIELDS, load_toml, resolve, url_passwords
from htmqc.dlq import headers as dlq_headers
from htmqc.errors import UsageError
from htmqc.replay import segment
from htmqc.sinks import encoding
from htmqc.sinks.encoding import METADATA_PREFIX, decode_metadata, encode_metadata
from htmqc.sinks.urls import parse_sink_url, redact_url
from model_checks import trace_validation

FUZZ = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    """``resolve`` remembers secret-looking values process-wide; start and end clean."""
    secrets.forget_all()
    yield
    secrets.forget_all()


def scratch(data: bytes, suffix: str = ".txt") -> Path:
    with tempfile.NamedTemporaryFile(suffix=suffix, delete=False) as f:
        f.write(data)
    return Path(f.name)


def only(errors: tuple[type[BaseException], ...], call: Callable[[], Any]) -> Any:
    """Run ``call``; a documented error is fine, anything else fails the test."""
    try:
        return call()
    except errors:
        return None


# -- commit metadata -------------------------------------------------------------------------

items = st.lists(
    st.tuples(st.integers(-5, 10**4), st.none() | st.integers(-5, 10**4)), max_size=20
).map(lambda xs: ",".join(f"{g}" if n is None else f"{g}:{n}" for g, n in xs))


@FUZZ
@given(
    committed=st.integers(0, 2**62),
    metadata=st.none() | st.text() | items.map(lambda t: METADATA_PREFIX + t)
    # max_size 8: at most "0:999999", so no run here is big enough to hurt
    | st.text(alphabet="0123456789:,-+ _x", max_size=8).map(lambda t: METADATA_PREFIX + t),
)  # fmt: skip
def test_decode_metadata_raises_only_value_error(committed: int, metadata: str | None) -> None:
    only((ValueError,), lambda: decode_metadata(committed, metadata))


@FUZZ
@given(committed=st.integers(0, 2**40), offsets=st.sets(st.integers(0, 2**41), max_size=50))
def test_decode_metadata_inverts_encode(committed: int, offsets: set[int]) -> None:
    text = encode_metadata(committed, offsets)
    assert decode_metadata(committed, text) == tuple(sorted(o for o in offsets if o >= committed))


def test_decode_metadata_refuses_absurd_runs() -> None:
    """A run of 10^12 offsets is hostile metadata, not a reason to allocate them."""
    # No cap: fail here (AttributeError), before allocating anything.
    cap: int = encoding.MAX_DECODED_OFFSETS  # type: ignore[attr-defined,unused-ignore]
    with pytest.raises(ValueError):
        decode_metadata(0, f"{METADATA_PREFIX}0:{cap + 1}")
    with pytest.raises(ValueError):
        decode_metadata(0, METADATA_PREFIX + "0:1000000000000")
    with pytest.raises(ValueError):
        decode_metadata(0, METADATA_PREFIX + ",".join([f"0:{cap // 2}"] * 3))


# -- configuration ---------------------------------------------------------------------------

SCALAR = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
TOML_VALUE = (
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.lists(st.integers(), max_size=3)
)
KEYS = st.sampled_from(sorted(FIELDS)) | st.text(min_size=1, max_size=12)


def toml_text(table: dict[str, Any]) -> str:
    lines = []
    for key, value in table.items():
        lines.append(f"{json.dumps(key)} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else ("inf" if value > 0 else "-inf")
            if math.isinf(value)
            else repr(value)
        )
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)


BASE_CLI = {"bootstrap": "127.0.0.1:1", "topic": "t", "group": "g"}


@FUZZ
@given(data=st.binary(max_size=300))
def test_load_toml_bytes_raise_only_usage_error(data: bytes) -> None:
    path = scratch(data, ".toml")
    try:
        only((UsageError,), lambda: load_toml(str(path)))
    finally:
        path.unlink()


@FUZZ
@given(
    run=st.dictionaries(KEYS, TOML_VALUE, max_size=6),
    kafka=st.dictionaries(st.text(min_size=1, max_size=20), TOML_VALUE, max_size=4),
    where=st.sampled_from(["top", "run"]),
)
def test_resolve_toml_of_any_types_raises_only_usage_error(
    run: dict[str, Any], kafka: dict[str, Any], where: str
) -> None:
    text = toml_text(run) if where == "top" else "[run]\n" + toml_text(run)
    text += "[kafka]\n" + toml_text(kafka)
    path = scratch(text.encode(), ".toml")
    try:
        opts = only((UsageError,), lambda: resolve(BASE_CLI, {}, config_file=str(path), environ={}))
    finally:
        path.unlink()
    if opts is not None:  # accepted: then every number is finite and within bounds
        for name in ("workers", "max_in_flight", "batch_size", "txn_ms", "commit_ms"):
            value = getattr(opts, name)
            assert isinstance(value, (int, float)) and math.isfinite(value)


@FUZZ
@given(
    env=st.dictionaries(
        st.sampled_from([f"HTMQC_{n.upper()}" for n in FIELDS] + ["HTMQC_KAFKA_CONFIG"]),
        st.text(max_size=30),
        max_size=6,
    ),
    cli=st.dictionaries(st.sampled_from(sorted(FIELDS)), SCALAR, max_size=4),
    pairs=st.lists(st.text(max_size=20), max_size=4),
)
def test_resolve_env_and_cli_raise_only_usage_error(
    env: dict[str, str], cli: dict[str, Any], pairs: list[str]
) -> None:
    from htmqc.config import parse_pairs

    def go() -> Any:
        return resolve({**BASE_CLI, **cli}, parse_pairs(pairs, "--kafka-config"), environ=env)

    only((UsageError,), go)


# -- sink URLs -------------------------------------------------------------------------------

URLS = st.text() | st.tuples(
    st.sampled_from(
        ["sqlite:", "sqlite:///", "postgresql://", "postgres://", "kafka:", "redis://"]
    ),
    st.text(max_size=40),
).map("".join)


@FUZZ
@given(url=URLS)
def test_sink_urls_raise_only_usage_error(url: str) -> None:
    only((UsageError,), lambda: parse_sink_url(url))
    assert isinstance(redact_url(url), str)
    for password in url_passwords(url):
        assert isinstance(password, str) and password


@FUZZ
@given(user=st.text("abc", min_size=1, max_size=5), password=st.text(min_size=4, max_size=20))
def test_sink_url_errors_never_quote_the_password(user: str, password: str) -> None:
    from urllib.parse import quote

    password = "PW" + password  # never a substring of the user or the rest of the URL
    url = f"postgresql://{user}:{quote(password, safe='')}@host/db?table_prefix=bad-prefix"
    with pytest.raises(UsageError) as err:
        parse_sink_url(url)
    assert quote(password, safe="") not in err.value.line()


# -- audit loaders ---------------------------------------------------------------------------

LOADERS = [
    load.produced_from_jsonl,
    load.effects_from_jsonl,
    load.dlq_from_jsonl,
    load.commits_from_jsonl,
    load.aborted_from_file,
    load.effects_from_source,
]


def jsonl(values: list[Any]) -> bytes:
    return "\n".join(json.dumps(v) for v in values).encode()


@FUZZ
@given(
    data=st.binary(max_size=300) | st.lists(JSON, max_size=5).map(jsonl),
    loader=st.sampled_from(LOADERS),
)
def test_audit_loaders_raise_only_usage_error(data: bytes, loader: Any) -> None:
    path = scratch(data, ".jsonl")
    try:
        only((UsageError,), lambda: list(loader(str(path))))
    finally:
        path.unlink()


@pytest.fixture(scope="module")
def effects_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audit") / "effects.db"
    with sqlite3.connect(path) as conn:
        conn.execute('CREATE TABLE effects (id TEXT, key TEXT, "partition" INT, "offset" INT)')
        conn.execute("INSERT INTO effects VALUES ('a', 'k', 0, 1), (NULL, NULL, 'x', 2.5)")
        conn.execute('CREATE TABLE "odd ""name" (id BLOB)')
        conn.execute('INSERT INTO "odd ""name" VALUES (x\'ff00\')')
    conn.close()
    return path


@FUZZ
@given(query=st.text(max_size=40) | st.sampled_from(["table=odd%20%22name", "id=key", "table=x"]))
def test_audit_sqlite_sources_raise_only_usage_error(effects_db: Path, query: str) -> None:
    only((UsageError,), lambda: list(load.effects_from_source(f"sqlite:///{effects_db}?{query}")))


def test_audit_loaders_on_a_non_database(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    with pytest.raises(UsageError):
        list(load.effects_from_source(f"sqlite:///{garbage}"))


# -- traces ----------------------------------------------------------------------------------

EVENTS = sorted(trace_validation.EVENTS)
TRACE_LINE = st.fixed_dictionaries(
    {
        "p": st.sampled_from(["t/0", "t/1", "t", "/", "t/x"]) | st.text(max_size=5),
        "ev": st.sampled_from(EVENTS) | st.text(max_size=5),
        "state": st.fixed_dictionaries(
            {
                "next": st.integers(-2, 6) | JSON,
                "processed": st.integers(-2, 6),
                "committed": st.integers(-2, 6),
            }
        )
        | JSON,
    },
    optional={"off": st.integers(-2, 8) | JSON, "above": st.lists(st.integers(-1, 8)) | JSON},
)


@FUZZ
@given(data=st.binary(max_size=300) | st.lists(TRACE_LINE, max_size=8).map(jsonl))
# found by this test: a null "above" was iterated (TypeError instead of a usage error)
@example(data=b'{"p":"t/0","ev":"assign","state":{"next":0,"processed":0,"committed":0},"above":null}')
def test_trace_reading_and_validation_raise_only_usage_error(data: bytes) -> None:
    path = scratch(data + b"\n", ".jsonl")
    try:
        only((UsageError,), lambda: trace_validation.read_trace(path))
        report = only((UsageError,), lambda: trace_validation.validate_trace(path, tlc=False))
        if report is not None:
            assert isinstance(report.summary(), str)
    finally:
        path.unlink()


# -- capture segments ------------------------------------------------------------------------


def assemble(table: bytes, bodies: list[bytes]) -> bytes:
    """A segment file with correct lengths and checksums around any content."""
    records = b"".join(struct.pack("<II", len(b), zlib.crc32(b)) + b for b in bodies)
    head = struct.pack("<8sHHIQQQ", segment.MAGIC, segment.VERSION, 0, len(table),
                       len(bodies), len(records), 0)  # fmt: skip
    return head + struct.pack("<I", zlib.crc32(head + table)) + table + records


def read_all(path: Path) -> None:
    with segment.SegmentReader(path) as reader:
        for msg in reader:
            msg.key(), msg.value(), msg.headers(), msg.topic(), msg.offset(), msg.timestamp()


VALID_TABLE = struct.pack("<I", 1) + struct.pack("<H", 1) + b"t" + struct.pack("<iqq", 0, 0, 10)


@FUZZ
@given(
    data=st.binary(max_size=400)
    | st.builds(assemble, st.binary(max_size=60), st.lists(st.binary(max_size=60), max_size=3))
    | st.builds(
        assemble,
        st.just(VALID_TABLE),
        st.lists(
            st.binary(max_size=80)
            | st.builds(
                lambda off, k, v, h: segment.encode_record("t", 0, off, 0, 0, k, v, h)[8:],
                st.integers(-1, 12),
                st.none() | st.binary(max_size=8),
                st.none() | st.binary(max_size=8),
                st.lists(st.tuples(st.text(max_size=3), st.none() | st.binary(max_size=4)),
                         max_size=2),
            ),
            max_size=4,
        ),
    )
)  # fmt: skip
def test_segment_reader_raises_only_segment_error(data: bytes) -> None:
    path = scratch(data, ".seg")
    try:
        only((segment.SegmentError,), lambda: read_all(path))
    finally:
        path.unlink()


# -- DLQ headers -----------------------------------------------------------------------------

NAMES = st.sampled_from(sorted(dlq_headers._KNOWN)) | st.text(max_size=12)
VALUES = (
    st.none()
    | st.binary(max_size=30)
    | st.sampled_from(
        [b"0", b"17", b"-1", b"1e999", b"nan", b"permanent", b"t/0/1", b"x" * 5000, b"\xff"]
    )
)
HEADERS = st.lists(st.tuples(NAMES, VALUES), max_size=16)


@FUZZ
@given(headers=HEADERS | st.just(None) | JSON)
def test_dlq_parse_headers_raises_only_value_error(headers: Any) -> None:
    only((ValueError,), lambda: dlq_headers.parse_headers(headers))
