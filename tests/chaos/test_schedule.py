"""The fault schedule: a pure function of the seed; mixed kinds; valid fields."""

from __future__ import annotations

import pytest

from htmqc.chaos.schedule import BROKER_KINDS, FAMILIES, KINDS, build_schedule, parse_kinds
from htmqc.errors import UsageError


def test_same_seed_same_schedule() -> None:
    a = build_schedule(42, 20, consumers=3, messages=1_000_000)
    b = build_schedule(42, 20, consumers=3, messages=1_000_000)
    assert a == b
    assert [f.to_json() for f in a] == [f.to_json() for f in b]


def test_another_seed_another_schedule() -> None:
    a = build_schedule(1, 10, consumers=2, messages=100_000)
    b = build_schedule(2, 10, consumers=2, messages=100_000)
    assert a != b


def test_pinned_schedule() -> None:
    """A change to the drawing order changes every recorded seed: caught here."""
    kinds = [(f.kind, f.at) for f in build_schedule(20, 5, consumers=2, messages=100_000)]
    assert kinds == [
        ("poison", 0.0),
        ("net-delay", 0.0716),
        ("kill", 0.2579),
        ("sink-error", 0.3796),
        ("kill", 0.5086),
    ]


def test_four_consecutive_faults_cover_every_family() -> None:
    for seed in range(30):
        faults = sorted(build_schedule(seed, 4, consumers=2, messages=1000), key=lambda f: f.index)
        assert [next(i for i, fam in enumerate(FAMILIES) if f.kind in fam) for f in faults] == [
            0,
            1,
            2,
            3,
        ]


def test_fields_are_in_range() -> None:
    for seed in range(50):
        for f in build_schedule(seed, 12, consumers=3, messages=500, session_timeout_s=6):
            assert f.kind in KINDS
            if f.kind == "poison":
                assert f.ids and all(0 <= i < 500 for i in f.ids) and f.at == 0.0
                continue
            assert 0.05 <= f.at <= 0.85 and f.seconds > 0
            if f.kind in ("kill", "zombie"):
                assert f.consumer in (0, 1, 2)
            if f.kind == "zombie":
                assert f.seconds > 6  # past the session timeout
            if f.kind == "net-delay":
                assert f.delay_ms > 0
            if f.kind in ("sink-error", "handler-error"):
                assert 0 < f.rate < 1
            if f.kind in ("sink-slow", "sink-error", "handler-error"):
                assert f.consumer is None


def test_kinds_restrict_the_draw() -> None:
    faults = build_schedule(3, 6, consumers=2, messages=100, kinds=("zombie",))
    assert {f.kind for f in faults} == {"zombie"}


def test_parse_kinds() -> None:
    assert parse_kinds("all") == KINDS
    assert parse_kinds(None) == KINDS
    assert parse_kinds("kill, net-drop") == ("kill", "net-drop")
    with pytest.raises(UsageError, match="unknown fault kind"):
        parse_kinds("kill,meteor")


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(UsageError, match="negative"):
        build_schedule(1, -1, consumers=1, messages=1)
    with pytest.raises(UsageError, match="at least one consumer"):
        build_schedule(1, 1, consumers=0, messages=1)
    with pytest.raises(UsageError, match="no fault kind"):
        build_schedule(1, 1, consumers=1, messages=1, kinds=())


def test_broker_faults_take_every_even_slot_and_rotate_through_the_kinds() -> None:
    for seed in range(30):
        faults = sorted(
            build_schedule(seed, 24, consumers=3, messages=1000, kinds=KINDS, partitions=8),
            key=lambda f: f.index,
        )
        assert [f.kind in BROKER_KINDS for f in faults] == [i % 2 == 0 for i in range(24)]
        broker = [f.kind for f in faults if f.kind in BROKER_KINDS]
        rotation = broker[: len(BROKER_KINDS)]
        assert sorted(rotation) == sorted(BROKER_KINDS)  # 7 broker faults cover all 7 kinds
        assert broker == [rotation[j % len(rotation)] for j in range(len(broker))]
        consumer = [f for f in faults if f.kind not in BROKER_KINDS]
        families = [next(i for i, fam in enumerate(FAMILIES) if f.kind in fam) for f in consumer]
        assert families == [j % 4 for j in range(len(consumer))]


def test_broker_fault_fields_are_in_range() -> None:
    for seed in range(50):
        schedule = build_schedule(
            seed, 14, consumers=3, messages=500, kinds=BROKER_KINDS, partitions=8,
            nodes=3, broker_session_s=9.0,
        )  # fmt: skip
        assert all(f.kind in BROKER_KINDS for f in schedule)
        for f in schedule:
            assert 0.05 <= f.at <= 0.85
            if f.kind == "broker-kill-leader":
                assert f.partition in range(8) and f.node is None and f.seconds >= 1
            elif f.kind == "broker-kill-coordinator":
                assert f.consumer in (0, 1, 2) and f.node is None
            elif f.kind in ("broker-kill-controller", "broker-rolling-restart"):
                assert f.node is None and f.partition is None
            else:
                assert f.node in (1, 2, 3) and f.seconds >= 2
            if f.kind == "broker-pause":
                assert f.seconds > 9.0  # past the broker session
