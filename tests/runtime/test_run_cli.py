"""``htmqc run``: option sources and bad input (one line, exit 2 usage / 1 runtime)."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from htmqc.broker import Broker
from htmqc.cli import main
from htmqc.config import redacted, resolve
from htmqc.errors import UsageError
from htmqc.produce import produce

BASE = ["--bootstrap", "127.0.0.1:1", "--topic", "t", "--group", "g", "--connect-seconds", "0.5"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["run", *argv])
    err = capsys.readouterr().err
    return code, err


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("htmqc: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("handler", "needle"),
    [
        ("no_such_module_xyz:f", "not found"),
        ("examples.effects:nope", "has no attribute"),
        ("tests.runtime.handlers:NOT_CALLABLE", "not a function"),
        ("examples.effects", "MODULE:FUNCTION"),
    ],
)
def test_bad_handler(capsys: pytest.CaptureFixture[str], handler: str, needle: str) -> None:
    code, err = run(capsys, handler, *BASE)
    assert code == 2
    assert needle in error_line(err)


def test_a_handler_module_in_the_working_directory_is_found(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As ``python -m`` does: ``./cwd_handler_mod.py`` loads without PYTHONPATH (the
    run then stops at the unreachable broker, after the handler was found)."""
    (tmp_path / "cwd_handler_mod.py").write_text("def handle(msg):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cwd_handler_mod", raising=False)
    code, err = run(capsys, "cwd_handler_mod:handle", *BASE)
    assert "cannot reach broker" in error_line(err)
    assert code == 1
    assert sys.path[0] == str(tmp_path)
    sys.modules.pop("cwd_handler_mod", None)


def test_unreachable_broker_and_no_secret_in_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(
        capsys,
        "examples.effects:record",
        *BASE,
        "--kafka-config",
        "sasl.password=hunter2",
        "--mode",
        "exactly-once",
        "--sink",
        "postgresql://u:hunter2@127.0.0.1:1/db",
    )
    assert code == 1
    assert "cannot reach broker" in error_line(err)
    assert "hunter2" not in err


@pytest.mark.parametrize(
    ("sink", "needle"),
    [("mysql://x/y", "sink"), ("sqlite:///no/such/dir/x.db", "does not exist")],
)
def test_bad_sink(capsys: pytest.CaptureFixture[str], sink: str, needle: str) -> None:
    code, err = run(
        capsys, "examples.effects:record", *BASE, "--mode", "exactly-once", "--sink", sink
    )
    assert code == 2
    assert needle in error_line(err)


def test_bad_toml_unknown_option_and_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("workers = [\n")
    code, err = run(capsys, "examples.printer:show", *BASE, "--config", str(bad))
    assert code == 2 and "not valid TOML" in error_line(err)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("wrokers = 3\n")
    code, err = run(capsys, "examples.printer:show", *BASE, "--config", str(unknown))
    assert code == 2 and "unknown option 'wrokers'" in error_line(err)
    with pytest.raises(SystemExit) as exc:
        main(["run", "examples.printer:show", *BASE, "--no-such-flag"])
    assert exc.value.code == 2


def test_precedence_cli_over_env_over_toml(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text(
        '[run]\nworkers = 2\ntxn-ms = 7\ntopic = "from-toml"\n'
        '[kafka]\n"fetch.wait.max.ms" = 10\n"sasl.password" = "s3cret"\n'
    )
    env = {
        "HTMQC_WORKERS": "3",
        "HTMQC_TOPIC": "from-env",
        "HTMQC_KAFKA_CONFIG": "fetch.wait.max.ms=20",
    }
    cli = {"bootstrap": "b:1", "group": "g", "workers": 4}
    opts = resolve(cli, {}, config_file=str(toml), environ=env)
    assert (opts.workers, opts.topic, opts.txn_ms) == (4, "from-env", 7.0)
    assert opts.kafka_config["fetch.wait.max.ms"] == "20"
    assert redacted(opts.kafka_config)["sasl.password"] == "***"
    opts = resolve({"bootstrap": "b:1", "group": "g"}, {}, config_file=str(toml), environ={})
    assert (opts.workers, opts.topic) == (2, "from-toml")
    with pytest.raises(UsageError, match="--workers must be a int"):
        resolve({"bootstrap": "b", "group": "g", "topic": "t"}, {}, environ={"HTMQC_WORKERS": "x"})
    with pytest.raises(UsageError, match="--topic is required"):
        resolve({"bootstrap": "b", "group": "g"}, {}, environ={})


def test_group_protocol_option(capsys: pytest.CaptureFixture[str]) -> None:
    required = {"bootstrap": "b:1", "group": "g", "topic": "t"}
    assert resolve(required, {}, environ={}).group_protocol == "classic"
    env = {"HTMQC_GROUP_PROTOCOL": "consumer"}
    assert resolve(required, {}, environ=env).group_protocol == "consumer"
    with pytest.raises(UsageError) as info:
        resolve(required, {}, environ={"HTMQC_GROUP_PROTOCOL": "cooperative"})
    assert info.value.line() == (
        "--group-protocol 'cooperative' is unknown; use one of: classic, consumer"
    )
    with pytest.raises(SystemExit) as exc:
        main(["run", "examples.printer:show", *BASE, "--group-protocol", "eager"])
    assert exc.value.code == 2
    assert "invalid choice: 'eager'" in capsys.readouterr().err


@pytest.mark.broker
def test_missing_topic_then_create_topic(
    capsys: pytest.CaptureFixture[str], broker: Broker, tmp_path: Path
) -> None:
    args = [
        "examples.printer:show",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        "absent-topic-x",
        "--group",
        "g-missing",
    ]
    code, err = run(capsys, *args)
    assert code == 2 and "does not exist" in error_line(err)
    code, err = run(capsys, *args, "--create-topic", "2", "--idle-exit", "0.5")
    assert code == 0, err


@pytest.mark.broker
def test_message_too_large_is_dead_lettered(
    capsys: pytest.CaptureFixture[str], broker: Broker, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(partitions=1)
    produce(broker.bootstrap, topic, 5, keys=1, size=100)
    produce(broker.bootstrap, topic, 5, keys=1, size=20, start_id=5)
    db = tmp_path / "dlq.db"
    code, err = run(
        capsys,
        "examples.effects:record",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic,
        "--group",
        "g-big",
        "--mode",
        "exactly-once",
        "--sink",
        f"sqlite:///{db}",
        "--max-message-bytes",
        "50",
        "--idle-exit",
        "1",
    )
    assert code == 0, err
    with sqlite3.connect(db) as conn:
        letters = conn.execute('SELECT "offset", reason FROM htmqc_dead_letters').fetchall()
        ids = sorted(r[0] for r in conn.execute("SELECT id FROM effects"))
        committed = conn.execute("SELECT committed FROM htmqc_positions").fetchone()[0]
    assert [o for o, _ in letters] == [0, 1, 2, 3, 4]
    assert all("larger than --max-message-bytes 50" in r for _, r in letters)
    assert ids == [5, 6, 7, 8, 9]
    assert committed == 10
