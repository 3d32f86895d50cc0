"""``htmqc chaos`` option errors: one line, exit 2, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from htmqc.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--db", "sqlite", "--kinds", "zombie", "--faults", "1"], "zombie fault needs PostgreSQL"),
        (["--kinds", "kill,meteor"], "unknown fault kind"),
        (["--partitions", "0"], "--partitions must be at least 1"),
        (["--faults", "-1"], "--faults must not be negative"),
        (["--report", "/nonexistent-dir/r.json"], "no such directory"),
    ],
)
def test_bad_options_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["chaos", "--work-dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1  # one line, no traceback


def test_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["chaos", "--help"])
    out = capsys.readouterr().out
    for option in ("--seed", "--partitions", "--consumers", "--messages", "--faults"):
        assert option in out
    assert "--report" in out and "--trace-dir" in out


def test_sqlite_default_kinds_leave_out_the_zombie() -> None:
    from htmqc.cli.chaos_cmd import _kinds

    assert "zombie" not in _kinds("all", "sqlite")
    assert "zombie" in _kinds("all", "postgresql")
    assert _kinds("kill,zombie", "sqlite") == ("kill", "zombie")  # refused later, by name
