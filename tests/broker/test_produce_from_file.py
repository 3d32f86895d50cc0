"""``htmqc produce --from FILE``: users' own records, checked whole before any is sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from htmqc.broker import Broker
from htmqc.errors import UsageError
from htmqc.records_file import read_records, resolve_format
from tests.broker.readback import TopicFactory, read_all
from tests.broker.test_broker_cli import htmqc, one_error_line

#: Text a file can hold in UTF-8 (no lone surrogates).
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
json_scalars = st.none() | st.booleans() | st.integers() | texts
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)


@given(st.lists(json_values, max_size=8))
def test_json_lines_are_sent_as_written(tmp_path_factory: pytest.TempPathFactory,
                                         values: list[object]) -> None:
    path = tmp_path_factory.mktemp("jsonl") / "in.jsonl"
    lines = [json.dumps(v, indent=None, ensure_ascii=False) for v in values]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert read_records(str(path)) == [(None, line.encode("utf-8")) for line in lines]


@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",),
                                      blacklist_characters="\r\n"), max_size=6), max_size=8))
def test_plain_lines_are_one_record_each_empty_ones_too(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str]
) -> None:
    path = tmp_path_factory.mktemp("lines") / "in.txt"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert read_records(str(path)) == [(None, line.encode("utf-8")) for line in lines]


def test_keys_come_from_the_field_and_blank_and_crlf_lines_are_handled(tmp_path: Path) -> None:
    path = tmp_path / "payments.ndjson"
    path.write_bytes(b'{"account": "a-1", "amount": 5}\r\n\n{"account": 42}\n{"account": true}')
    assert read_records(str(path), key_field="account") == [
        (b"a-1", b'{"account": "a-1", "amount": 5}'),
        (b"42", b'{"account": 42}'),
        (b"true", b'{"account": true}'),
    ]


@pytest.mark.parametrize(
    ("content", "fmt", "key_field", "error"),
    [
        (b'{"a": 1}\n{"a": \n', "jsonl", None, "in.txt line 2 is not JSON"),
        (b'{"a": 1}\n\xff\n', "jsonl", None, "in.txt line 2 is not UTF-8"),
        (b'{"a": 1}\n{"b": 2}\n', "jsonl", "a", "in.txt line 2 has no field 'a'"),
        (b'{"a": null}\n', "jsonl", "a", "in.txt line 1 has no field 'a' (or it is null)"),
        (b'[1]\n', "jsonl", "a", "in.txt line 1 is not a JSON object"),
        (b'{"a": [1]}\n', "jsonl", "a", "field 'a' is a JSON list"),
        (b"x\n", "lines", "a", "--key-field needs JSON lines"),
        (b"x\n", "csv", None, "unknown --format 'csv'"),
    ],
)
def test_bad_files_are_refused_naming_the_line(
    tmp_path: Path, content: bytes, fmt: str, key_field: str | None, error: str
) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=error.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        read_records(str(path), fmt, key_field)


def test_a_byte_order_mark_is_not_data_and_deep_nesting_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n')
    assert read_records(str(path)) == [(None, b'{"a": 1}')]
    deep = tmp_path / "deep.jsonl"
    deep.write_bytes(b"[" * 100_000 + b"]" * 100_000 + b"\n")
    with pytest.raises(UsageError, match=r"deep\.jsonl line 1 nests too deeply"):
        read_records(str(deep))


def test_auto_format_follows_the_suffix() -> None:
    assert [resolve_format(p, "auto") for p in ("a.jsonl", "b.NDJSON", "c.json", "d.txt", "-")] \
        == ["jsonl", "jsonl", "jsonl", "lines", "lines"]


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        (["--from", "/nonexistent/x.jsonl"], "cannot read /nonexistent/x.jsonl"),
        (["--key-field", "a", "--count", "3"], "--format and --key-field need --from"),
        ([], "--count is required; pass --count N, or --from FILE"),
        (["--from", "{bad}", "--count", "3"], "--count 3 is more than the 2 records given"),
        (["--from", "{bad}", "--transactional", "--abort-every", "2"],
         "--abort-every writes test messages only"),
        (["--from", "{empty}"], "holds no records"),
        (["--from", "{big}"], "record 2 of"),
        (["--from", "{big}", "--kafka-config", "message.max.bytes=2000000"], "cannot reach"),
    ],
)
def test_produce_from_bad_input_is_one_line(tmp_path: Path, extra: list[str], text: str) -> None:
    (tmp_path / "two.txt").write_text("a\nb\n")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    (tmp_path / "big.txt").write_bytes(b"small\n" + b"x" * 1_000_001 + b"\n")
    extra = [a.replace("{bad}", str(tmp_path / "two.txt"))
             .replace("{empty}", str(tmp_path / "empty.jsonl"))
             .replace("{big}", str(tmp_path / "big.txt")) for a in extra]
    result = htmqc("produce", "--bootstrap", "127.0.0.1:1", "--topic", "t", *extra)
    assert result.returncode == (1 if text == "cannot reach" else 2)
    assert text in one_error_line(result)


def test_a_bad_line_sends_nothing(broker: Broker, new_topic: TopicFactory, tmp_path: Path) -> None:
    topic = new_topic(partitions=1)
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": 1}\n{"id": 2}\nnot json\n')
    result = htmqc("produce", "--bootstrap", broker.bootstrap, "--topic", topic, "--from",
                   str(path))
    assert result.returncode == 2
    assert "line 3 is not JSON" in one_error_line(result)
    assert read_all(broker.bootstrap, topic) == []


def test_produce_from_a_file_sends_its_records_keyed(
    broker: Broker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    events = [{"account": f"acct-{i % 3}", "amount": i} for i in range(10)]
    path = tmp_path / "payments.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    result = htmqc("produce", "--bootstrap", broker.bootstrap, "--topic", topic, "--from",
                   str(path), "--key-field", "account", "--transactional")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"produced 10 messages to {topic} in ")
    got = read_all(broker.bootstrap, topic)
    assert sorted((r.key, r.value) for r in got) == sorted(
        (e["account"].encode(), json.dumps(e).encode()) for e in events  # type: ignore[union-attr]
    )
    for r in got:
        assert r.header_id is None
    by_key: dict[bytes | None, set[int]] = {}
    for r in got:
        by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(parts) == 1 for parts in by_key.values())  # one key, one partition
