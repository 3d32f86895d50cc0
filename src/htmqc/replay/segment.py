"""Segment files: a captured topic range, read back memory-mapped and zero-copy.

Format, version 1 (all integers little-endian; ``i``/``u`` = signed/unsigned)
--------------------------------------------------------------------------

::

    header    44 bytes
      0   8s  magic  b"HTMQCSEG"
      8   u16 version (1)
      10  u16 reserved (0)
      12  u32 T: length of the partition table in bytes
      16  u64 N: number of records
      24  u64 R: length of the record area in bytes
      32  u64 created_at: milliseconds since the epoch (informational)
      40  u32 CRC-32 of header bytes 0..40 followed by the partition table
    partition table   T bytes
      u32 entries; per entry: u16 topic length, topic (UTF-8), i32 partition,
      i64 start, i64 end: the captured range [start, end) of that partition
      (offsets missing inside it are gaps: compaction, transaction markers)
    record area   R bytes, N framed records, in delivery order
      u32 body length L, u32 CRC-32 of the body, body (L bytes):
        i32 partition, i64 offset, i64 timestamp (ms), i8 timestamp type,
        u16 topic length, topic (UTF-8),
        i32 key length (-1: no key), key,
        i32 value length (-1: no value), value,
        u16 header count; per header: u16 name length, name (UTF-8),
        i32 value length (-1: none), value

The file is exactly ``44 + T + R`` bytes. Offsets of one partition are strictly
increasing and inside its table range. :class:`SegmentWriter` writes to
``PATH.tmp`` and renames it on :meth:`~SegmentWriter.close`, so a segment
file is either complete or absent.

Reading: :class:`SegmentReader` maps the file (``mmap``), checks the header,
its checksum and the file length, then every record's frame, checksum and
fields (one pass, building an index of record positions) before anything is
served. :class:`SegmentMessage` keeps its key, value and header values as
``memoryview`` slices of the mapping: nothing is copied until ``key()`` /
``value()`` (which return ``bytes``, as confluent-kafka's ``Message`` does) or
use :meth:`SegmentMessage.value_view` for no copy at all. Any problem with the
file is a :class:`SegmentError` (a one-line :class:`~htmqc.errors.RuntimeFailure`,
exit 1) naming the problem and the byte position; no other exception escapes
the reader for any file content.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from htmqc.errors import RuntimeFailure

MAGIC = b"HTMQCSEG"
VERSION = 1
_HEADER = struct.Struct("<8sHHIQQQI")
HEADER_SIZE = _HEADER.size  # 44
_FRAME = struct.Struct("<II")
_FIXED = struct.Struct("<iqqbH")  # partition, offset, timestamp, type, topic length
_I32 = struct.Struct("<i")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_ENTRY = struct.Struct("<iqq")
#: Bounds that keep a corrupt length from asking for absurd work.
MAX_RECORD_BYTES = 1 << 30


class SegmentError(RuntimeFailure):
    """The segment file is corrupt, truncated or not a segment (exit 1)."""

    def __init__(
        self, path: str | Path, problem: str, fix: str = "capture the range again (htmqc capture)"
    ) -> None:
        super().__init__(f"segment {path}: {problem}", fix)


@dataclass(frozen=True)
class PartitionRange:
    """The captured range ``[start, end)`` of one partition."""

    topic: str
    partition: int
    start: int
    end: int


class SegmentMessage:
    """One record, with the ``confluent_kafka.Message`` methods the runtime uses.

    Key, value and header values are ``memoryview`` slices of the mapped file.
    """

    __slots__ = (
        "_headers",
        "_key",
        "_offset",
        "_partition",
        "_topic",
        "_ts",
        "_ts_type",
        "_value",
        "index",
    )

    def __init__(
        self,
        index: int,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        ts_type: int,
        key: memoryview | None,
        value: memoryview | None,
        headers: list[tuple[str, memoryview | None]],
    ) -> None:
        self.index = index  #: position of the record in the segment (0-based)
        self._topic, self._partition, self._offset = topic, partition, offset
        self._ts, self._ts_type = timestamp, ts_type
        self._key, self._value, self._headers = key, value, headers

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return None if self._key is None else bytes(self._key)

    def value(self) -> bytes | None:
        return None if self._value is None else bytes(self._value)

    def value_view(self) -> memoryview | None:
        """The value without a copy (valid while the reader is open)."""
        return self._value

    def key_view(self) -> memoryview | None:
        """The key without a copy (valid while the reader is open)."""
        return self._key

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        if not self._headers:
            return None
        return [(n, None if v is None else bytes(v)) for n, v in self._headers]

    def timestamp(self) -> tuple[int, int]:
        return (self._ts_type, self._ts)

    def error(self) -> Any:
        """Always ``None``: a captured record carries no error."""
        return None

    def __len__(self) -> int:
        return 0 if self._value is None else len(self._value)

    def __repr__(self) -> str:
        return f"SegmentMessage({self._topic}/{self._partition}@{self._offset})"


# -- writing ------------------------------------------------------------------------------


def _opt(data: bytes | None) -> bytes:
    if data is None:
        return _I32.pack(-1)
    return _I32.pack(len(data)) + data


def encode_record(
    topic: str,
    partition: int,
    offset: int,
    timestamp: int,
    ts_type: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] = (),
) -> bytes:
    """One framed record (length, CRC-32, body) as laid out in the module docs."""
    name = topic.encode()
    parts = [
        _FIXED.pack(partition, offset, timestamp, ts_type, len(name)),
        name,
        _opt(key),
        _opt(value),
        _U16.pack(len(headers)),
    ]
    for hname, hvalue in headers:
        raw = hname.encode()
        parts += [_U16.pack(len(raw)), raw, _opt(hvalue)]
    body = b"".join(parts)
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


class SegmentWriter:
    """Writes a segment (see module docs); :meth:`close` makes it appear atomically.

    ``ranges``: the captured range of every partition, given before the records
    (an end may be moved later with :meth:`set_end`).
    """

    def __init__(self, path: str | Path, ranges: Sequence[PartitionRange]) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        self._ranges = {(r.topic, r.partition): r for r in ranges}
        table = [_U32.pack(len(self._ranges))]
        size = 4
        self._end_at: dict[tuple[str, int], int] = {}
        for (topic, partition), r in sorted(self._ranges.items()):
            if not 0 <= r.start <= r.end or partition < 0:
                raise ValueError(f"bad range [{r.start}, {r.end}) of {topic}/{partition}")
            name = topic.encode()
            table += [_U16.pack(len(name)), name, _ENTRY.pack(partition, r.start, r.end)]
            size += 2 + len(name) + _ENTRY.size
            self._end_at[(topic, partition)] = size - 8
        self._table = bytearray(b"".join(table))
        self._last: dict[tuple[str, int], int] = {}
        self.count = 0
        self._length = 0
        self._out: IO[bytes] = open(self._tmp, "wb")  # noqa: SIM115
        self._out.write(b"\0" * HEADER_SIZE + self._table)  # header written by close

    @property
    def ranges(self) -> dict[tuple[str, int], PartitionRange]:
        """The ranges as they stand (ends moved by :meth:`set_end`)."""
        return dict(self._ranges)

    def set_end(self, topic: str, partition: int, end: int) -> None:
        """Move the end of a partition's range (a capture that read "to the end"
        learns it last). It must stay above every record written and the start.

        :raises ValueError: ``end`` below the start or a written offset.
        """
        tp = (topic, partition)
        r = self._ranges[tp]
        if end < r.start or end <= self._last.get(tp, -1):
            raise ValueError(f"end {end} of {topic}/{partition} is below its records")
        self._ranges[tp] = PartitionRange(topic, partition, r.start, end)
        struct.pack_into("<q", self._table, self._end_at[tp], end)

    def append(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        ts_type: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> None:
        """Add one record (offsets of a partition must increase, inside its range).

        :raises ValueError: the offset is outside its range or not increasing.
        """
        tp = (topic, partition)
        bounds = self._ranges.get(tp)
        if bounds is None or not bounds.start <= offset < bounds.end:
            raise ValueError(f"offset {offset} of {topic}/{partition} is outside its range")
        if offset <= self._last.get(tp, -1):
            raise ValueError(f"offsets of {topic}/{partition} must increase")
        self._last[tp] = offset
        frame = encode_record(topic, partition, offset, timestamp, ts_type, key, value, headers)
        self._out.write(frame)
        self._length += len(frame)
        self.count += 1

    def close(self) -> Path:
        """Write the header, fsync, rename into place; return the path."""
        head = _HEADER.pack(
            MAGIC,
            VERSION,
            0,
            len(self._table),
            self.count,
            self._length,
            int(time.time() * 1000),
            0,
        )[:40]
        out = self._out
        out.seek(0)
        out.write(head + _U32.pack(zlib.crc32(self._table, zlib.crc32(head))) + self._table)
        out.flush()
        os.fsync(out.fileno())
        out.close()
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Drop the partial file."""
        self._out.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


