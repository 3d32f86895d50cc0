"""Dead-letter headers: round trip, scrubbing, bounds, strict parsing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from htmqc import secrets
from htmqc.dlq.headers import (
    MAX_MESSAGE_BYTES,
    MAX_STACK_BYTES,
    PREFIX,
    dlq_headers,
    parse_headers,
    written_info,
)
from htmqc.dlq.record import DLQ_KINDS, DeadLetterInfo
from tests.dlq.support import Msg, info

topics = st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True)
names = st.text(max_size=20).filter(
    lambda n: not n.startswith(PREFIX) and not n.startswith("htmqc-retry")
)
header_lists = st.lists(st.tuples(names, st.none() | st.binary(max_size=30)), max_size=5)
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
infos = st.builds(
    DeadLetterInfo,
    kind=st.sampled_from(DLQ_KINDS),
    error_class=st.text(max_size=80),
    error_message=st.text(max_size=6000),
    stack=st.text(max_size=10000),
    retries=st.integers(0, 10**6),
    first_failure_at=times,
    last_failure_at=times,
    group=st.text(max_size=40),
)
messages = st.builds(
    Msg,
    t=topics,
    p=st.integers(0, 2**31 - 1),
    o=st.integers(0, 2**62),
    k=st.none() | st.binary(max_size=40),
    v=st.none() | st.binary(max_size=40),
    h=st.none() | header_lists,
)


@pytest.fixture(autouse=True)
def _no_secrets() -> Iterator[None]:
    secrets.forget_all()
    yield
    secrets.forget_all()


@settings(max_examples=150)
@given(msg=messages, dead=infos)
def test_headers_round_trip(msg: Msg, dead: DeadLetterInfo) -> None:
    meta = parse_headers(dlq_headers(msg, dead))
    assert (meta.topic, meta.partition, meta.offset) == (msg.t, msg.p, msg.o)
    assert meta.key == msg.k
    assert meta.info == written_info(dead)
    assert meta.headers == tuple(msg.h or ())
    assert meta.source == f"{msg.t}/{msg.p}/{msg.o}"
    assert len(meta.reason.splitlines()) <= 1


def test_small_values_round_trip_unchanged() -> None:
    dead = info(message="id 5 is poison\nsecond line")
    meta = parse_headers(dlq_headers(Msg("t", 3, 42, b"k", b"v", [("a", b"1"), ("n", None)]), dead))
    assert meta.info == dead
    assert meta.reason == "ValueError: id 5 is poison"
    assert meta.headers == (("a", b"1"), ("n", None))


def test_error_text_is_scrubbed() -> None:
    secrets.remember("hunter2-password")
    dead = info(message="login with hunter2-password failed")
    headers = dlq_headers(Msg("t", 0, 1, None, b"v"), dead)
    assert not any(b"hunter2" in (v or b"") for _, v in headers)
    meta = parse_headers(headers)
    assert meta.info.error_message == "login with *** failed"
    assert "hunter2" not in meta.info.stack and "hunter2" not in meta.reason


def test_long_text_is_bounded_and_the_stack_keeps_its_end() -> None:
    dead = DeadLetterInfo(
        kind="failed",
        error_class="x.E",
        error_message="é" * 10_000,
        stack="start\n" + "x" * 20_000 + "\nEND",
        retries=0,
        first_failure_at=1.0,
        last_failure_at=2.0,
        group="g",
    )
    values = dict(dlq_headers(Msg("t", 0, 1, None, b"v"), dead))
    assert len(values[PREFIX + "error-message"]) <= MAX_MESSAGE_BYTES
    assert len(values[PREFIX + "stack"]) <= MAX_STACK_BYTES
    meta = parse_headers(list(values.items()))
    assert meta.info.stack.endswith("\nEND") and not meta.info.stack.startswith("start")
    assert set(meta.info.error_message) == {"é"}


def test_retry_topic_record_keeps_its_first_position_and_sheds_retry_headers() -> None:
    msg = Msg(
        "t.retry",
        0,
        7,
        b"k",
        b"v",
        [("app", b"1"), ("htmqc-retry-of", b"t/3/99"), ("htmqc-retry-attempt", b"2")],
    )
    meta = parse_headers(dlq_headers(msg, info()))
    assert (meta.topic, meta.partition, meta.offset) == ("t", 3, 99)
    assert meta.source == "t.retry/0/7"
    assert meta.headers == (("app", b"1"),)


def test_dead_lettering_a_dead_letter_replaces_the_old_headers() -> None:
    first = dlq_headers(Msg("t", 0, 1, b"k", b"v"), info(message="one"))
    again = dlq_headers(Msg("t", 0, 9, b"k", b"v", list(first)), info(message="two"))
    meta = parse_headers(again)
    assert meta.offset == 9 and meta.info.error_message == "two"


def _good() -> list[tuple[str, Any]]:
    return list(dlq_headers(Msg("t", 0, 1, b"k", b"v"), info()))


def _replace(name: str, value: Any) -> list[tuple[str, Any]]:
    return [(k, value if k == PREFIX + name else v) for k, v in _good()]


@pytest.mark.parametrize(
    "headers",
    [
        None,
        42,
        "htmqc-dlq-topic",
        {"a": b"b"},
        [],
        [("only", b"app")],
        [("a",)],
        [(1, b"x")],
        [("a", "text not bytes")],
        [h for h in _good() if h[0] != PREFIX + "kind"],
        [*_good(), (PREFIX + "kind", b"failed")],
        [*_good(), (PREFIX + "bogus", b"1")],
        _replace("kind", b"melted"),
        _replace("partition", b"-1"),
        _replace("partition", b" 1"),
        _replace("partition", b"99999999999"),
        _replace("offset", b"1e3"),
        _replace("retries", b"\xff"),
        _replace("first-failure", b"nan"),
        _replace("last-failure", b"inf"),
        _replace("topic", b"a/b"),
        _replace("source", b"t/0"),
        _replace("group", None),
    ],
)
def test_malformed_headers_raise_value_error(headers: Any) -> None:
    with pytest.raises(ValueError):
        parse_headers(headers)


junk = st.recursive(
    st.none() | st.binary(max_size=8) | st.text(max_size=8) | st.integers(),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner),
    max_leaves=12,
)
dlq_names = st.sampled_from([n for n, _ in _good()]) | st.text(max_size=20)


@given(
    base=st.lists(st.tuples(dlq_names, st.none() | st.binary(max_size=40)), max_size=20),
    junk_value=junk,
)
def test_any_input_is_parsed_or_refused_with_value_error(base: list[Any], junk_value: Any) -> None:
    for headers in (base, [*_good(), *base], junk_value, [junk_value]):
        with contextlib.suppress(ValueError):  # anything else fails the test
            parse_headers(headers)


@pytest.mark.parametrize("seconds", [0.00021323250907199237, 1e-05, 0.0, 1795425905.280123])
def test_failure_times_of_any_repr_round_trip(seconds: float) -> None:
    """repr() writes up to 20 digits after the point (0.000213...): found by the
    round-trip property above."""
    from htmqc.dlq.headers import _seconds, _time

    assert _time("t", _seconds(seconds)) == seconds
