"""Users' own records from a file, for ``htmqc produce --from FILE``.

Two formats:

- ``jsonl`` (JSON lines): one JSON value per line; the record's value is the
  line's text exactly as written (UTF-8, without its line break), so a
  consumer gets the user's bytes, not a re-encoding. Blank lines are skipped.
  ``key_field`` names a top-level field of each line's object whose value is
  the record's key: a string as its UTF-8 bytes, a number or boolean as
  Python's JSON rendering of it (``1e2`` becomes ``100.0``). Every line must
  then be an object holding that field (not ``null``).
- ``lines``: every line is one record's value (without its line break; an
  empty line is an empty value); no keys.

``auto`` picks ``jsonl`` for ``.jsonl``, ``.ndjson`` and ``.json`` files and
``lines`` otherwise (also for standard input, ``-``).

The whole file is read and checked before anything is sent (a leading UTF-8
byte order mark is dropped): a bad line, or a record over the producer's
``message.max.bytes`` (:func:`check_sizes`), is a
:class:`~htmqc.errors.UsageError` naming it, and nothing of the file reaches
the topic.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from htmqc.errors import UsageError

FORMATS = ("auto", "jsonl", "lines")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
STDIN = "-"

Record = tuple[bytes | None, bytes]


def resolve_format(path: str, fmt: str) -> str:
    """``fmt``, with ``auto`` decided by ``path``'s suffix (module docs)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown --format {fmt!r}", f"use one of {', '.join(FORMATS)}")
    if fmt != "auto":
        return fmt
    return "jsonl" if Path(path).suffix.lower() in JSONL_SUFFIXES else "lines"


def read_records(path: str, fmt: str = "auto", key_field: str | None = None) -> list[Record]:
    """Every record of ``path`` (``-``: standard input) as ``(key, value)`` pairs.

    :raises UsageError: the file cannot be read, a line is not valid UTF-8 or
        JSON, a line lacks ``key_field``, or ``key_field`` is given for ``lines``.
    """
    fmt = resolve_format(path, fmt)
    if key_field is not None and fmt != "jsonl":
        raise UsageError(
            "--key-field needs JSON lines", "pass --format jsonl, or leave out --key-field"
        )
    if key_field == "":
        raise UsageError("--key-field is empty", "name a top-level field of the JSON objects")
    name = "standard input" if path == STDIN else path
    try:
        data = sys.stdin.buffer.read() if path == STDIN else Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(
            f"cannot read {name}: {exc.strerror or exc}", "check the path passed to --from"
        ) from None
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark is not data
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final line break ends the last line; it starts no record
    lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    if fmt == "lines":
        return [(None, line) for line in lines]
    return list(_jsonl(name, lines, key_field))


def _jsonl(name: str, lines: Iterable[bytes], key_field: str | None) -> Iterable[Record]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name} line {number}"
        try:
            value: Any = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise UsageError(f"{where} is not UTF-8", "write the file as UTF-8") from None
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"{where} is not JSON: {exc.msg} (column {exc.colno})",
                "fix that line, or pass --format lines to send lines as they are",
            ) from None
        except RecursionError:
            raise UsageError(
                f"{where} nests too deeply to parse", "flatten it, or pass --format lines"
            ) from None
        yield _key(where, value, key_field), line


def check_sizes(path: str, records: list[Record], limit: int) -> None:
    """Refuse a record larger than ``limit`` bytes (key and value) before any is sent.

    :raises UsageError: naming the first such record.
    """
    for number, (key, value) in enumerate(records, 1):
        size = len(value) + len(key or b"")
        if size > limit:
            raise UsageError(
                f"record {number} of {path} is {size:,} bytes, over the producer's "
                f"message.max.bytes ({limit:,})",
                "shorten it, or raise message.max.bytes with --kafka-config (and the topic's)",
            )


def _key(where: str, value: Any, key_field: str | None) -> bytes | None:
    if key_field is None:
        return None
    if not isinstance(value, dict):
        raise UsageError(
            f"{where} is not a JSON object, so it has no field {key_field!r}",
            "give every line an object, or leave out --key-field",
        )
    key = value.get(key_field)
    if key is None:
        raise UsageError(
            f"{where} has no field {key_field!r} (or it is null)",
            "give every line that field, or leave out --key-field",
        )
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (int, float, bool)):
        return json.dumps(key).encode("ascii")
    raise UsageError(
        f"{where}: field {key_field!r} is a JSON {type(key).__name__}, not a string or number",
        "key by a field holding a string or a number",
    )
