"""``htmqc chaos`` option errors: one line, exit 2, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from htmqc.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--sink", "sqlite", "--kinds", "zombie", "--faults", "1"],
            "zombie fault needs PostgreSQL",
        ),
        (["--sink", "postgresql,oracle"], "bad --sink"),
        (["--sink", "kafka"], "cannot be judged on the bundled broker"),
        (["--kinds", "broker-pause", "--faults", "1"], "need the three-node cluster"),
        (["--broker", "kafka", "--kinds", "kill,broker-isolate"], "need the three-node cluster"),
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


def test_default_kinds_fit_the_broker_and_the_sinks() -> None:
    from htmqc.chaos.harness import default_kinds
    from htmqc.chaos.schedule import BROKER_KINDS, CONSUMER_KINDS
    from htmqc.cli.chaos_cmd import _kinds

    assert _kinds("all") is None  # the harness picks
    assert _kinds("kill,zombie") == ("kill", "zombie")  # refused later (SQLite), by name
    assert "zombie" not in default_kinds("tansu", ("sqlite",))
    assert "zombie" not in default_kinds("kafka-cluster", ("postgresql", "sqlite"))
    assert default_kinds("kafka", ("postgresql",)) == CONSUMER_KINDS
    assert default_kinds("kafka-cluster", ("postgresql", "kafka")) == (
        CONSUMER_KINDS + BROKER_KINDS
    )
