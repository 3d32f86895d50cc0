"""The generated lifecycle diagram and spec tables are current, and follow the table."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest

from htmqc.core import lifecycle
from htmqc.core.lifecycle import Event, MessageState
from spec import diagram

S, E = MessageState, Event


def test_committed_svg_and_readme_are_current() -> None:
    assert diagram.stale_files() == []


def test_every_edge_and_state_is_drawn() -> None:
    svg = diagram.render_svg()
    for state in MessageState:
        assert f'id="state-{state.value}"' in svg
    for event in Event:
        assert f">{event.value}</text>" in svg
    assert svg.count('class="edge"') == len(lifecycle.EDGES)


def test_a_changed_table_changes_every_output(monkeypatch: pytest.MonkeyPatch) -> None:
    before = (diagram.render_svg(), diagram.render_table(), diagram.render_mermaid())
    changed = dict(lifecycle.TRANSITIONS)
    changed[S.RETRYING] = MappingProxyType({E.RETRY_DUE: S.PENDING})
    monkeypatch.setattr(lifecycle, "TRANSITIONS", MappingProxyType(changed))
    after = (
        diagram.render_svg(lifecycle.TRANSITIONS),
        diagram.render_table(lifecycle.TRANSITIONS),
        diagram.render_mermaid(lifecycle.TRANSITIONS),
    )
    for old, new in zip(before, after, strict=True):
        assert old != new
    assert "Retrying --> Pending: retry_due" in after[2]


def test_check_reports_a_stale_svg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "lifecycle.svg"
    stale.write_text(diagram.render_svg().replace("Retrying", "Waiting"))
    monkeypatch.setattr(diagram, "SVG_PATH", stale)
    assert diagram.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err


def test_missing_marker_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    monkeypatch.setattr(diagram, "README_PATH", readme)
    monkeypatch.setattr(diagram, "SVG_PATH", tmp_path / "lifecycle.svg")
    assert diagram.main([]) == 2
    err = capsys.readouterr().err
    assert "GENERATED: transitions" in err
    assert len(err.strip().splitlines()) == 1
