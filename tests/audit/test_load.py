"""Loaders: JSON lines, runtime traces, bare id lists, SQLite with a column mapping."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from htmqc.audit import CommitObservation, Effect, audit, load
from htmqc.errors import UsageError
from tests.audit.files import write_jsonl, write_scenario
from tests.audit.scenario import DOCTORINGS, clean


def test_jsonl_round_trip(tmp_path: Path) -> None:
    s = DOCTORINGS["fenced-write"](clean())
    paths = write_scenario(s, tmp_path)
    assert list(load.produced_from_jsonl(paths["produced"])) == s.produced
    assert list(load.effects_from_jsonl(paths["effects"])) == s.effects
    assert list(load.commits_from_jsonl(paths["committed"])) == s.committed


def test_sqlite_effects_in_rowid_order_with_a_column_mapping(tmp_path: Path) -> None:
    s = DOCTORINGS["order-violation"](DOCTORINGS["fenced-write"](clean()))
    paths = write_scenario(s, tmp_path)
    source = f"sqlite:///{paths['sqlite']}?generation=fence"
    assert list(load.effects_from_source(source)) == s.effects
    report = audit(s.produced, load.effects_from_source(source))
    assert report.counts["order-violation"] == 1
    assert report.counts["fenced-write"] == 1


def test_sqlite_without_the_optional_columns(tmp_path: Path) -> None:
    db = tmp_path / "e.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE out (msg_id TEXT)")
    conn.executemany("INSERT INTO out VALUES (?)", [("b",), ("a",)])
    conn.commit()
    conn.close()
    rows = list(load.effects_from_source(f"sqlite:///{db}?table=out&id=msg_id"))
    assert rows == [Effect("b"), Effect("a")]


def test_trace_lines_give_the_commit_history(tmp_path: Path) -> None:
    trace = write_jsonl(
        tmp_path / "trace.jsonl",
        [
            {"p": "t/0", "ev": "fetched", "off": 0, "state": {"committed": 0}},
            {"p": "t/1", "ev": "committed", "off": 5, "state": {"committed": 5}},
            {"p": "t/1", "ev": "committed", "off": 3, "state": {"committed": 3}},
        ],
    )
    history = list(load.commits_from_jsonl(trace))
    assert history == [CommitObservation(0, 0), CommitObservation(1, 5), CommitObservation(1, 3)]
    assert audit([], [], committed=history).counts["nonmonotonic-commit"] == 1


def test_aborted_ids_as_bare_lines_or_json(tmp_path: Path) -> None:
    f = tmp_path / "aborted"
    f.write_text('7\n\n{"id": 8}\n"9"\n')
    assert list(load.aborted_from_file(f)) == ["7", "8", "9"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{bad\n", "produced.jsonl:1: not JSON"),
        ('{"id": "1"}\n[1]\n', "produced.jsonl:2: expected a JSON object"),
        ('{"key": "k"}\n', "produced.jsonl:1: missing field 'id'"),
        ('{"id": "1", "offset": "x"}\n', "field 'offset' must be an integer"),
    ],
)
def test_bad_jsonl_names_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "produced.jsonl"
    f.write_text(content)
    with pytest.raises(UsageError, match=message):
        list(load.produced_from_jsonl(f))


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("sqlite:///{db}?table=nope", "has no table 'nope'"),
        ("sqlite:///{db}?id=nope", "has no column 'nope'"),
        ("sqlite:///{db}?colour=x", "unknown effect field"),
        ("sqlite:///{missing}", "no SQLite file"),
        ("sqlite:/x.db", "bad SQLite URL"),
        ("{missing}", "cannot read"),
    ],
)
def test_bad_effect_sources(tmp_path: Path, source: str, message: str) -> None:
    db = write_scenario(clean(), tmp_path)["sqlite"]
    url = source.format(db=db, missing=tmp_path / "missing.db")
    with pytest.raises(UsageError, match=message):
        list(load.effects_from_source(url))


def test_a_non_sqlite_file_is_a_usage_error(tmp_path: Path) -> None:
    f = tmp_path / "x.db"
    f.write_text(json.dumps({"not": "sqlite"}) * 100)
    with pytest.raises(UsageError, match="not a SQLite database"):
        list(load.effects_from_source(f"sqlite:///{f}"))
