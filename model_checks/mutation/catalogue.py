"""Named semantic bugs: one-line changes that break exactly-once, as data.

Each :class:`Bug` replaces the one line of ``function`` (a qualified name in
``file``) whose stripped text is ``old`` by ``new`` (indentation kept). The
runner (:mod:`model_checks.mutation.catalogue_run`) applies each bug alone to a
scratch copy of the tree and runs every verification layer separately, so the
table says which layers see which bug. ``expected`` names the layers that ought
to catch it (layer names of :data:`~model_checks.mutation.config.LAYERS`); it is
documentation, compared with what happened in the report.
"""

from __future__ import annotations

from dataclasses import dataclass

PARTITION = "src/htmqc/core/partition.py"
CONSUMER = "src/htmqc/core/consumer.py"
RETRY = "src/htmqc/core/retry.py"
GATE = "src/htmqc/core/gate.py"
FAILURES = "src/htmqc/core/failures.py"
SQL = "src/htmqc/sinks/sql.py"

#: The layers that run the core against a model or an oracle.
MODEL_LAYERS = ("graph-replay", "vectors", "formal", "tests-core")
CONTRACT_LAYERS = ("crosshair", "formal", "tests-core")
#: Both (``formal`` and ``tests-core`` are in each).
ALL_LAYERS = tuple(dict.fromkeys((*CONTRACT_LAYERS, *MODEL_LAYERS)))


@dataclass(frozen=True, slots=True)
class Bug:
    """One named one-line bug (see module docs)."""

    name: str
    file: str
    function: str
    old: str
    new: str
    description: str
    expected: tuple[str, ...]


