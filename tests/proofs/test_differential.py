"""The differential check: the code agrees with the proved model, and a one-line
bug in the core makes it disagree.

``CORE_MUTANTS`` is data: ``(file under src/htmqc/core, old text, new text)``.
The old text is one line of the file (with a neighbouring line only where the
line alone occurs twice); it must occur exactly once. Each mutant is applied to
an in-memory copy of the module's source, the core's modules are executed again
from those sources (with runtime contracts off, so that the check is shown to
catch the bug on its own), and :func:`proofs.differential.check` must report a
disagreement.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import NamedTuple

import pytest

import htmqc.core
from proofs import differential, model, run, tracker

pytestmark = pytest.mark.formal

CORE = Path(htmqc.core.__file__).parent


class Mutant(NamedTuple):
    """A one-line bug: ``old`` (exactly once in ``file``) becomes ``new``."""

    file: str
    old: str
    new: str


CORE_MUTANTS: dict[str, Mutant] = {
    # the audit's classes of bugs
    "held_boundary_in_fetched": Mutant(
        "partition.py",
        "            self._skip = {o for o in skip if o >= hi}",
        "            self._skip = {o for o in skip if o > hi}",
    ),
    "batch_finishes_from_any_live_state": Mutant(
        "partition.py",
        "            if popped.count(source) != n:",
        "            if popped.count(None):",
    ),
    "commit_hands_out_next": Mutant(
        "partition.py",
        "            return self._processed",
        "            return self._next",
    ),
    "ack_above_watermark_accepted": Mutant(
        "partition.py",
        "        if offset > self._processed:",
        "        if False:",
    ),
    "apply_does_not_set_unsent": Mutant(
        "partition.py",
        "            self._failures.pop(offset, None)\n            self._unsent = True",
        "            self._failures.pop(offset, None)",
    ),
    "finished_above_drops_held": Mutant(
        "partition.py",
        "        return done + tuple(sorted(self._skip)) if self._skip else done",
        "        return done",
    ),
    "advance_to_last": Mutant(
        "partition.py",
        "        self._processed = order[0]",
        "        self._processed = order[-1]",
    ),
    "commit_failed_does_not_set_unsent": Mutant(
        "partition.py",
        "        self._requested = self._committed\n        self._unsent = True",
        "        self._requested = self._committed",
    ),
    # more, across partition.py, consumer.py and retry.py
    "retry_due_allowed_while_draining": Mutant(
        "partition.py",
        "_FORBIDDEN_WHILE_DRAINING = frozenset({Event.START, Event.RETRY_DUE})",
        "_FORBIDDEN_WHILE_DRAINING = frozenset({Event.START})",
    ),
    "duplicate_ack_moves": Mutant(
        "partition.py",
        "        if offset <= self._committed:",
        "        if offset < self._committed:",
    ),
    "range_end_at_last_offset_accepted": Mutant(
        "partition.py",
        "            if hi <= last:",
        "            if hi < last:",
    ),
    "fetch_does_not_advance": Mutant(
        "partition.py",
        "        if self._processed not in self._live:",
        "        if False:",
    ),
    "epoch_not_bumped": Mutant(
        "consumer.py",
        "        self._last_epoch += 1",
        "        self._last_epoch += 0",
    ),
    "stale_epoch_accepted": Mutant(
        "consumer.py",
        "        if self._epochs.get(tp) != epoch:",
        "        if tp not in self._epochs:",
    ),
    "failed_retries_past_max_retries": Mutant(
        "failures.py",
        "        spent=attempts > retry.max_retries,",
        "        spent=False,",
    ),
    "revoked_without_last_commit": Mutant(
        "consumer.py",
        "        commit = self.commit_requested(tp)\n        self._parts.pop(tp, None)",
        "        commit = None\n        self._parts.pop(tp, None)",
    ),
    "commit_without_finished_above": Mutant(
        "consumer.py",
        "finished_above=tracker.finished_above()",
        "finished_above=()",
    ),
    "retry_budget_off_by_one": Mutant(
        "failures.py",
        "        spent=attempts > retry.max_retries,",
        "        spent=attempts >= retry.max_retries,",
    ),
}

#: Executed again from source, in this order (each imports the ones before it).
RELOADED = ("contracts", "retry", "decisions", "failures", "partition", "consumer")


def mutated_source(mutant: Mutant) -> str:
    """The file's source with the mutant applied; the old text must occur once."""
    source = (CORE / mutant.file).read_text()
    count = source.count(mutant.old)
    if count != 1:
        raise ValueError(f"{mutant.file}: {mutant.old!r} occurs {count} times, not once")
    return source.replace(mutant.old, mutant.new)


