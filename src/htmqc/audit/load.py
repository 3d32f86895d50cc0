"""Read the checker's inputs from files; every loader is a lazy generator.

JSON lines (one object per line; blank lines skipped):

* produced: ``{"id": "...", "key": "...", "partition": 0, "offset": 42}``
  (``key``, ``partition``, ``offset`` optional);
* effects: the same fields plus optional ``generation`` (alias ``fence``),
  in storage order;
* DLQ: ``{"id": "...", "reason": "..."}``;
* committed history: ``{"partition": 0, "offset": 42}`` per observation, or the
  runtime's trace lines ``{"p": "topic/0", "state": {"committed": 42}, ...}``
  (the partition is the number after the last ``/``);
* aborted ids: ``{"id": "..."}`` per line, or one bare id per line.

SQLite effects (the demo's ``effects`` table): rows in ``rowid`` order (PostgreSQL: in
``_htmqc_seq`` order, or ``?order=COLUMN``), columns
``id``, ``key``, ``partition``, ``offset`` and optionally ``generation``; pass
``columns`` to map these names onto other column names, e.g.
``{"generation": "fence"}``. Any other column (a timestamp) is ignored.

Bad input raises :class:`~htmqc.errors.UsageError` naming the file and line.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from htmqc.audit.model import CommitObservation, DlqEntry, Effect, Produced
from htmqc.errors import UsageError

EFFECT_COLUMNS = ("id", "key", "partition", "offset", "generation")
_REQUIRED_COLUMNS = ("id",)


def read_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, parsed value)`` for each non-blank line of ``path``."""
    p = Path(path)
    try:
        handle = p.open(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {p}: {exc.strerror}", "check the path") from None
    with handle:
        lineno = 0
        while True:
            try:
                line = handle.readline()
            except UnicodeDecodeError:
                raise UsageError(
                    f"{p}:{lineno + 1}: not UTF-8 text", "write UTF-8 JSON lines"
                ) from None
            if not line:
                return
            lineno += 1
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except (json.JSONDecodeError, RecursionError) as exc:
                why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
                raise UsageError(
                    f"{p}:{lineno}: not JSON ({why})", "write one JSON object per line"
                ) from None


def _field(path: str | Path, lineno: int, obj: Any, name: str, kind: type, need: bool) -> Any:
    if not isinstance(obj, dict):
        raise UsageError(f"{path}:{lineno}: expected a JSON object", "write one object per line")
    value = obj.get(name)
    if value is None:
        if need:
            raise UsageError(f"{path}:{lineno}: missing field {name!r}", f"add {name!r}")
        return None
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{path}:{lineno}: field {name!r} must be an integer", "fix the value")
        return value
    return value if isinstance(value, str) else str(value)


def produced_from_jsonl(path: str | Path) -> Iterator[Produced]:
    """Produced records from JSON lines."""
    for n, obj in read_jsonl(path):
        yield Produced(
            _field(path, n, obj, "id", str, True),
            _field(path, n, obj, "key", str, False),
            _field(path, n, obj, "partition", int, False),
            _field(path, n, obj, "offset", int, False),
        )


def effects_from_jsonl(path: str | Path) -> Iterator[Effect]:
    """Effects from JSON lines, in file order (= storage order)."""
    for n, obj in read_jsonl(path):
        gen = _field(path, n, obj, "generation", int, False)
        if gen is None:
            gen = _field(path, n, obj, "fence", int, False)
        yield Effect(
            _field(path, n, obj, "id", str, True),
            _field(path, n, obj, "key", str, False),
            _field(path, n, obj, "partition", int, False),
            _field(path, n, obj, "offset", int, False),
            gen,
        )


def dlq_from_jsonl(path: str | Path) -> Iterator[DlqEntry]:
    """Dead-letter entries from JSON lines."""
    for n, obj in read_jsonl(path):
        yield DlqEntry(
            _field(path, n, obj, "id", str, True), _field(path, n, obj, "reason", str, False) or ""
        )


def commits_from_jsonl(path: str | Path) -> Iterator[CommitObservation]:
    """Committed-offset observations from JSON lines or runtime trace lines."""
    for n, obj in read_jsonl(path):
        if isinstance(obj, dict) and "p" in obj and isinstance(obj.get("state"), dict):
            label = str(obj["p"]).rsplit("/", 1)[-1]
            committed = obj["state"].get("committed")
            if not label.isdigit() or not isinstance(committed, int):
                raise UsageError(
                    f"{path}:{n}: trace line without 'topic/partition' and state.committed",
                    "pass a runtime trace or {partition, offset} lines",
                )
            yield CommitObservation(int(label), committed)
        else:
            yield CommitObservation(
                _field(path, n, obj, "partition", int, True),
                _field(path, n, obj, "offset", int, True),
            )


def aborted_from_file(path: str | Path) -> Iterator[str]:
    """Aborted ids: ``{"id": ...}`` JSON lines or one bare id per line."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read {p}: {exc.strerror}", "check the path") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{p}: not UTF-8 text (byte {exc.start})", "write UTF-8 lines") from None
    for lineno, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        if text.startswith("{"):
            try:
                obj = json.loads(text)
            except (json.JSONDecodeError, RecursionError):
                raise UsageError(f"{p}:{lineno}: not JSON", "fix the line") from None
            yield _field(p, lineno, obj, "id", str, True)
        else:
            yield text.strip('"')


def _effect_mapping(columns: Mapping[str, str] | None) -> dict[str, str]:
    """Effect field -> column name, after the user's mapping (``?id=COLUMN``)."""
    names = {name: name for name in EFFECT_COLUMNS}
    names.update(columns or {})
    unknown = set(names) - set(EFFECT_COLUMNS)
    if unknown:
        raise UsageError(
            f"unknown effect field(s) {sorted(unknown)}", f"map only {list(EFFECT_COLUMNS)}"
        )
    return names


def _effect_select(
    names: Mapping[str, str], present: set[str], where: str, columns: Mapping[str, str] | None
) -> str:
    """The SELECT list of the effect fields (``NULL`` for an absent optional one)."""
    select = []
    for name in EFFECT_COLUMNS:
        col = names[name]
        if col in present:
            select.append(f'"{col}"')
        elif name in _REQUIRED_COLUMNS or name in (columns or {}):
            raise UsageError(
                f"{where} has no column {col!r} (has {sorted(present)})",
                "map the column with ?id=COLUMN",
            )
        else:
            select.append("NULL")
    return ", ".join(select)


def _effects_of_rows(rows: Iterator[tuple[Any, ...]], where: str) -> Iterator[Effect]:
    for row_number, (ident, key, part, off, gen) in enumerate(rows, 1):
        try:
            effect = Effect(
                str(ident),
                None if key is None else str(key),
                _int_cell(part),
                _int_cell(off),
                _int_cell(gen),
            )
        except ValueError:
            raise UsageError(
                f"{where}, row {row_number}: partition, offset and generation must be integers",
                "check the column mapping",
            ) from None
        yield effect


def _fetched(cursor: Any) -> Iterator[tuple[Any, ...]]:
    while rows := cursor.fetchmany(10_000):
        yield from rows


def effects_from_sqlite(
    path: str | Path, table: str = "effects", columns: Mapping[str, str] | None = None
) -> Iterator[Effect]:
    """Effects from a SQLite table in ``rowid`` order (see module docs)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"no SQLite file at {p}", "check the sqlite:/// path")
    names = _effect_mapping(columns)
    where = f"table {table!r} in {p}"
    conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    try:
        try:
            info = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
        except sqlite3.DatabaseError as exc:
            raise UsageError(f"{p} is not a SQLite database ({exc})", "check the path") from None
        present = {row[1] for row in info}
        if not present:
            raise UsageError(f"{p} has no table {table!r}", "pass ?table=NAME")
        select = _effect_select(names, present, where, columns)
        cursor = conn.execute(f'SELECT {select} FROM "{table}" ORDER BY rowid')
        yield from _effects_of_rows(_fetched(cursor), where)
    finally:
        conn.close()


def effects_from_postgres(
    url: str, table: str = "effects", columns: Mapping[str, str] | None = None
) -> Iterator[Effect]:
    """Effects from a PostgreSQL table in storage order: its ``_htmqc_seq`` column
    (which :class:`htmqc.spark.sinks.SqlBatchSink` adds), or the column named by
    ``order`` in ``columns``."""
    import psycopg

    mapping = dict(columns or {})
    order = mapping.pop("order", "_htmqc_seq")
    names = _effect_mapping(mapping)
    where = f"PostgreSQL table {table!r}"
    try:
        conn = psycopg.connect(url)
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"cannot connect to PostgreSQL ({first})", "check the postgresql:// URL"
        ) from None
    try:
        cur = conn.cursor()
        cur.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s", (table,)
        )
        present = {row[0] for row in cur.fetchall()}
        if not present:
            raise UsageError(f"PostgreSQL has no table {table!r}", "pass ?table=NAME")
        select = _effect_select(names, present, where, mapping)
        if order not in present:
            raise UsageError(
                f"{where} has no column {order!r} to give the storage order",
                "pass ?order=COLUMN (a column that grows with each insert)",
            )
        with conn.cursor(name="htmqc_audit") as rows:  # server side: streamed
            rows.execute(f'SELECT {select} FROM "{table}" ORDER BY "{order}"')
            yield from _effects_of_rows(_fetched(rows), where)
    finally:
        conn.close()


def _int_cell(value: Any) -> int | None:
    """A SQLite cell as an integer (``None`` stays ``None``).

    :raises ValueError: text, a blob or a fractional number.
    """
    if value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ValueError(f"not an integer: {type(value).__name__}")


def effects_from_source(source: str) -> Iterator[Effect]:
    """``sqlite:///PATH[?table=T&FIELD=COLUMN...]``,
    ``postgresql://...[?table=T&FIELD=COLUMN&order=COLUMN...]`` or a JSON-lines file path.

    As for sinks: ``sqlite:///relative.db``, ``sqlite:////absolute.db``.
    """
    if source.startswith(("postgresql://", "postgres://")):
        url, _, query_text = source.partition("?")
        query = {k: v[-1] for k, v in parse_qs(query_text).items()}
        table = query.pop("table", "effects")
        fields = {k: query.pop(k) for k in [*EFFECT_COLUMNS, "order"] if k in query}
        rest = "&".join(f"{k}={v}" for k, v in query.items())  # libpq's own (sslmode ...)
        return effects_from_postgres(f"{url}?{rest}" if rest else url, table, fields)
    if source.startswith("sqlite:"):
        if not source.startswith("sqlite:///") or len(source) == len("sqlite:///"):
            raise UsageError(
                f"bad SQLite URL {source!r}", "use sqlite:///relative.db or sqlite:////abs.db"
            )
        path, _, query_text = source[len("sqlite:///") :].partition("?")
        query = {k: v[-1] for k, v in parse_qs(query_text).items()}
        table = query.pop("table", "effects")
        return effects_from_sqlite(path, table, query)
    return effects_from_jsonl(source)
