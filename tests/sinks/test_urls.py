"""Sink URLs: parsing, one-line errors, and passwords never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from htmqc.errors import RuntimeFailure, UsageError
from htmqc.sinks import open_sink, redact_url
from htmqc.sinks.postgresql import PostgresSink
from htmqc.sinks.sqlite import SqliteSink
from htmqc.sinks.urls import parse_sink_url
from tests.services import PG_HOST, postgres_url

SECRET = "s3cr3t-Pw"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql://bob:{SECRET}@db:5432/app", "postgresql://bob:***@db:5432/app"),
        (
            f"postgres://bob:{SECRET}@db/app?sslmode=require",
            "postgres://bob:***@db/app?sslmode=require",
        ),
        (f"postgresql://bob:p@ss/w{SECRET}@db/app", "postgresql://bob:***@db/app"),
        (
            f"postgresql://db/app?user=bob&password={SECRET}",
            "postgresql://db/app?user=bob&password=***",
        ),
        (
            f"postgresql://db/app?sslpassword={SECRET}&x=1",
            "postgresql://db/app?sslpassword=***&x=1",
        ),
        (
            f"host=db user=bob password={SECRET} dbname=app",
            "host=db user=bob password=*** dbname=app",
        ),
        (f"host=db password='{SECRET} x' dbname=app", "host=db password=*** dbname=app"),
        ("postgresql://bob@db/app", "postgresql://bob@db/app"),
        ("sqlite:///data/out.db", "sqlite:///data/out.db"),
        ("kafka:orders-out", "kafka:orders-out"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert SECRET not in redact_url(url)


@pytest.mark.parametrize(
    ("url", "kind", "target", "prefix"),
    [
        ("sqlite:///out/sink.db", "sqlite", "out/sink.db", "htmqc_"),
        ("sqlite:////abs/sink.db?table_prefix=app_", "sqlite", "/abs/sink.db", "app_"),
        (
            "postgresql://u@h/db?sslmode=disable&table_prefix=x_",
            "postgresql",
            "postgresql://u@h/db?sslmode=disable",
            "x_",
        ),
        ("kafka:out.topic_1", "kafka", "out.topic_1", "htmqc_"),
    ],
)
def test_parse_sink_url(url: str, kind: str, target: str, prefix: str) -> None:
    parsed = parse_sink_url(url)
    assert (parsed.kind, parsed.target, parsed.table_prefix) == (kind, target, prefix)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (f"mysql://u:{SECRET}@h/db", "unknown sink URL 'mysql://u:***@h/db'"),
        ("sqlite://out.db", "needs three slashes"),
        ("sqlite:///", "names no file"),
        ("sqlite:///:memory:", "in-memory"),
        ("sqlite:///x.db?journal=off", "unknown parameter 'journal'"),
        (f"postgresql://u:{SECRET}@h/db?table_prefix=a;drop", "not a plain SQL name"),
        ("kafka:", "valid Kafka topic"),
        ("kafka:bad topic", "valid Kafka topic"),
        ("kafka:out", "needs a Kafka bootstrap"),
    ],
)
def test_bad_urls_are_one_line_usage_errors(url: str, problem: str) -> None:
    with pytest.raises(UsageError) as info:
        open_sink(url)
    line = info.value.line()
    assert problem in line and "\n" not in line and SECRET not in line
    assert info.value.fix, "the error must say how to fix it"


def test_unwritable_sqlite_paths(tmp_path: Path) -> None:
    afile = tmp_path / "file.txt"
    afile.write_text("not a directory")
    for url, problem in [
        (f"sqlite:///{tmp_path}/missing/dir/sink.db", "does not exist"),
        (f"sqlite:///{afile}/sink.db", "does not exist"),
        (f"sqlite:///{tmp_path}", "is a directory"),
    ]:
        with pytest.raises(UsageError, match=problem) as info:
            open_sink(url)
        assert "\n" not in info.value.line()
    assert isinstance(open_sink(f"sqlite:///{tmp_path}/ok.db"), SqliteSink)


def test_not_a_database_file_is_a_runtime_failure(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    sink = open_sink(f"sqlite:///{junk}")
    with pytest.raises(RuntimeFailure, match=r"junk\.db") as info:
        sink.open("g")
    assert "\n" not in info.value.line()


def test_unreachable_postgresql_does_not_leak_the_password() -> None:
    sink = open_sink(f"postgresql://bob:{SECRET}@127.0.0.1:1/app?connect_timeout=2")
    assert isinstance(sink, PostgresSink)
    with pytest.raises(RuntimeFailure) as info:
        sink.open("g")
    line = info.value.line()
    assert "postgresql://bob:***@127.0.0.1:1/app" in line and "pg_ctlcluster" in line
    assert SECRET not in line and "\n" not in line
    assert info.value.__cause__ is None and info.value.__context__ is not None
    assert SECRET not in repr(info.value.args)


def test_postgresql_refusal_does_not_leak_the_password() -> None:
    base = postgres_url()
    user = base.split("//", 1)[1].split("@", 1)[0]
    sink = open_sink(f"postgresql://{user}:{SECRET}@{PG_HOST}/htmqc_no_such_database")
    with pytest.raises(RuntimeFailure, match="htmqc_no_such_database") as info:
        sink.open("g")
    assert SECRET not in info.value.line() and "\n" not in info.value.line()
