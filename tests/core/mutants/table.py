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

BY_NAME = {m.name: m for m in MUTANTS}
