"""Graph replay: every edge of the small TLA+ models' state graphs, replayed
through the real core; in-memory mutants of the core are rejected; the TLC
dump parser and the refinement mapping's epoch history."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from htmqc.core import ConsumerCore, Event, MessageState, PartitionTracker
from model_checks import graph_replay as gr
from model_checks.refinement import EpochHistory, MappingError
from model_checks.state_graph import Fun, StateGraph, graph_config, load_graph, parse_value

pytestmark = pytest.mark.formal

ENTRIES = {e["name"]: e for e in gr.replay_entries("small")}


def graph(name: str) -> StateGraph:
    entry = ENTRIES[name]
    loaded, _ = load_graph(entry["name"], entry["module"], entry["config"], keep=gr.VARIABLES)
    return loaded


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_core_refines_every_edge_of_the_small_models(name: str) -> None:
    stats = gr.replay_graph(graph(name))
    assert stats.edges == len(graph(name).edges) > 0
    assert stats.refusals > 0


# -- in-memory mutants: each must be reported as a mismatch -----------------------------------


def skip_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    """fetched keeps only held offsets strictly above the batch end (``o > hi``)."""
    original = PartitionTracker.fetched

    def fetched(self: PartitionTracker, offsets: Sequence[int], end: int | None = None) -> Any:
        run = original(self, offsets, end)
        self._skip.discard(self.next)
        return run

    monkeypatch.setattr(PartitionTracker, "fetched", fetched)


def finish_from_any_live_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """apply_many finishes offsets whatever live state they are in."""
    original = PartitionTracker.apply_many

    def apply_many(self: PartitionTracker, event: Event, offsets: Sequence[int]) -> None:
        if event is Event.SUCCEED:
            for o in offsets:
                if o in self._live:
                    self._live[o] = MessageState.PROCESSING
        original(self, event, offsets)

    monkeypatch.setattr(PartitionTracker, "apply_many", apply_many)


def commit_hands_out_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """commit_requested hands out next instead of the watermark."""
    original = PartitionTracker.commit_requested

    def commit_requested(self: PartitionTracker) -> int | None:
        return None if original(self) is None else self.next

    monkeypatch.setattr(PartitionTracker, "commit_requested", commit_requested)


def stale_epoch_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The core takes an event of an earlier assignment as current."""

    def current(self: ConsumerCore, tp: Any, epoch: int) -> PartitionTracker | None:
        return self._parts.get(tp)

    monkeypatch.setattr(ConsumerCore, "_current", current)


MUTANTS: list[tuple[Callable[[pytest.MonkeyPatch], None], str, str]] = [
    (skip_boundary, "small_eos", "skip: core [] != model [2]"),
    (finish_from_any_live_state, "small_eos_retries", "succeeded_many([1]) on Pending"),
    (commit_hands_out_next, "small_eos_retries", "commit_requested hands out"),
    (stale_epoch_taken, "small_eos_reassign", "stale epoch"),
]


@pytest.mark.parametrize(
    ("mutant", "model", "detail"), MUTANTS, ids=lambda x: getattr(x, "__name__", "")
)
def test_replay_rejects_a_mutated_core(
    monkeypatch: pytest.MonkeyPatch,
    mutant: Callable[[pytest.MonkeyPatch], None],
    model: str,
    detail: str,
) -> None:
    loaded = graph(model)
    mutant(monkeypatch)
    with pytest.raises(gr.Mismatch) as caught:
        gr.replay_graph(loaded)
    assert detail in caught.value.detail, caught.value.detail
    assert caught.value.path[0][0] == "" and caught.value.explanation


# -- the pieces ------------------------------------------------------------------------------


def test_tlc_values_parse() -> None:
    value = parse_value(
        '( m1 :> [ p1 |-> [held |-> TRUE, st |-> (0 :> "None" @@ 1 :> "Pending"), '
        "skip |-> {2, 3}] ] @@ m2 :> [p1 |-> [held |-> FALSE, st |-> <<>>, skip |-> {}]] )"
    )
    assert value == {
        "m1": {"p1": {"held": True, "st": {0: "None", 1: "Pending"}, "skip": frozenset({2, 3})}},
        "m2": {"p1": {"held": False, "st": (), "skip": frozenset()}},
    }
    records = parse_value("{[a |-> 1], [a |-> 2]}")
    assert records == frozenset({Fun(a=1), Fun(a=2)})
    with pytest.raises(ValueError, match="expected"):
        parse_value("[a |-> 1")


def test_graph_config_only_explores() -> None:
    cfg = "\n".join([
        "\\* a comment", "CONSTANTS", "    MaxEpoch = 3", "SYMMETRY MemberSymmetry",
        "SPECIFICATION Spec", "INVARIANTS TypeOK", "    NoLoss", "PROPERTY AllFinished",
    ])
    assert graph_config(cfg).splitlines() == [
        "CONSTANTS", "    MaxEpoch = 3", "INIT Init", "NEXT Next",
    ]


def test_an_epoch_handed_out_twice_leaves_the_mapping_undefined() -> None:
    history = EpochHistory()
    history.record(1, "p1", 1)
    assert history.core("p1", 1) == 1 and history.spec(1) == ("p1", 1)
    with pytest.raises(MappingError, match="handed out again"):
        history.record(1, "p1", 2)


def test_unknown_model_is_a_one_line_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert gr.main(["--model", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("graph_replay: error: no small replay model named nope; choose from")
    assert "\n" not in err