CATALOGUE: tuple[Bug, ...] = (
    Bug(
        "held-offset-boundary", PARTITION, "PartitionTracker.fetched",
        "self._skip = {o for o in skip if o >= hi}",
        "self._skip = {o for o in skip if o > hi}",
        "a held offset equal to the end of a fetched range is forgotten, so it runs "
        "(and its effect is stored) a second time",
        MODEL_LAYERS,
    ),
    Bug(
        "batch-finish-any-state", PARTITION, "PartitionTracker.apply_many",
        "if popped.count(source) != n:",
        "if None in popped:",
        "a batch finishes offsets from any live state (Pending, Failed), so a message "
        "that never ran counts as done and is never processed",
        MODEL_LAYERS,
    ),
    Bug(
        "commit-hands-out-next", PARTITION, "PartitionTracker.commit_requested",
        "return self._processed",
        "return self._next",
        "a commit hands out next instead of the watermark: unfinished offsets are "
        "committed and lost on restart",
        ALL_LAYERS,
    ),
    Bug(
        "ack-above-watermark", PARTITION, "PartitionTracker.commit_acked",
        "if offset > self._processed:",
        "if offset > self._next:",
        "an ack above the watermark is accepted: committed passes unfinished offsets, "
        "which are lost on restart",
        (*CONTRACT_LAYERS, "proofs"),
    ),
    Bug(
        "epoch-not-bumped", CONSUMER, "ConsumerCore.assign",
        "self._last_epoch += 1",
        "self._last_epoch += 0",
        "an assignment reuses the last epoch, so events of an earlier assignment are "
        "taken as current",
        (*CONTRACT_LAYERS, "vectors", "proofs"),
    ),
    Bug(
        "stale-epoch-accepted", CONSUMER, "ConsumerCore._current",
        "if self._epochs.get(tp) != epoch:",
        "if tp not in self._epochs:",
        "an event carrying a stale epoch (a zombie worker's completion, a late ack) is "
        "applied to the current assignment",
        MODEL_LAYERS,
    ),
    Bug(
        "finish-leaves-unsent", PARTITION, "PartitionTracker.apply",
        "self._unsent = True",
        "self._unsent = False",
        "an out-of-order finish does not mark the partition unsent: no commit carries "
        "it in finished_above, so it runs again after a restart",
        MODEL_LAYERS,
    ),
    Bug(
        "commit-failed-leaves-unsent", PARTITION, "PartitionTracker.commit_failed",
        "self._unsent = True",
        "self._unsent = False",
        "a failed commit is not asked for again when the watermark did not move: its "
        "finished_above is never stored",
        ALL_LAYERS,
    ),
    Bug(
        "restore-drops-held", CONSUMER, "ConsumerCore.restored",
        "return self.assign(tp, committed, finished_above)",
        "return self.assign(tp, committed, ())",
        "after a crash the offsets the sink already holds above committed are "
        "forgotten and run a second time",
        MODEL_LAYERS,
    ),
    Bug(
        "finished-above-drops-held", PARTITION, "PartitionTracker.finished_above",
        "return done + tuple(sorted(self._skip)) if self._skip else done",
        "return done",
        "a commit leaves out held offsets not fetched again yet; a sink that replaces "
        "its stored set forgets them and they run twice",
        MODEL_LAYERS,
    ),
    Bug(
        "advance-to-newest", PARTITION, "PartitionTracker._advance",
        "self._processed = order[0]",
        "self._processed = order[-1]",
        "the watermark jumps to the newest fetched offset instead of the oldest "
        "unfinished one: unfinished offsets fall below it and are lost",
        ALL_LAYERS,
    ),
    Bug(
        "retry-past-max", FAILURES, "facts",
        "spent=attempts > retry.max_retries,",
        "spent=attempts > retry.max_retries + 1,",
        "a failing message is retried once more than max_retries allows before it is "
        "dead-lettered (the decision moved from RetryPolicy.should_retry to failures.py)",
        ("graph-replay", "vectors", "formal", "tests-core"),
    ),
    Bug(
        "permanent-retried", FAILURES, "facts",
        "permanent=failure.kind is FailureKind.PERMANENT,",
        "permanent=False,",
        "a permanent failure is retried instead of going to the dead-letter queue at once",
        ("vectors", "formal", "tests-core"),
    ),
    Bug(
        "draining-allows-start", PARTITION, "<module>",
        "_FORBIDDEN_WHILE_DRAINING = frozenset({Event.START, Event.RETRY_DUE})",
        "_FORBIDDEN_WHILE_DRAINING = frozenset({Event.RETRY_DUE})",
        "a message may start on a partition being revoked; its effect can race the "
        "new owner's",
        MODEL_LAYERS,
    ),
    Bug(
        "revoke-skips-final-commit", CONSUMER, "ConsumerCore.revoked",
        "commit = self.commit_requested(tp)",
        "commit = None",
        "a revoked partition's finished work is not committed: the next owner runs it "
        "again",
        MODEL_LAYERS,
    ),
    Bug(
        "crash-keeps-epochs", CONSUMER, "ConsumerCore.crashed",
        "self._epochs.clear()",
        "pass",
        "a crash keeps the epochs of the dropped partitions, so a late event from "
        "before the crash is not recognised as late",
        MODEL_LAYERS,
    ),
    Bug(
        "ack-moves-committed-back", PARTITION, "PartitionTracker.commit_acked",
        "if offset <= self._committed:",
        "if offset == self._committed:",
        "a late ack below committed moves committed backwards, so a restart repeats "
        "work already stored",
        ALL_LAYERS,
    ),
    Bug(
        "commit-failed-keeps-requested", PARTITION, "PartitionTracker.commit_failed",
        "self._requested = self._committed",
        "self._requested = max(self._committed, self._requested)",
        "after a failed commit requested is not reset, so the same offset is not "
        "requested again and the commit is never retried",
        ALL_LAYERS,
    ),
    Bug(
        "backoff-uncapped", RETRY, "RetryPolicy.delay",
        "return min(self.max_delay, max(0.0, jitter * ceiling))",
        "return max(0.0, jitter * self.base_delay * 2.0**exponent)",
        "the retry backoff grows past max_delay, so a message can wait for ever",
        ("crosshair", "proofs", "tests-core"),
    ),
    Bug(
        "gap-unfinished", PARTITION, "PartitionTracker.fetched",
        "self._live.update(dict.fromkeys(offsets, INITIAL))",
        "self._live.update(dict.fromkeys(range(lo, hi), INITIAL))",
        "an offset gap (compaction, transaction marker) counts as unfinished, so the "
        "watermark never passes it",
        ALL_LAYERS,
    ),
    Bug(
        "fence-not-bumped", SQL, "SqlSink.take_fence",
        "f'UPDATE \"{t}\" SET fence = fence + 1, updated_at = {self.now_sql} '",
        "f'UPDATE \"{t}\" SET fence = fence, updated_at = {self.now_sql} '",
        "a claim does not bump the partition's fence, so a zombie's commit with the "
        "old token is still accepted",
        ("formal", "tests-sinks"),
    ),
    Bug(
        "zombie-commit-accepted", SQL, "SqlTransaction.commit",
        "if row is None or int(row[0]) != fence:",
        "if row is None or int(row[0]) < fence:",
        "a commit carrying an older fence than the stored one (a zombie's) is accepted",
        ("formal", "tests-sinks"),
    ),
    Bug(
        "gate-never-reclaims", GATE, "Gate.tick",
        "if now - part.since >= self.fence_grace:",
        "if False:",
        "a partition fenced while the group still assigns it is never claimed again: "
        "it stays paused for ever (the stall fixed by 3bdd90a)",
        (*CONTRACT_LAYERS, "graph-replay"),
    ),
    Bug(
        "gate-pause-kept", GATE, "Gate._move",
        "part.paused = None",
        "part.paused = False",
        "after an assignment the gate takes the partition for resumed, but librdkafka "
        "kept its pause: the partition is never fetched (44915de)",
        (*CONTRACT_LAYERS, "graph-replay"),
    ),
    Bug(
        "gate-waiting-not-paused", GATE, "<module>",
        "ALWAYS_PAUSED: Final[frozenset[GateState]] = frozenset({G.WAITING, G.FENCED})",
        "ALWAYS_PAUSED: Final[frozenset[GateState]] = frozenset({G.FENCED})",
        "a partition waiting for its retry-topic record keeps fetching: records run "
        "before they are due",
        ("proofs", "graph-replay", "formal", "tests-core"),
    ),
    Bug(
        "failures-record-waits-in-memory", FAILURES, "facts",
        "and (failure.from_retry_topic or delay >= retry_topic.min_delay),",
        "and delay >= retry_topic.min_delay,",
        "a retry-topic record with a short backoff is retried in memory and blocks "
        "its partition instead of going back to the topic",
        (*CONTRACT_LAYERS, "graph-replay"),
    ),
    Bug(
        "failures-fatal-not-poison", FAILURES, "facts",
        "poison=failure.poison or failure.fatal,",
        "poison=failure.poison,",
        "a failure that kills its worker is retried instead of dead-lettered as "
        "poison: the message crash-loops its workers",
        ("formal", "tests-core"),
    ),
)
