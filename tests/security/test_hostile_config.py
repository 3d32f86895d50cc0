"""Hostile configuration: every bad value is refused at start, one line, exit code 2.

Each case goes through the real command line (``htmqc.cli.main``) in-process,
from the command line, ``HTMQC_*`` variables or a TOML file; nothing reaches
a broker (the bootstrap points at a closed port, so a case that slipped
through would fail with exit code 1, not 2).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from htmqc.cli import main
from htmqc.config import LIMITS, MAX_CONFIG_BYTES

BASE = ["run", "examples.printer:show", "--bootstrap", "127.0.0.1:1", "--group", "g"]


def run_cli(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    *args: str,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    try:
        code = main([*BASE, *args])
    except SystemExit as exc:  # argparse refusing a flag's type
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def assert_one_line(code: int, err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("htmqc: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


CLI_CASES = [
    (["--topic", "t", "--workers", "100000"], "--workers must be <= 1024"),
    (["--topic", "t", "--workers", "-1"], "--workers must be >= 0"),
    (["--topic", "t", "--max-in-flight", "0"], "--max-in-flight must be >= 1"),
    (["--topic", "t", "--max-in-flight", "-5"], "--max-in-flight must be >= 1"),
    (["--topic", "t", "--batch-size", "0"], "--batch-size must be >= 1"),
    (["--topic", "t", "--batch-size", "5000000"], "--batch-size must be <= 1e+06"),
    (["--topic", "t", "--txn-messages", "0"], "--txn-messages must be >= 1"),
    (["--topic", "t", "--txn-ms", "0"], "--txn-ms must be > 0"),
    (["--topic", "t", "--commit-ms", "-1"], "--commit-ms must be > 0"),
    (["--topic", "t", "--max-message-bytes", "0"], "--max-message-bytes must be >= 1"),
    (["--topic", "t", "--max-message-bytes", "-1"], "--max-message-bytes must be >= 1"),
    (["--topic", "t", "--max-in-flight-bytes", "0"], "--max-in-flight-bytes must be >= 1"),
    (["--topic", "t", "--create-topic", "0"], "--create-topic must be >= 1"),
    (["--topic", "t", "--create-topic", "1000000"], "--create-topic must be <= 10000"),
    (["--topic", "t", "--max-messages", "0"], "--max-messages must be >= 1"),
    (["--topic", "t", "--idle-exit", "0"], "--idle-exit must be > 0"),
    (["--topic", "t", "--connect-seconds", "0"], "--connect-seconds must be > 0"),
    (["--topic", "t", "--shutdown-seconds", "-1"], "--shutdown-seconds must be >= 0"),
    (["--topic", "t", "--max-retries", "-1"], "--max-retries must be >= 0"),
    (["--topic", "t", "--poison-threshold", "0"], "--poison-threshold must be >= 1"),
    (["--topic", "t", "--poison-window", "0"], "--poison-window must be > 0"),
    (["--topic", "t", "--metrics-port", "70000"], "--metrics-port must be <= 65535"),
    (["--topic", "t", "--metrics-port", "-1"], "--metrics-port must be >= 0"),
    (["--topic", "t", "--txn-ms", "nan"], "--txn-ms must be a finite number"),
    (["--topic", "t", "--commit-ms", "inf"], "--commit-ms must be a finite number"),
    (["--topic", "t", "--backoff-ms", "500", "--backoff-max-ms", "100"], "above --backoff-max-ms"),
    (["--topic", "t", "--workers", "many"], "invalid int value"),
    (["--topic", "t\nINJECTED"], "--topic contains a control character"),
    (["--topic", "t" * 5000], "--topic is longer than 4096"),
    (["--topic", "t", "--kafka-config", "no-equals-sign"], "'no-equals-sign' is not key=value"),
    (["--topic", "t", "--mode", "twice"], "invalid choice"),
]


@pytest.mark.parametrize(("args", "needle"), CLI_CASES, ids=lambda v: str(v)[:60])
def test_cli_values_are_refused(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    needle: str,
) -> None:
    code, err = run_cli(capsys, monkeypatch, *args)
    assert_one_line(code, err, needle)


ENV_CASES = [
    ({"HTMQC_WORKERS": "100000"}, "--workers must be <= 1024"),
    ({"HTMQC_WORKERS": "2.5"}, "--workers must be a int"),
    ({"HTMQC_WORKERS": "lots"}, "--workers must be a int"),
    ({"HTMQC_MAX_IN_FLIGHT": "0"}, "--max-in-flight must be >= 1"),
    ({"HTMQC_BATCH_SIZE": "-3"}, "--batch-size must be >= 1"),
    ({"HTMQC_TXN_MS": "-inf"}, "--txn-ms must be a finite number"),
    ({"HTMQC_RETRY_TOPIC": "maybe"}, "--retry-topic must be true or false"),
    ({"HTMQC_FLOW": "sideways"}, "--flow 'sideways' is unknown"),
    ({"HTMQC_LOG_FORMAT": "xml"}, "--log-format 'xml' is unknown"),
    ({"HTMQC_SINK": "sqlite:///x.db\x1b[2Jx"}, "--sink contains a control character"),
    ({"HTMQC_KAFKA_CONFIG": "a=1,oops"}, "'oops' is not key=value"),
    ({"HTMQC_KAFKA_CONFIG": "sasl.password:hunter22"}, "a secret-looking item is not key=value"),
]


@pytest.mark.parametrize(("env", "needle"), ENV_CASES, ids=lambda v: str(v)[:60])
def test_env_values_are_refused(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    needle: str,
) -> None:
    code, err = run_cli(capsys, monkeypatch, "--topic", "t", env=env)
    assert_one_line(code, err, needle)
    assert "hunter22" not in err


TOML_CASES = [
    ("workers = 100000\n", "--workers must be <= 1024"),
    ("workers = -1\n", "--workers must be >= 0"),
    ("workers = true\n", "--workers must be a int, got a bool"),
    ("workers = 2.5\n", "--workers must be a whole number"),
    ("workers = [1, 2]\n", "--workers must be a int, got a list"),
    ("max-in-flight = 0\n", "--max-in-flight must be >= 1"),
    ("max_message_bytes = -10\n", "--max-message-bytes must be >= 1"),
    ("txn-ms = nan\n", "--txn-ms must be a finite number"),
    ("commit_ms = inf\n", "--commit-ms must be a finite number"),
    ("sink = 5\n", "--sink must be text, got a int"),
    ('retry_topic = "perhaps"\n', "--retry-topic must be true or false"),
    ("wrokers = 3\n", "unknown option 'wrokers'"),
    ("[run]\nbatch_size = 0\n", "--batch-size must be >= 1"),
    ("[run]\nnope = 1\n", "unknown option 'nope'"),
    ("[runn]\nworkers = 1\n", "unknown table [runn]"),
    ("run = 5\n", "run must be a table"),
    ("kafka = 5\n", "kafka must be a table"),
    (
        '[kafka]\n"sasl.jaas" = { a = 1 }\n',
        "[kafka] 'sasl.jaas' must be a string, number or boolean",
    ),
    ('[kafka]\n"bootstrap.servers" = [1]\n', "must be a string, number or boolean"),
    ("workers = \n", "is not valid TOML"),
]


@pytest.mark.parametrize(("text", "needle"), TOML_CASES, ids=lambda v: str(v)[:60])
def test_toml_values_are_refused(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    text: str,
    needle: str,
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(text)
    code, err = run_cli(capsys, monkeypatch, "--topic", "t", "--config", str(config))
    assert_one_line(code, err, needle)


def test_binary_and_huge_config_files_are_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"workers = 1\n\xff\xfe\x00garbage")
    code, err = run_cli(capsys, monkeypatch, "--topic", "t", "--config", str(binary))
    assert_one_line(code, err, "is not UTF-8")
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"# " + b"x" * MAX_CONFIG_BYTES + b"\n")
    code, err = run_cli(capsys, monkeypatch, "--topic", "t", "--config", str(huge))
    assert_one_line(code, err, f"larger than {MAX_CONFIG_BYTES} bytes")
    code, err = run_cli(capsys, monkeypatch, "--topic", "t", "--config", str(tmp_path))
    assert_one_line(code, err, "cannot read config file")


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_every_limit_has_a_floor_and_a_ceiling(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
) -> None:
    """One value below and one above each bound, through the TOML file."""
    low, high, low_ok = LIMITS[name]
    below = low - 1 if low_ok else low
    for value, needle in ((below, "must be >"), (high * 2 + 1, "must be <=")):
        config = tmp_path / "limits.toml"
        config.write_text(f"{name} = {int(value)}\n")
        code, err = run_cli(capsys, monkeypatch, "--topic", "t", "--config", str(config))
        assert_one_line(code, err, f"--{name.replace('_', '-')} {needle}")
