"""``htmqc audit``: exit codes 0 / 1 / 2, the JSON report, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from htmqc.cli import main
from tests.audit.files import write_scenario
from tests.audit.scenario import clean, combined


def args_for(paths: dict[str, Path], effects: str | None = None) -> list[str]:
    return [
        "audit",
        "--produced", str(paths["produced"]),
        "--effects", effects or str(paths["effects"]),
        "--dlq", str(paths["dlq"]),
        "--committed", str(paths["committed"]),
        "--aborted", str(paths["aborted"]),
    ]  # fmt: skip


def test_clean_run_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = write_scenario(clean(), tmp_path)
    assert main(args_for(paths)) == 0
    assert "OK" in capsys.readouterr().out


def test_anomalies_exit_1_and_the_json_report_lists_them(tmp_path: Path) -> None:
    paths = write_scenario(combined(), tmp_path)
    out = tmp_path / "report.json"
    sqlite = f"sqlite:///{paths['sqlite']}?generation=fence"
    assert main([*args_for(paths, sqlite), "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["ok"] is False
    assert set(report["counts"].values()) == {1}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dlq", "/nonexistent/dlq.jsonl"], "--dlq /nonexistent/dlq.jsonl: no such file"),
        (["--examples", "-1"], "--examples must not be negative"),
        (["--master", "local[1]"], "--master needs --spark"),
        (["--effects", "sqlite:///nope.db"], "no SQLite file at nope.db"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    paths = write_scenario(clean(), tmp_path)
    assert main([*args_for(paths), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("htmqc: error: ")
    assert message in err


def test_malformed_line_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = write_scenario(clean(), tmp_path)
    paths["produced"].write_text('{"id": "00"}\nnot json\n')
    assert main(args_for(paths)) == 2
    assert "produced.jsonl:2: not JSON" in capsys.readouterr().err
