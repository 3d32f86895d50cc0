"""One-line bugs in the real core, each a text substitution in one file.

The verification layers are shown able to fail by applying one of these to a
*copy* of ``src/`` and watching the layer reject it: the CrossHair gate
(``tests/core/test_crosshair_gate.py``) and the Hypothesis model comparison
(``python -m tests.core.mutants.measure``). The first seven are the audit's
(issue 15); the consumer ones break the epoch fence and the held-offset
hand-over of an exactly-once restore; the last two put back bugs the stateful
test found (kept so that it goes on finding them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mutant:
    """Replace ``old`` (which must occur exactly once) by ``new`` in ``core/<module>``."""

    name: str
    module: str
    old: str
    new: str
    what: str

    def apply(self, src: Path) -> tuple[Path, int]:
        """Apply the bug to the copy of ``src/`` at ``src``; return the file changed
        and the line where the bug starts."""
        path = src / "htmqc" / "core" / self.module
        text = path.read_text()
        if text.count(self.old) != 1:
            raise ValueError(
                f"mutant {self.name}: {self.old!r} occurs {text.count(self.old)} times "
                f"in {path}, not once; update tests/core/mutants/table.py"
            )
        path.write_text(text.replace(self.old, self.new))
        return path, text[: text.index(self.old)].count("\n") + 1


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "fetched_boundary",
        "partition.py",
        "self._skip = {o for o in skip if o >= hi}",
        "self._skip = {o for o in skip if o > hi}",
        "a held offset at the end of a fetched range is forgotten and runs again",
    ),
    Mutant(
        "apply_many_any_source",
        "partition.py",
        "if popped.count(source) != n:",
        "if popped.count(None):",
        "a finishing batch completes offsets from any live state",
    ),
    Mutant(
        "apply_no_unsent",
        "partition.py",
        "self._failures.pop(offset, None)\n            self._unsent = True\n",
        "self._failures.pop(offset, None)\n",
        "finishing one offset out of order does not make a commit due",
    ),
    Mutant(
        "finished_above_no_held",
        "partition.py",
        "return done + tuple(sorted(self._skip)) if self._skip else done",
        "return done",
        "commits forget the held offsets not fetched again yet",
    ),
    Mutant(
        "commit_acked_above_watermark",
        "partition.py",
        "if offset > self._processed:",
        "if False:",
        "an ack above the watermark is accepted",
    ),
    Mutant(
        "commit_failed_no_unsent",
        "partition.py",
        "self._requested = self._committed\n        self._unsent = True\n",
        "self._requested = self._committed\n",
        "a failed commit is not requested again when the watermark has not moved",
    ),
    Mutant(
        "commit_requested_next",
        "partition.py",
        "self._unsent = False\n            return self._processed\n",
        "self._unsent = False\n            return self._next\n",
        "a commit request hands out next instead of the watermark",
    ),
    Mutant(
        "consumer_ignores_epoch",
        "consumer.py",
        "if self._epochs.get(tp) != epoch:",
        "if tp not in self._epochs:",
        "events from an earlier assignment (a zombie's) are applied",
    ),
    Mutant(
        "consumer_commit_without_held",
        "consumer.py",
        "finished_above=tracker.finished_above()",
        "finished_above=()",
        "a commit carries the watermark but not the offsets finished above it",
    ),
    Mutant(
        "consumer_assign_drops_held",
        "consumer.py",
        "tracker = PartitionTracker(committed, finished_above)",
        "tracker = PartitionTracker(committed)",
        "a restore runs again the offsets the sink already holds",
    ),
    Mutant(
        "restore_refuses_held_start",
        "partition.py",
        "if any(o < start for o in skip):",
        "if any(o <= start for o in skip):",
        "a stored commit whose watermark the sink holds cannot be restored (a crash loop)",
    ),
    Mutant(
        "empty_batch_makes_commit_due",
        "partition.py",
        "if n:  # an empty batch finished nothing: no commit is due\n"
        "                self._unsent = True",
        "self._unsent = True",
        "an empty finishing batch makes a commit due",
    ),
)

#: Bugs in the decisions moved out of the runtime (issue 16): the partition gate,
#: each caught by ``GateVersusReference`` (tests/core/test_gate.py), and the failure
#: rules, each caught by ``FailuresVersusReference`` (tests/core/test_failures.py);
#: tests/core/test_decision_mutants.py runs them on a copy of ``src/``.
GATE_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "gate_never_reclaims",
        "gate.py",
        "if now - part.since >= self.fence_grace:",
        "if False:",
        "a fenced partition that stays assigned is never claimed again (the stall of 3bdd90a)",
    ),
    Mutant(
        "gate_pause_kept",
        "gate.py",
        "part.paused = None",
        "part.paused = False",
        "after an assignment the gate takes the partition for resumed, but librdkafka kept "
        "its pause (44915de)",
    ),
    Mutant(
        "gate_waiting_not_paused",
        "gate.py",
        "frozenset({G.WAITING, G.FENCED})",
        "frozenset({G.FENCED})",
        "a partition waiting for its retry-topic record keeps fetching",
    ),
    Mutant(
        "gate_fence_keeps_core",
        "gate.py",
        "if source in HELD and target not in HELD:",
        "if source in HELD and target is G.UNASSIGNED:",
        "a fenced or rolled-back partition keeps the core's stale state (no Drop)",
    ),
    Mutant(
        "gate_reclaim_no_seek",
        "gate.py",
        ", (G.RECLAIMING, V.CLAIMED)}",
        "}",
        "a partition claimed again is not rewound to its claimed position",
    ),
)
FAILURE_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "failures_held_beats_too_large",
        "failures.py",
        '("too_large", DeadLetterKind.TOO_LARGE),\n    ("held", Later.HOLD),',
        '("held", Later.HOLD),\n    ("too_large", DeadLetterKind.TOO_LARGE),',
        "a message over the size limit is held for ever while the breaker is open",
    ),
    Mutant(
        "failures_fatal_not_poison",
        "failures.py",
        "poison=failure.poison or failure.fatal,",
        "poison=failure.poison,",
        "a failure that kills its worker is retried instead of dead-lettered as poison",
    ),
    Mutant(
        "failures_spent_one_early",
        "failures.py",
        "spent=attempts > retry.max_retries,",
        "spent=attempts >= retry.max_retries,",
        "a message is dead-lettered one retry early",
    ),
    Mutant(
        "failures_record_waits_in_memory",
        "failures.py",
        "and (failure.from_retry_topic or delay >= retry_topic.min_delay),",
        "and delay >= retry_topic.min_delay,",
        "a retry-topic record with a short backoff is retried in memory, off the topic",
    ),
)

BY_NAME = {m.name: m for m in (*MUTANTS, *GATE_MUTANTS, *FAILURE_MUTANTS)}
