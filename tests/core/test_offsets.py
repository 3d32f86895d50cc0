"""The two forms of the offset invariant and the map between them."""

import itertools

from hypothesis import given
from hypothesis import strategies as st

from htmqc.core.offsets import (
    InclusiveWatermarks,
    Watermarks,
    from_inclusive,
    holds,
    holds_inclusive,
    to_inclusive,
)

ints = st.integers(-5, 10**12)


@given(ints, ints, ints)
def test_the_forms_agree_on_every_triple(c: int, p: int, n: int) -> None:
    w = Watermarks(c, p, n)
    assert holds(w) == holds_inclusive(to_inclusive(w))
    assert from_inclusive(to_inclusive(w)) == w


def test_the_forms_agree_on_every_small_triple() -> None:
    """Every triple around the boundaries (each value within 2 of the others):
    where ``<`` and ``<=`` differ, which random triples of large integers miss."""
    small = range(-2, 3)
    for c, p, n in itertools.product(small, small, small):
        w = Watermarks(c, p, n)
        inclusive = to_inclusive(w)
        assert holds(w) == (c <= p <= n)
        assert holds_inclusive(inclusive) == holds(w), (w, inclusive)
        assert from_inclusive(inclusive) == w


def test_the_seed_example() -> None:
    # Offsets 0..4 processed, 0..2 committed, fetched up to 7: Kafka form (3, 5, 8).
    w = Watermarks(committed=3, processed=5, next=8)
    assert to_inclusive(w) == InclusiveWatermarks(last_committed=2, last_processed=4, next=8)
    assert holds(w) and holds_inclusive(to_inclusive(w))
    # Nothing processed yet: last_processed = -1 < next = 0 holds, as processed = next = 0 does.
    assert holds_inclusive(to_inclusive(Watermarks(0, 0, 0)))
    assert not holds(Watermarks(4, 3, 8))
