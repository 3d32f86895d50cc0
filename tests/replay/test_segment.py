"""The segment format: round trip, zero-copy reads, named errors, fuzzing."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from htmqc.replay import PartitionRange, SegmentError, SegmentReader, SegmentWriter
from htmqc.replay.segment import MAGIC

Record = tuple[int, int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def write_segment(path: Path, records: list[Record], ranges: dict[int, tuple[int, int]]) -> Path:
    with SegmentWriter(path, [PartitionRange("t", p, a, b) for p, (a, b) in ranges.items()]) as w:
        for partition, offset, ts, key, value, headers in records:
            w.append("t", partition, offset, ts, 0, key, value, headers)
    return path


SAMPLE: list[Record] = [
    (0, 0, 1000, b"k0", b"v0", [("h", b"1"), ("none", None)]),
    (1, 5, 1001, None, b"", []),
    (0, 2, 1002, b"k1", None, []),
    (1, 6, 1003, b"", b"x" * 300, [("ÿ", b"\x00\xff")]),
]
SAMPLE_RANGES = {0: (0, 4), 1: (5, 8)}


@pytest.fixture
def sample(tmp_path: Path) -> bytes:
    return write_segment(tmp_path / "s.seg", SAMPLE, SAMPLE_RANGES).read_bytes()


def test_round_trip_keeps_order_and_fields(tmp_path: Path) -> None:
    path = write_segment(tmp_path / "s.seg", SAMPLE, SAMPLE_RANGES)
    assert not (tmp_path / "s.seg.tmp").exists()
    with SegmentReader(path) as reader:
        assert len(reader) == 4
        assert reader.ranges[("t", 1)] == PartitionRange("t", 1, 5, 8)
        got = [
            (m.partition(), m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers() or [])
            for m in reader
        ]
        assert got == SAMPLE
        assert [m.index for m in reader] == [0, 1, 2, 3]
        assert reader[3].topic() == "t" and len(reader[3]) == 300
        assert reader[3].error() is None


def test_values_are_views_of_the_mapping(tmp_path: Path) -> None:
    path = write_segment(tmp_path / "s.seg", SAMPLE, SAMPLE_RANGES)
    reader = SegmentReader(path)
    msg = reader[3]
    view = msg.value_view()
    assert isinstance(view, memoryview) and isinstance(view.obj, mmap.mmap)
    assert view.readonly and bytes(view) == b"x" * 300
    del view, msg
    reader.close()


def test_writer_refuses_out_of_range_and_backwards(tmp_path: Path) -> None:
    w = SegmentWriter(tmp_path / "w.seg", [PartitionRange("t", 0, 10, 20)])
    with pytest.raises(ValueError, match="outside its range"):
        w.append("t", 0, 20, 0, 0, None, b"")
    w.append("t", 0, 12, 0, 0, None, b"")
    with pytest.raises(ValueError, match="must increase"):
        w.append("t", 0, 12, 0, 0, None, b"")
    w.abort()
    assert not (tmp_path / "w.seg").exists() and not (tmp_path / "w.seg.tmp").exists()


def test_empty_segment(tmp_path: Path) -> None:
    path = write_segment(tmp_path / "e.seg", [], {0: (3, 3)})
    with SegmentReader(path) as reader:
        assert len(reader) == 0 and list(reader) == []


def problem(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "bad.seg"
    path.write_bytes(data)
    with pytest.raises(SegmentError) as info:
        SegmentReader(path)
    line = info.value.line()
    assert "\n" not in line and line.startswith(f"segment {path}: ")
    return line


def test_errors_name_the_problem(tmp_path: Path, sample: bytes) -> None:
    assert "shorter than the 44-byte header" in problem(tmp_path, sample[:10])
    assert "truncated:" in problem(tmp_path, sample[:-1])
    assert "unexpected bytes after the records" in problem(tmp_path, sample + b"\0")
    assert "bad magic" in problem(tmp_path, b"NOTASEGM" + sample[8:])
    assert "header checksum" in problem(tmp_path, sample[:33] + b"\x01" + sample[34:])
    newer = sample[:8] + struct.pack("<H", 2) + sample[10:]
    assert "format version 2" in problem(tmp_path, newer)
    flipped = bytearray(sample)
    flipped[-5] ^= 0xFF
    assert "record 3 at byte" in problem(tmp_path, bytes(flipped))
    assert "checksum mismatch" in problem(tmp_path, bytes(flipped))
    with pytest.raises(SegmentError, match="cannot open"):
        SegmentReader(tmp_path / "missing.seg")


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400))
def test_fuzz_arbitrary_bytes(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "f.seg"
    path.write_bytes(MAGIC + data if len(data) % 2 else data)
    try:
        with SegmentReader(path) as reader:
            list(reader)
    except SegmentError:
        pass


@settings(max_examples=300, deadline=None)
@given(
    cut=st.integers(min_value=0, max_value=10_000),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=4),
    insert=st.binary(max_size=8),
)
def test_fuzz_damaged_segments(
    tmp_path_factory: pytest.TempPathFactory,
    cut: int,
    flips: list[tuple[int, int]],
    insert: bytes,
) -> None:
    """Damage a valid segment: only SegmentError escapes, and whatever is
    accepted decodes completely."""
    base = tmp_path_factory.mktemp("dmg")
    good = write_segment(base / "g.seg", SAMPLE, SAMPLE_RANGES).read_bytes()
    data = bytearray(good)
    for at, mask in flips:
        data[at % len(data)] ^= mask
    at = cut % (len(data) + 1)
    damaged = bytes(data[:at]) + insert + bytes(data[at + (1 if insert else 0) :])
    path = base / "d.seg"
    path.write_bytes(damaged)
    try:
        with SegmentReader(path) as reader:
            msgs = [(m.key(), m.value(), m.headers()) for m in reader]
    except SegmentError:
        return
    assert len(msgs) == len(SAMPLE)
    assert damaged == good  # every byte is under a checksum or checked against one