# -- reading ------------------------------------------------------------------------------


class SegmentReader:
    """A segment file, mapped and checked (see module docs).

    :raises SegmentError: the file is missing, truncated, corrupt or not a segment.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < HEADER_SIZE:
                    raise SegmentError(
                        self.path,
                        f"truncated: {size} bytes, shorter than the {HEADER_SIZE}-byte header",
                    )
                self._map: mmap.mmap | None = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise SegmentError(
                self.path, f"cannot open: {exc.strerror or exc}", "check the path"
            ) from None
        self._view = memoryview(self._map)
        try:
            self.ranges, self._start = self._read_header(size)
            self.index = self._scan()
        except BaseException:
            self.close()
            raise

    # header and table
    def _read_header(self, size: int) -> tuple[dict[tuple[str, int], PartitionRange], int]:
        magic, version, _res, tlen, count, rlen, created, crc = _HEADER.unpack_from(self._view, 0)
        if magic != MAGIC:
            raise SegmentError(self.path, "not a segment file (bad magic)")
        if version != VERSION:
            raise SegmentError(self.path, f"format version {version}, this htmqc reads {VERSION}")
        self.count, self.created_at = count, created
        if HEADER_SIZE + tlen > size:
            raise SegmentError(self.path, f"truncated: the partition table needs {tlen} bytes")
        table = self._view[HEADER_SIZE : HEADER_SIZE + tlen]
        if zlib.crc32(table, zlib.crc32(self._view[:40])) != crc:
            raise SegmentError(self.path, "header checksum mismatch (corrupt header)")
        expected = HEADER_SIZE + tlen + rlen
        if size < expected:
            raise SegmentError(self.path, f"truncated: {size} bytes of {expected}")
        if size > expected:
            raise SegmentError(self.path, f"{size - expected} unexpected bytes after the records")
        ranges: dict[tuple[str, int], PartitionRange] = {}
        try:
            (entries,) = _U32.unpack_from(table, 0)
            pos = 4
            for _ in range(entries):
                (nlen,) = _U16.unpack_from(table, pos)
                topic = bytes(table[pos + 2 : pos + 2 + nlen]).decode()
                pos += 2 + nlen
                partition, start, end = _ENTRY.unpack_from(table, pos)
                pos += _ENTRY.size
                if not 0 <= start <= end or partition < 0:
                    raise ValueError(f"bad range of {topic}/{partition}")
                ranges[(topic, partition)] = PartitionRange(topic, partition, start, end)
            if pos != tlen:
                raise ValueError("partition table length mismatch")
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise SegmentError(self.path, f"bad partition table: {exc}") from None
        return ranges, HEADER_SIZE + tlen

    # records
    def _scan(self) -> list[int]:
        """Check every record; return their positions."""
        view, end = self._view, len(self._view)
        positions: list[int] = []
        last: dict[tuple[str, int], int] = {}
        pos = self._start
        while pos < end:
            if pos + _FRAME.size > end:
                raise SegmentError(self.path, f"truncated record frame at byte {pos}")
            length, crc = _FRAME.unpack_from(view, pos)
            body_at = pos + _FRAME.size
            if length > MAX_RECORD_BYTES or body_at + length > end:
                raise SegmentError(self.path, f"record at byte {pos} runs past the end")
            if zlib.crc32(view[body_at : body_at + length]) != crc:
                raise SegmentError(
                    self.path, f"record {len(positions)} at byte {pos}: checksum mismatch (corrupt)"
                )
            try:
                msg = self._decode(len(positions), pos)
            except (struct.error, UnicodeDecodeError, ValueError) as exc:
                raise SegmentError(
                    self.path, f"record {len(positions)} at byte {pos}: {exc}"
                ) from None
            tp = (msg.topic(), msg.partition())
            bounds = self.ranges.get(tp)
            if bounds is None or not bounds.start <= msg.offset() < bounds.end:
                raise SegmentError(
                    self.path,
                    f"record {len(positions)} ({tp[0]}/{tp[1]}@"
                    f"{msg.offset()}) is outside the captured ranges",
                )
            if msg.offset() <= last.get(tp, -1):
                raise SegmentError(
                    self.path, f"record {len(positions)}: offsets of {tp[0]}/{tp[1]} go backwards"
                )
            last[tp] = msg.offset()
            positions.append(pos)
            pos = body_at + length
        if len(positions) != self.count:
            raise SegmentError(self.path, f"{len(positions)} records, header says {self.count}")
        return positions

    def _decode(self, index: int, pos: int) -> SegmentMessage:
        view = self._view
        (length,) = _U32.unpack_from(view, pos)
        at = pos + _FRAME.size
        stop = at + length
        partition, offset, ts, ts_type, nlen = _FIXED.unpack_from(view, at)
        at += _FIXED.size
        topic = _text(view, at, nlen, stop)
        at += nlen
        key, at = _blob(view, at, stop)
        value, at = _blob(view, at, stop)
        if at + 2 > stop:
            raise ValueError("truncated header count")
        (hcount,) = _U16.unpack_from(view, at)
        at += 2
        headers: list[tuple[str, memoryview | None]] = []
        for _ in range(hcount):
            if at + 2 > stop:
                raise ValueError("truncated header name")
            (hlen,) = _U16.unpack_from(view, at)
            name = _text(view, at + 2, hlen, stop)
            hvalue, at = _blob(view, at + 2 + hlen, stop)
            headers.append((name, hvalue))
        if at != stop:
            raise ValueError(f"{stop - at} stray bytes in the body")
        if partition < 0 or offset < 0:
            raise ValueError(f"negative partition or offset ({partition}, {offset})")
        return SegmentMessage(index, topic, partition, offset, ts, ts_type, key, value, headers)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> SegmentMessage:
        """The ``i``-th record (decoded from the mapping; already checked)."""
        return self._decode(i, self.index[i])

    def __iter__(self) -> Iterator[SegmentMessage]:
        for i, pos in enumerate(self.index):
            yield self._decode(i, pos)

    def close(self) -> None:
        """Unmap the file. Views still held by messages keep the mapping alive
        until they are gone (the mapping is then freed by the garbage collector)."""
        try:
            self._view.release()
            if self._map is not None:
                self._map.close()
        except BufferError:
            pass  # messages still hold views: freed with them
        self._map = None

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _text(view: memoryview, at: int, n: int, stop: int) -> str:
    if at + n > stop:
        raise ValueError("truncated text field")
    return bytes(view[at : at + n]).decode()


def _blob(view: memoryview, at: int, stop: int) -> tuple[memoryview | None, int]:
    if at + 4 > stop:
        raise ValueError("truncated length field")
    (n,) = _I32.unpack_from(view, at)
    at += 4
    if n == -1:
        return None, at
    if n < 0 or at + n > stop:
        raise ValueError(f"bad field length {n}")
    return view[at : at + n], at + n
