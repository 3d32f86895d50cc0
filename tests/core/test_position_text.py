"""The finished-above text form (:mod:`htmqc.core.position_text`) round-trips and
stays compact."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from htmqc.core.position_text import (
    MAX_DECODED_OFFSETS,
    decode_finished,
    decode_metadata,
    encode_finished,
    encode_metadata,
)


def test_example() -> None:
    assert encode_finished(100, [110, 103, 102, 104]) == "2:3,5"
    assert decode_finished(100, "2:3,5") == (102, 103, 104, 110)
    assert encode_finished(7, []) == "" and decode_finished(7, "") == ()


def test_offsets_below_committed_are_dropped() -> None:
    assert encode_finished(10, [3, 9, 10, 12]) == "0,1"


@given(st.integers(0, 2**40), st.sets(st.integers(0, 5000), max_size=200))
def test_round_trip(committed: int, rel: set[int]) -> None:
    offsets = {committed + r for r in rel}
    text = encode_finished(committed, offsets)
    assert decode_finished(committed, text) == tuple(sorted(offsets))
    assert decode_metadata(committed, encode_metadata(committed, offsets)) == tuple(sorted(offsets))


def test_long_runs_are_short() -> None:
    assert encode_finished(0, range(5, 100_005)) == "5:100000"


@pytest.mark.parametrize("bad", ["x", "1,-2", "1:0", "1:", ":3", "1,,2"])
def test_malformed_text_is_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        decode_finished(0, bad)


def test_foreign_metadata_means_nothing_finished_above() -> None:
    assert decode_metadata(5, "") == () and decode_metadata(5, None) == ()
    assert decode_metadata(5, "written by another tool") == ()


def test_the_decoding_cap_is_the_largest_window() -> None:
    """:data:`MAX_DECODED_OFFSETS` is the largest in-flight window the options
    allow (``--max-in-flight``'s upper limit): the most a consumer's own
    metadata can hold, and no more for a hostile one to make it allocate."""
    from dataclasses import fields

    from htmqc.runtime.options import RunOptions

    (window,) = [f for f in fields(RunOptions) if f.name == "max_in_flight"]
    assert window.metadata["htmqc"].limits[1] == MAX_DECODED_OFFSETS


@pytest.mark.parametrize("text", ["-1", "-1:2", "0:0", "0:-1", "3,-2"])
def test_negative_gaps_and_empty_runs_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="bad finished-above item"):
        decode_finished(100, text)


@pytest.mark.parametrize(
    ("text", "fits"),
    [("0:10", True), ("0:11", False), ("0:5,0:5", True), ("0:5,0:6", False),
     ("0:4,0:4,0:2", True), ("0:4,0:4,0:3", False), ("1,0:9", True), ("1,0:10", False)],
)
def test_the_cap_counts_every_offset_decoded_so_far(
    text: str, fits: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a cap of 10 (the real one is ten million): exactly 10 offsets
    decode, one more is refused, however the items split them."""
    from htmqc.core import position_text

    monkeypatch.setattr(position_text, "MAX_DECODED_OFFSETS", 10)
    if fits:
        assert len(decode_finished(0, text)) == 10
    else:
        with pytest.raises(ValueError, match="holds more than 10 offsets"):
            decode_finished(0, text)
