"""The tables of one chaos run, and what the checker reads back from them.

Every run has its own table prefix (``chaos_<hex>_``), passed to the sink as
``?table_prefix=``, so runs never see each other's rows: the sink's
``<prefix>positions`` and ``<prefix>dead_letters``, and the handler's
``<prefix>effects`` (:mod:`htmqc.chaos.handler`), created here before the
consumers start.

Storage order. The audit wants effects in the order they became durable.
SQLite serializes writers on the file lock, so ``rowid`` order is commit
order. PostgreSQL does not: a row's serial number is taken at insert, and a
zombie inserts *before* it commits late. So each effect row records its
transaction (``txid``, default ``pg_current_xact_id()``), and a deferred
constraint trigger, which runs at ``COMMIT`` after the sink has locked the
position rows (``SELECT ... FOR UPDATE``), stamps the transaction once with the
next value of a sequence in ``<prefix>txns``. Two transactions that store the
same partition serialize on that row lock, so their stamps are in commit
order; effects are read ``ORDER BY stamp, seq``.

Claims. A zombie's late commit can land *after* the new owner claimed the
partition but *before* the new owner commits anything; effects alone then look
well ordered (old generation, then new). So on PostgreSQL the positions table
is created up front through the sink itself (:class:`PostgresSink`
``open``), and a row trigger on it records every fence change in
``<prefix>claims`` with a stamp from the same sequence, inside the claim's
transaction (the claim's ``UPDATE`` holds the row lock that a commit's
``SELECT ... FOR UPDATE`` waits for). :class:`ClaimCheck` walks the effects
in stamp order beside the claims and reports an effect whose generation is
below a fence already claimed for its partition: a write by a fenced
generation. (SQLite: no claim stamps; the audit's effects-only check applies.)
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from htmqc.audit import DlqEntry, Effect
from htmqc.audit.model import DEFAULT_EXAMPLES
from htmqc.errors import RuntimeFailure
from htmqc.produce import parse_id

_FETCH = 20_000


class ClaimCheck:
    """Effects by a fenced generation, against the claims (see module docs).

    Feed :meth:`see` every effect with its stamp, in stamp order; ``claims`` are
    ``(stamp, partition, fence)``. ``count`` and up to ``limit`` ``examples``.
    """

    def __init__(self, claims: list[tuple[int, int, int]], limit: int = DEFAULT_EXAMPLES) -> None:
        self._claims = sorted(claims)
        self._next = 0
        self._fence: dict[int, int] = {}
        self.limit = limit
        self.count = 0
        self.examples: list[dict[str, Any]] = []

    def see(self, stamp: int, effect: Effect) -> None:
        """Account for the claims stamped before ``stamp``, then check ``effect``."""
        claims = self._claims
        while self._next < len(claims) and claims[self._next][0] < stamp:
            _s, part, fence = claims[self._next]
            self._fence[part] = max(fence, self._fence.get(part, fence))
            self._next += 1
        where, gen = effect.partition, effect.generation
        if where is None or gen is None:
            return
        top = self._fence.get(where)
        if top is not None and gen < top:
            self.count += 1
            if len(self.examples) < self.limit:
                self.examples.append(
                    {"id": effect.id, "partition": where, "generation": gen, "claimed": top}
                )


class RunStore:
    """One run's tables in SQLite (``path``) or PostgreSQL (``pg_url``)."""

    def __init__(
        self, *, pg_url: str | None = None, path: Path | None = None, prefix: str | None = None
    ) -> None:
        if (pg_url is None) == (path is None):
            raise ValueError("give exactly one of pg_url and path")
        self.pg_url = pg_url
        self.path = path
        self.prefix = prefix or f"chaos_{uuid.uuid4().hex[:10]}_"
        self.effects_table = f"{self.prefix}effects"
        self.positions_table = f"{self.prefix}positions"
        self.dlq_table = f"{self.prefix}dead_letters"
        self._conn: Any = None

    @property
    def kind(self) -> str:
        """``postgresql`` or ``sqlite``."""
        return "postgresql" if self.pg_url is not None else "sqlite"

    @property
    def sink_url(self) -> str:
        """The ``--sink`` URL of the consumers."""
        if self.pg_url is not None:
            sep = "&" if "?" in self.pg_url else "?"
            return f"{self.pg_url}{sep}table_prefix={self.prefix}"
        return f"sqlite:///{self.path}?table_prefix={self.prefix}"

    def _connect(self) -> Any:
        if self._conn is None:
            if self.pg_url is not None:
                import psycopg

                try:
                    self._conn = psycopg.connect(self.pg_url, autocommit=True, connect_timeout=5)
                except psycopg.Error as exc:
                    raise RuntimeFailure(
                        f"cannot connect to PostgreSQL for the chaos run: "
                        f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else exc}",
                        "start PostgreSQL or pass --pg-url, or use --db sqlite",
                    ) from None
            else:
                assert self.path is not None
                self._conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        return self._conn

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        cur = self._connect().cursor()
        cur.execute(sql, params)
        return list(cur.fetchall())

    def create(self) -> None:
        """Create the effects table (and the commit stamps for PostgreSQL)."""
        e = self.effects_table
        if self.pg_url is None:
            self._connect().execute(
                f"CREATE TABLE IF NOT EXISTS {e} (id INTEGER NOT NULL, msg_key TEXT, "
                '"partition" INTEGER, "offset" INTEGER, generation INTEGER, pid INTEGER)'
            )
            return
        t = f"{self.prefix}txns"
        conn = self._connect()
        for sql in (
            f"CREATE SEQUENCE {t}_stamp",
            f"CREATE TABLE {t} (txid xid8 PRIMARY KEY, stamp BIGINT NOT NULL)",
            f"CREATE TABLE {e} (seq BIGSERIAL PRIMARY KEY, id BIGINT NOT NULL, msg_key TEXT, "
            '"partition" INTEGER, "offset" BIGINT, generation BIGINT, pid INTEGER, '
            "txid xid8 NOT NULL DEFAULT pg_current_xact_id())",
            f"""CREATE FUNCTION {t}_mark() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF current_setting('htmqc_chaos.{self.prefix}', true) = 'y' THEN
                    RETURN NULL;
                END IF;
                PERFORM set_config('htmqc_chaos.{self.prefix}', 'y', true);
                INSERT INTO {t} (txid, stamp)
                    VALUES (pg_current_xact_id(), nextval('{t}_stamp'))
                    ON CONFLICT (txid) DO NOTHING;
                RETURN NULL;
            END $$""",
            f"CREATE CONSTRAINT TRIGGER {t}_stamp AFTER INSERT ON {e} "
            f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {t}_mark()",
        ):
            conn.execute(sql)
        from htmqc.sinks.postgresql import PostgresSink

        sink = PostgresSink(self.pg_url, table_prefix=self.prefix)
        try:
            sink.open("htmqc-chaos")  # creates the positions table, as the consumers would
        finally:
            sink.close()
        c, pos = f"{self.prefix}claims", self.positions_table
        for sql in (
            f'CREATE TABLE {c} (stamp BIGINT NOT NULL, "partition" INTEGER, fence BIGINT)',
            f"""CREATE FUNCTION {c}_mark() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.fence IS DISTINCT FROM OLD.fence THEN
                    INSERT INTO {c} VALUES (nextval('{t}_stamp'), NEW."partition", NEW.fence);
                END IF;
                RETURN NULL;
            END $$""",
            f"CREATE TRIGGER {c}_mark AFTER UPDATE ON {pos} "
            f"FOR EACH ROW EXECUTE FUNCTION {c}_mark()",
        ):
            conn.execute(sql)

    def committed(self) -> dict[int, int]:
        """Each partition's stored position (``partition -> committed``)."""
        return self._positions("committed")

    def fences(self) -> dict[int, int]:
        """Each partition's fence (bumped by every claim): ``partition -> fence``."""
        return self._positions("fence")

    def _positions(self, column: str) -> dict[int, int]:
        try:
            rows = self._rows(f'SELECT "partition", {column} FROM {self.positions_table}')
        except Exception as exc:
            if _missing_table(exc):
                return {}
            raise
        return {int(p): int(c) for p, c in rows}

    def claims(self) -> list[tuple[int, int, int]]:
        """PostgreSQL: every fence change as ``(stamp, partition, fence)``; SQLite: ``[]``."""
        if self.pg_url is None:
            return []
        rows = self._rows(f'SELECT stamp, "partition", fence FROM {self.prefix}claims')
        return [(int(s), int(p), int(f)) for s, p, f in rows]

    def effects(self, check: ClaimCheck | None = None) -> Iterator[Effect]:
        """The effect rows in commit order (see module docs); each also goes to
        ``check`` with its stamp (PostgreSQL)."""
        e = self.effects_table
        if self.pg_url is None:
            sql = (
                f'SELECT 0, id, msg_key, "partition", "offset", generation FROM {e} ORDER BY rowid'
            )
        else:
            t = f"{self.prefix}txns"
            sql = (
                f'SELECT t.stamp, e.id, e.msg_key, e."partition", e."offset", e.generation '
                f"FROM {e} e JOIN {t} t ON t.txid = e.txid ORDER BY t.stamp, e.seq"
            )
        cur = self._connect().cursor()
        cur.execute(sql)
        while rows := cur.fetchmany(_FETCH):
            for stamp, ident, key, part, off, gen in rows:
                effect = Effect(str(ident), key, part, off, None if gen is None else int(gen))
                if check is not None:
                    check.see(int(stamp), effect)
                yield effect

    def unstamped(self) -> int:
        """PostgreSQL: effect rows without a commit stamp (must be 0); SQLite: 0."""
        if self.pg_url is None:
            return 0
        t = f"{self.prefix}txns"
        rows = self._rows(
            f"SELECT COUNT(*) FROM {self.effects_table} e "
            f"WHERE NOT EXISTS (SELECT 1 FROM {t} t WHERE t.txid = e.txid)"
        )
        return int(rows[0][0])

    def dead_letters(self) -> list[DlqEntry]:
        """The dead-lettered messages (ids parsed from the stored values)."""
        try:
            rows = self._rows(f"SELECT msg_value, reason FROM {self.dlq_table} ORDER BY id")
        except Exception as exc:
            if _missing_table(exc):
                return []
            raise
        return [DlqEntry(str(parse_id(bytes(value))), str(reason or "")) for value, reason in rows]

    def drop(self) -> None:
        """Drop every table of the run (PostgreSQL); SQLite: delete the file."""
        if self.pg_url is None:
            self.close()
            assert self.path is not None
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            return
        t = f"{self.prefix}txns"
        conn = self._connect()
        c = f"{self.prefix}claims"
        for table in (self.effects_table, t, c, self.positions_table, self.dlq_table):
            conn.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
        conn.execute(f"DROP FUNCTION IF EXISTS {t}_mark() CASCADE")
        conn.execute(f"DROP FUNCTION IF EXISTS {c}_mark() CASCADE")
        conn.execute(f"DROP SEQUENCE IF EXISTS {t}_stamp")
        self.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):
                conn.close()


def _missing_table(exc: Exception) -> bool:
    text = str(exc).lower()
    return "no such table" in text or "does not exist" in text
