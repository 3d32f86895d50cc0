"""The SQL dead-letter table: rows written by the exactly-once delivery, read by
``htmqc dlq list/show`` with filters, redriven once."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from htmqc.broker import Broker
from htmqc.cli import main
from htmqc.core.decisions import Commit
from htmqc.dlq.record import DeadLetterInfo
from htmqc.runtime.delivery import DLQ_TABLE
from htmqc.sinks import open_sink
from tests.dlq.support import Msg, info, read_topic
from tests.services import postgres_url


@dataclass
class Store:
    """A SQL sink under test: its URL (unique table prefix) and raw queries."""

    kind: str
    url: str
    prefix: str

    def query(self, sql: str) -> list[Any]:
        if self.kind == "sqlite":
            path = self.url.removeprefix("sqlite:///").partition("?")[0]
            with closing(sqlite3.connect(path)) as conn:
                conn.row_factory = sqlite3.Row
                rows = [dict(r) for r in conn.execute(sql).fetchall()]
                conn.commit()  # for an UPDATE
                return rows
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(self.url.partition("?")[0], autocommit=True) as pg:
            cur = pg.cursor(row_factory=dict_row)
            cur.execute(sql)  # type: ignore[arg-type]
            return list(cur.fetchall()) if cur.description else []


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each SQL backend with its own table prefix (PostgreSQL tables dropped after)."""
    prefix = f"d{uuid.uuid4().hex[:10]}_"
    if request.param == "sqlite":
        yield Store("sqlite", f"sqlite:///{tmp_path / 's.db'}?table_prefix={prefix}", prefix)
        return
    base = postgres_url()
    be = Store("postgresql", f"{base}?table_prefix={prefix}", prefix)
    yield be
    be.query(f"DROP TABLE IF EXISTS {prefix}dead_letters, {prefix}positions")


def write_letters(url: str, letters: list[tuple[Msg, DeadLetterInfo]]) -> None:
    """Dead-letter each message in one sink transaction (as the exactly-once
    worker does) and commit."""
    sink = open_sink(url)
    sink.open("g")
    try:
        tps = sorted({(m.t, m.p) for m, _ in letters})
        positions = sink.claim(tps, default_start=lambda tp: 0)
        txn = sink.begin()
        for msg, dead in letters:
            txn.dead_letter(msg.t, msg, dead)
        commits = [
            (Commit(tp=tp, epoch=1, offset=1 + max(m.o for m, _ in letters if (m.t, m.p) == tp)),
             positions[tp].fence)
            for tp in tps
        ]  # fmt: skip
        txn.commit(commits)
    finally:
        sink.close()