@contextmanager
def core_with(mutant: Mutant | None) -> Iterator[SimpleNamespace]:
    """The core's classes, its modules executed from (mutated) in-memory sources with
    contracts off; ``sys.modules`` is restored afterwards."""
    saved = {name: sys.modules.get(f"htmqc.core.{name}") for name in RELOADED}
    modules: dict[str, ModuleType] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HTMQC_CONTRACTS", "0")
        try:
            for name in RELOADED:
                path = CORE / f"{name}.py"
                spec = importlib.util.spec_from_file_location(f"htmqc.core.{name}", path)
                assert spec is not None
                module = importlib.util.module_from_spec(spec)
                hit = mutant is not None and mutant.file == path.name
                source = mutated_source(mutant) if hit and mutant else path.read_text()
                sys.modules[spec.name] = module
                exec(compile(source, str(path), "exec"), module.__dict__)
                modules[name] = module
            yield SimpleNamespace(
                ConsumerCore=modules["consumer"].ConsumerCore,
                RetryPolicy=modules["retry"].RetryPolicy,
                FailureKind=modules["retry"].FailureKind,
                CoreError=htmqc.core.CoreError,
            )
        finally:
            for name, kept in saved.items():
                if kept is None:
                    sys.modules.pop(f"htmqc.core.{name}", None)
                else:
                    sys.modules[f"htmqc.core.{name}"] = kept


def test_the_code_agrees_with_the_model() -> None:
    report = differential.check()
    assert report.ok, report.line()
    assert report.states > 1000 and report.transitions > 100_000, report.line()


def test_the_reloaded_core_agrees_too() -> None:
    # The mutant tests below are meaningful only if the unmutated reload passes.
    with core_with(None) as core:
        assert not hasattr(core.ConsumerCore.assign, "__wrapped__"), "contracts are off"
        report = differential.check(differential.Domain(top=1), core=core)
    assert report.ok, report.line()


def test_proofs_main_fails_on_a_disagreement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with core_with(CORE_MUTANTS["epoch_not_bumped"]) as core:
        monkeypatch.setattr(run, "all_obligations", lambda: iter([tracker.init_establishes()]))
        monkeypatch.setattr(run, "DIFFERENTIAL", lambda: differential.check(core=core))
        monkeypatch.chdir(tmp_path)
        assert run.main() == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("DISAGREES differential:")]
    assert len(lines) == 1, out
    assert "event=assign(t/0, 0, [])" in lines[0] and "code=0" in lines[0] and "model=1" in lines[0]
    assert "FAILED: differential" in out


@pytest.mark.parametrize("name", sorted(CORE_MUTANTS))
def test_a_core_mutant_is_caught(name: str) -> None:
    with core_with(CORE_MUTANTS[name]) as core:
        report = differential.check(core=core)
    line = report.line()
    assert not report.ok, f"{name} survived: {line}"
    assert "\n" not in line and all(f" {w}=" in line for w in ("event", "code", "model")), line


#: The model transition each Z3 mutant of :mod:`proofs.tracker` takes the place of.
MODEL_MUTANT_REPLACES = {
    "mutant:fetched_skip_boundary": "fetched",
    "mutant:fetched_no_advance_over_gap": "fetched",
    "mutant:batch_finish_from_any_live_state": "apply_many[succeeded]",
    "mutant:finish_without_unsent": "apply[succeeded]",
    "mutant:finish_without_advance": "apply[succeeded]",
    "mutant:advance_to_last_live": "apply[succeeded]",
    "mutant:commit_requested_hands_out_next": "commit_requested",
    "mutant:commit_acked_above_watermark": "commit_acked",
    "mutant:late_ack_moves_committed_back": "commit_acked",
    "mutant:commit_failed_without_unsent": "commit_failed",
    "mutant:retry_past_budget": "consumer.failed",
}
#: Z3 mutants that change only a ghost field (the code has none to compare).
GHOST_ONLY = {"mutant:commit_drops_held"}


def test_every_model_mutant_is_placed() -> None:
    assert set(MODEL_MUTANT_REPLACES) | GHOST_ONLY == {m.name for m, _ in tracker.MUTANTS}


@pytest.mark.parametrize("name", sorted(MODEL_MUTANT_REPLACES))
def test_a_model_mutant_disagrees_with_the_code(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The proofs and the check read the same definitions: put a mutant that Z3
    # refutes in the model's place and the code no longer agrees with the model.
    mutant = next(m for m, _ in tracker.MUTANTS if m.name == name)
    monkeypatch.setitem(model.TRANSITIONS, MODEL_MUTANT_REPLACES[name], mutant)  # type: ignore[index]
    report = differential.check()
    assert not report.ok, report.line()