def sample() -> list[tuple[Msg, DeadLetterInfo]]:
    return [
        (Msg("t", 0, 10, b"k0", b"v0", [("h", b"1")]),
         info("failed", "builtins.ValueError", "a", last=2000.0)),
        (Msg("t", 1, 11, None, b"v1"), info("permanent", "app.Bad", "b", last=2001.0)),
        (Msg("t", 0, 12, b"k2", b"v2"), info("failed", "builtins.ValueError", "c", last=2002.0)),
        (Msg("t", 1, 13, b"k3", b"v3"), info("poison", "app.Bad", "d", last=2003.0)),
        (Msg("t", 0, 14, b"k4", b"v4"), info("too_large", "x.TooLarge", "e", last=2004.0)),
    ]  # fmt: skip


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``htmqc dlq ARGV``: exit code, stdout, stderr (argparse errors included)."""
    try:
        code = main(["dlq", *argv])
    except SystemExit as exc:  # argparse refuses the command line
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def listed(capsys: pytest.CaptureFixture[str], url: str, *filters: str) -> list[dict[str, Any]]:
    code, out, err = run(capsys, "list", "--sink", url, "--json", *filters)
    assert code == 0, err
    return list(json.loads(out))


def test_exactly_once_delivery_writes_every_field(store: Store) -> None:
    write_letters(store.url, sample())
    rows = store.query(f"SELECT * FROM {store.prefix}dead_letters ORDER BY id")
    assert len(rows) == 5
    first = rows[0]
    assert first["topic"] == "t" and (first["partition"], first["offset"]) == (0, 10)
    assert (bytes(first["msg_key"]), bytes(first["msg_value"])) == (b"k0", b"v0")
    assert json.loads(first["msg_headers"]) == [["h", "MQ=="]]
    assert first["kind"] == "failed" and first["error_class"] == "builtins.ValueError"
    assert first["error_message"] == "a" and "Traceback" in first["stack"]
    assert first["retries"] == 2 and first["consumer_group"] == "g"
    assert (first["first_failure_at"], first["last_failure_at"]) == (1998.5, 2000.0)
    assert first["reason"] == "ValueError: a" and first["source"] == "t/0/10"
    assert first["redriven_at"] is None and first["dead_lettered_at"] > 0
    assert rows[1]["msg_key"] is None


def test_default_table_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "s.db"
    write_letters(f"sqlite:///{db}", sample()[:1])
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute(f"SELECT COUNT(*) FROM {DLQ_TABLE}").fetchone()[0] == 1
    assert len(listed(capsys, f"sqlite:///{db}")) == 1


@pytest.mark.parametrize(
    ("filters", "offsets"),
    [
        ((), [10, 11, 12, 13, 14]),
        (("--partition", "0"), [10, 12, 14]),
        (("--offset-from", "11", "--offset-to", "13"), [11, 12, 13]),
        (("--error-class", "ValueError"), [10, 12]),
        (("--error-class", "app.Bad"), [11, 13]),
        (("--error-class", "Val%"), []),
        (("--kind", "poison"), [13]),
        (("--since", "2001.5"), [12, 13, 14]),
        (("--until", "1970-01-01T00:33:21Z"), [10, 11]),
        (("--limit", "2"), [10, 11]),
        (("--topic", "other"), []),
    ],
)
def test_list_filters(
    store: Store, capsys: pytest.CaptureFixture[str], filters: tuple[str, ...], offsets: list[int]
) -> None:
    write_letters(store.url, sample())
    assert [e["offset"] for e in listed(capsys, store.url, *filters)] == offsets


def test_list_plain_table_and_show(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    write_letters(store.url, sample())
    code, out, _ = run(capsys, "list", "--sink", store.url)
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["id", "original", "key"]
    assert len(lines) == 6 and "t/1/13" in lines[4] and "poison" in lines[4]
    code, out, _ = run(capsys, "show", "--sink", store.url, "1")
    assert code == 0
    assert "original:       t/0/10" in out and "h: 1" in out and "Traceback" in out
    code, out, _ = run(capsys, "show", "--sink", store.url, "2", "--json")
    assert json.loads(out)["key"] is None and json.loads(out)["kind"] == "permanent"


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["list"], "no DLQ given"),
        (["list", "--sink", "sqlite:///{db}", "--kind", "melted"], "invalid choice"),
        (["list", "--sink", "sqlite:///{db}", "--partition", "-1"], "--partition must be 0"),
        (["list", "--sink", "sqlite:///{db}", "--limit", "0"], "--limit must be 1"),
        (["list", "--sink", "sqlite:///{db}", "--offset-from", "5", "--offset-to", "2"], "swap"),
        (["list", "--sink", "sqlite:///{db}", "--since", "soon"], "is not a time"),
        (["list", "--sink", "sqlite:///nowhere.db"], "does not exist"),
        (["list", "--sink", "kafka:out"], "use --bootstrap B --topic T"),
        (["show", "--sink", "sqlite:///{db}", "abc"], "not a row id"),
        (["show", "--sink", "sqlite:///{db}", "99"], "no dead letter with id 99"),
        (["redrive", "--sink", "sqlite:///{db}"], "needs a broker"),
        (["list", "--topic", "t"], "needs a broker"),
        (["list", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--timeout", "0"], "--timeout"),
        (
            ["list", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--kafka-config", "bogus.x=1"],
            "invalid Kafka setting",
        ),
        (["list", "--sink", "sqlite:///{db}", "--poison"], "--kind poison"),
        (["redrive", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--dry-run", "--limit", "3"],
         "--dry-run with --limit"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], text: str
) -> None:
    db = tmp_path / "s.db"
    write_letters(f"sqlite:///{db}", sample()[:1])
    code, _out, err = run(capsys, *[a.format(db=db) for a in argv])
    assert code == 2, err
    assert text in err and len(err.strip().splitlines()) == 1, err


def test_redrive_dry_run_lists_what_it_would_write_and_writes_nothing(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """No broker needed: the selection's entries not redriven yet, a summary line,
    and every entry still pending afterwards."""
    write_letters(store.url, sample())
    # offset 12 was redriven already: not listed again
    store.query(f'UPDATE {store.prefix}dead_letters SET redriven_at = 1.0 WHERE "offset" = 12')
    code, out, err = run(capsys, "redrive", "--sink", store.url, "--error-class", "ValueError",
                         "--dry-run")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[-1] == ("dry run: 1 dead letters would be redriven to their topics; "
                         "nothing was written")
    table = "\n".join(lines[:-1])
    assert "t/0/10" in table and "t/0/12" not in table and "t/1/11" not in table
    assert [e["offset"] for e in listed(capsys, store.url, "--pending")] == [10, 11, 13, 14]


@pytest.mark.broker
@pytest.mark.brokers("tansu", "kafka")
def test_redrive_writes_back_once_and_marks(
    broker: Broker, new_topic: Any, store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = new_topic(partitions=2)
    letters = [(Msg(topic, m.p, m.o, m.k, m.v, m.h), d) for m, d in sample()]
    write_letters(store.url, letters)
    sink, bs = store.url, broker.bootstrap
    code, out, err = run(capsys, "redrive", "--sink", sink, "--bootstrap", bs,
                         "--error-class", "ValueError")  # fmt: skip
    assert code == 0, err
    assert out.splitlines() == ["redrive 2/2", out.splitlines()[-1]]  # plain progress: no TTY
    assert out.splitlines()[-1].startswith("redrove 2 dead letters")
    assert [e["offset"] for e in listed(capsys, sink, "--pending")] == [11, 13, 14]
    code, out, err = run(capsys, "redrive", "--sink", sink, "--bootstrap", bs)
    assert code == 0, err
    assert out.splitlines()[-1].startswith("redrove 3 dead letters")
    code, out, err = run(capsys, "redrive", "--sink", sink, "--bootstrap", bs)
    assert out.splitlines()[-1].startswith("redrove 0 dead letters")
    assert all(e["redriven"] and e["redriven_at"] for e in listed(capsys, sink))
    assert listed(capsys, sink, "--pending") == []
    records = read_topic(bs, topic, 2, 5)
    got = sorted((m.partition(), m.value(), dict(m.headers())["htmqc-redrive-of"]) for m in records)
    assert got == [(0, b"v0", b"1"), (0, b"v2", b"3"), (0, b"v4", b"5"),
                   (1, b"v1", b"2"), (1, b"v3", b"4")]  # fmt: skip
    first = next(m for m in records if m.value() == b"v0")
    assert first.key() == b"k0" and first.headers()[0] == ("h", b"1")


def test_list_on_a_terminal_is_a_rich_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    from htmqc.cli.dlq_cmd import print_table
    from htmqc.dlq.entries import StoredDeadLetter

    dead = info(message="bad")
    entry = StoredDeadLetter(
        id="t.dlq/0/7", topic="t", partition=1, offset=9, key=b"k", value=b"v", headers=(),
        info=dead, reason="ValueError: bad", source="t/1/9", dead_lettered_at=None,
        redriven=False,
    )  # fmt: skip
    print_table([entry], rich_output=True)
    out = capsys.readouterr().out
    assert "1 dead letters" in out and "─────" in out
    assert "t.dlq/0/7" in out and "t/1/9" in out and "ValueError: bad" in out
