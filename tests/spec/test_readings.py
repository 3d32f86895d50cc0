"""Alternative readings of the spec: each one is rejected by a conformance vector.

A *reading* is what a porter might do where ``spec/README.md`` could be read
two ways: forget restored offsets in ``finished_above``, reset the epoch
counter on a crash, treat only older epochs as stale, ... Each is written here
as a small change to a copy of ``htmqc.core`` (the change a Python porter would
make), and the named vector, replayed through the changed copy by
``spec/conformance/replay.py``, must report a difference. The unchanged copy
passes every vector (the control), so the differences come from the reading.

The copies are loaded in this process under the name ``htmqc`` (the real
modules are put back afterwards), with contracts off, as a port has none.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from spec.conformance import replay

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "htmqc"
REPLAY = ROOT / "spec" / "conformance" / "replay.py"


@dataclass(frozen=True)
class Reading:
    """An alternative reading, the change that makes the core read it so, and the
    vector that must reject it."""

    says: str
    vector: str
    changes: tuple[tuple[str, str, str], ...] = ()  # (file under core/, old text, new text)
    int_as_double: bool = False  # read the vector's JSON integers as doubles do (rounded)


def _r(says: str, vector: str, *changes: tuple[str, str, str]) -> Reading:
    return Reading(says, vector, changes)


P, C, R, F, K = "partition.py", "consumer.py", "retry.py", "failures.py", "breaker.py"

READINGS: tuple[Reading, ...] = (
    # 1. what finished_above holds
    _r("a restored offset must be above committed (one equal to it is refused)",
       "restored_offset_at_committed",
       (P, "if any(o < start for o in skip):", "if any(o <= start for o in skip):")),
    _r("finished_above lists only fetched offsets (restored ones not yet fetched are left out)",
       "finished_above_contents",
       (P, "return done + tuple(sorted(self._skip)) if self._skip else done", "return done")),
    _r("finished_above lists restored offsets only when strictly above processed",
       "finished_above_contents",
       (P, "done + tuple(sorted(self._skip))",
        "done + tuple(sorted(o for o in self._skip if o > self._processed))")),
    _r("a restored offset that arrives is dropped from finished_above",
       "finished_above_contents",
       (P, "self._order.extend(offsets)",
        "self._order.extend(o for o in offsets if o not in self._skip)")),
    # 2. restored offsets in a gap
    _r("a restored offset stays listed until it arrives, even if a fetch covered it as a gap",
       "restored_offset_in_gap",
       (P, "self._skip = {o for o in skip if o >= hi}", "self._skip = skip - set(offsets)")),
    _r("a restored offset is held only while strictly above the batch end (o > end)",
       "restored_offset_held_at_batch_end",
       (P, "{o for o in skip if o >= hi}", "{o for o in skip if o > hi}")),
    _r("restored offsets are handed out to run again (finished_above only informs the sink)",
       "restored_offsets_never_run",
       (P, "offsets = [o for o in offsets if o not in skip]", "offsets = list(offsets)")),
    # 3. the unsent flag
    _r("a gap raises unsent (gaps count as finished)",
       "unsent_flag",
       (P, "        self._order.extend(offsets)\n",
        "        if hi - lo > len(offsets):\n            self._unsent = True\n"
        "        self._order.extend(offsets)\n")),
    _r("a restored offset arriving raises unsent",
       "unsent_flag",
       (P, "            offsets = [o for o in offsets if o not in skip]\n",
        "            self._unsent = self._unsent or any(o in skip for o in offsets)\n"
        "            offsets = [o for o in offsets if o not in skip]\n")),
    _r("a failure raises unsent",
       "unsent_flag",
       (P, "                self._failures[offset] = self._failures.get(offset, 0) + 1\n",
        "                self._failures[offset] = self._failures.get(offset, 0) + 1\n"
        "                self._unsent = True\n")),
    _r("commit_failed only lowers requested (no flag)",
       "failed_commits",
       (P, "        self._requested = self._committed\n        self._unsent = True\n",
        "        self._requested = self._committed\n")),
    _r("an ack lowers unsent",
       "unsent_flag",
       (P, "        self._committed = offset\n",
        "        self._committed = offset\n        self._unsent = False\n")),
    _r("an empty finishing batch raises unsent (the batch forms do not special-case it)",
       "empty_batches",
       (P, "            if n:  # an empty batch finished nothing: no commit is due\n"
           "                self._unsent = True\n",
        "            self._unsent = True\n")),
    _r("a commit is due only when the watermark moved",
       "out_of_order_completion",
       (P, "if self._processed > self._requested or self._unsent:",
        "if self._processed > self._requested:")),
    # 4. epochs
    _r("crashed() resets the epoch counter",
       "epoch_counter_survives_crash",
       (C, "        self._epochs.clear()\n",
        "        self._epochs.clear()\n        self._last_epoch = 0\n")),
    _r("epochs count per partition",
       "two_partitions",
       (C, "        self._last_epoch += 1\n",
        "        self._last_epoch = self.__dict__.setdefault('_per_tp', {}).get(tp, 0) + 1\n"
        "        self.__dict__['_per_tp'][tp] = self._last_epoch\n")),
    _r("a commit carries the newest epoch of the core, not the partition's",
       "two_partitions",
       (C, "epoch=self._epochs[tp], offset=offset", "epoch=self._last_epoch, offset=offset")),
    # 5. stale events
    _r("stale means older: a newer epoch acts on the current assignment",
       "stale_is_any_other_epoch",
       (C, "        if self._epochs.get(tp) != epoch:\n            return None\n",
        "        current = self._epochs.get(tp)\n"
        "        if current is None or epoch < current:\n            return None\n")),
    _r("the payload is checked before the epoch",
       "stale_is_any_other_epoch",
       (C, "        tracker = self._current(tp, epoch)\n        if tracker is None:\n"
           "            return _NOTHING\n",
        "        if any(a >= b for a, b in zip(offsets, list(offsets)[1:])):\n"
        "            raise OffsetOrderError('order')\n"
        "        tracker = self._current(tp, epoch)\n        if tracker is None:\n"
        "            return _NOTHING\n")),
    _r("an event for a partition that is not held raises NotAssigned",
       "partitions_not_held",
       (C, "        if self._epochs.get(tp) != epoch:\n",
        "        if tp not in self._parts:\n            raise NotAssigned('not held')\n"
        "        if self._epochs.get(tp) != epoch:\n")),
    _r("commit_requested of a partition that is not held raises NotAssigned",
       "partitions_not_held",
       (C, "        tracker = self._parts.get(tp)\n        if tracker is None:\n"
           "            return None\n        offset",
        "        tracker = self.tracker(tp)\n        offset")),
    _r("revoking a partition that is not held raises NotAssigned",
       "partitions_not_held",
       (C, "        tracker = self._parts.get(tp)\n        if tracker is not None:\n"
           "            tracker.begin_drain()",
        "        self.tracker(tp).begin_drain()")),
    # 6. failures while revoking
    _r("failed while revoking dead-letters instead of retrying",
       "failed_while_revoking",
       (C, "        if isinstance(decision, RetryAt):\n",
        "        if isinstance(decision, RetryAt) and tracker.draining:\n"
        "            from htmqc.core.decisions import DeadLetterKind\n"
        "            decision = DeadLetter(tp=tp, epoch=epoch, offset=offset,\n"
        "                                  attempts=decision.attempt, kind=DeadLetterKind.FAILED)\n"
        "        if isinstance(decision, RetryAt):\n")),
    _r("failed while revoking is illegal",
       "failed_while_revoking",
       (P, "frozenset({Event.START, Event.RETRY_DUE})",
        "frozenset({Event.START, Event.RETRY_DUE, Event.FAIL})")),
    _r("retry_due is allowed while revoking (only started is refused)",
       "failed_while_revoking",
       (P, "frozenset({Event.START, Event.RETRY_DUE})", "frozenset({Event.START})")),
    _r("revoking stops commit requests",
       "revoked_final_commit",
       (C, "        tracker = self._parts.get(tp)\n        if tracker is None:\n"
           "            return None\n        offset",
        "        tracker = self._parts.get(tp)\n        if tracker is None or tracker.draining:\n"
        "            return None\n        offset")),
    _r("revoked makes no final commit",
       "revoked_final_commit",
       (C, "commit = self.commit_requested(tp)\n        self._parts.pop",
        "commit = None\n        self._parts.pop")),
    # retries and backoff
    _r("max_retries counts failures, not retries after the first",
       "retries_max_1",
       (F, "spent=attempts > retry.max_retries,", "spent=attempts >= retry.max_retries,")),
    _r("an unknown failure is dead-lettered at once (only retryable retries)",
       "retries_max_1",
       (F, "permanent=failure.kind is FailureKind.PERMANENT,",
        "permanent=failure.kind is not FailureKind.RETRYABLE,")),
    _r("DeadLetter.kind is permanent whenever the message is dead-lettered",
       "failures_retries_dead_letter",
       (F, "attempts=attempts, kind=result)", "attempts=attempts, kind=DeadLetterKind.PERMANENT)")),
    _r("a DeadLetter decision finishes the offset at once (no dead_lettered event needed)",
       "failures_retries_dead_letter",
       (C, "        if isinstance(decision, RetryAt):\n",
        "        if isinstance(decision, DeadLetter):\n"
        "            tracker.apply(Event.DEAD_LETTER, offset)\n"
        "        if isinstance(decision, RetryAt):\n")),
    _r("RetryAt.attempt counts the retries before this one",
       "failures_retries_dead_letter",
       (F, "attempt=attempts, at=now + wait)", "attempt=attempts - 1, at=now + wait)")),
    _r("the failure count restarts at every retry",
       "failures_retries_dead_letter",
       (P, "self._failures[offset] = self._failures.get(offset, 0) + 1",
        "self._failures[offset] = 1")),
    _r("the failure count survives revoke/assign and crash/restore",
       "failure_count_per_assignment",
       (C, "        tracker.apply(Event.FAIL, offset)\n        decision = decide(",
        "        tracker.apply(Event.FAIL, offset)\n"
        "        fails = self.__dict__.setdefault('_fails', {})\n"
        "        fails[tp, offset] = fails.get((tp, offset), 0) + 1\n"
        "        decision = decide("),
       (C, "attempts=tracker.failures(offset) + failure.prior_attempts,",
        "attempts=fails[tp, offset] + failure.prior_attempts,")),
    _r("the n-th retry waits base x 2^n",
       "backoff_and_jitter",
       (R, "exponent = min(attempt - 1, _MAX_EXPONENT)", "exponent = min(attempt, _MAX_EXPONENT)")),
    _r("jitter is not applied: the full backoff",
       "backoff_and_jitter",
       (R, "return min(self.max_delay, max(0.0, jitter * ceiling))", "return ceiling")),
    _r("'equal jitter': half the backoff fixed, half random",
       "backoff_and_jitter",
       (R, "return min(self.max_delay, max(0.0, jitter * ceiling))",
        "return ceiling / 2 + jitter * ceiling / 2")),
    _r("the cap applies after the jitter",
       "backoff_and_jitter",
       (R, "ceiling = min(self.max_delay, self.base_delay * 2.0**exponent)",
        "ceiling = self.base_delay * 2.0**exponent")),
    _r("RetryAt.at is the delay, not a time",
       "backoff_and_jitter",
       (F, "at=now + wait)", "at=wait)")),
    # batches and order
    _r("a finishing batch may complete any live offset (Pending, Failed, ...)",
       "batch_completion_needs_source_state",
       (P, "if popped.count(source) != n:", "if popped.count(None):")),
    _r("fetched([]) without end is refused while revoking (draining checked first)",
       "error_precedence",
       (P, "        if not offsets and end is None:\n"
           "            return offsets  # nothing arrived and no range was covered: no event\n"
           "        if self._draining:\n"
           "            raise IllegalTransition(\"fetched: the partition is being revoked\")\n",
        "        if self._draining:\n"
        "            raise IllegalTransition(\"fetched: the partition is being revoked\")\n"
        "        if not offsets and end is None:\n"
        "            return offsets\n")),
    _r("fetched checks the order before revoking",
       "error_precedence",
       (P, "        if self._draining:\n"
           "            raise IllegalTransition(\"fetched: the partition is being revoked\")\n"
           "        lo = self._next\n",
        "        lo = self._next\n"),
       (P, "        # Offsets the sink already holds arrive finished",
        "        if self._draining:\n            raise IllegalTransition('revoking')\n"
        "        # Offsets the sink already holds arrive finished")),
    _r("fetched([], end) needs end above next",
       "empty_batches",
       (P, "if hi < lo:", "if hi <= lo:")),
    _r("assign checks its offsets before whether the partition is held",
       "error_precedence",
       (C, "        if tp in self._parts:\n"
           "            raise IllegalTransition(f\"assign: {_name(tp)} is already assigned\")\n",
        ""),
       (C, "        tracker = PartitionTracker(committed, finished_above)\n",
        "        tracker = PartitionTracker(committed, finished_above)\n"
        "        if tp in self._parts:\n            raise IllegalTransition('held')\n")),
    # commits
    _r("an ack above requested is illegal (only requested offsets can be acked)",
       "commit_acks_and_failures",
       (P, "if offset > self._processed:", "if offset > self._requested:")),
    _r("an ack moves committed but not requested",
       "commit_acks_and_failures",
       (P, "        if self._requested < offset:\n            self._requested = offset\n", "")),
    _r("a failed commit of an offset already durable is ignored",
       "failed_commits",
       (P, "        self._requested = self._committed\n        self._unsent = True\n",
        "        if offset > self._committed:\n"
        "            self._requested = self._committed\n            self._unsent = True\n")),
    # numbers
    Reading("offsets are JSON numbers read as doubles", "big_offsets", int_as_double=True),
    # the failure decision (§4b), replayed through decide alone
    _r("the breaker hold comes before too_large",
       "failures_too_large_first",
       (F, '    ("too_large", DeadLetterKind.TOO_LARGE),\n    ("held", Later.HOLD),\n',
        '    ("held", Later.HOLD),\n    ("too_large", DeadLetterKind.TOO_LARGE),\n')),
    _r("held_for 0 means the breaker does not hold",
       "failures_breaker_hold",
       (F, "held = held_for is not None", "held = bool(held_for)")),
    _r("a held failure waits its backoff, not the hold",
       "failures_breaker_hold",
       (F, "wait = held_for if result is Later.HOLD and held_for is not None else delay",
        "wait = delay")),
    _r("permanent comes before poison",
       "failures_poison_and_fatal",
       (F, '    ("poison", DeadLetterKind.POISON),\n    ("permanent", DeadLetterKind.PERMANENT),\n',
        '    ("permanent", DeadLetterKind.PERMANENT),\n    ("poison", DeadLetterKind.POISON),\n')),
    _r("a failure that killed its worker (fatal) is not poison",
       "failures_poison_and_fatal",
       (F, "poison=failure.poison or failure.fatal,", "poison=failure.poison,")),
    _r("the budget counts this assignment's failures only",
       "failures_budget",
       (F, "spent=attempts > retry.max_retries,",
        "spent=attempts - failure.prior_attempts > retry.max_retries,")),
    _r("the retry topic comes before the budget (a spent record is handed off again)",
       "failures_budget",
       (F, '    ("spent", DeadLetterKind.FAILED),\n    ("to_topic", Later.HAND_OFF),\n',
        '    ("to_topic", Later.HAND_OFF),\n    ("spent", DeadLetterKind.FAILED),\n')),
    _r("a backoff equal to min_delay stays in memory (hand off only when longer)",
       "failures_retry_topic",
       (F, "delay >= retry_topic.min_delay", "delay > retry_topic.min_delay")),
    _r("a retry-topic record goes back to the topic only when its backoff is long enough",
       "failures_retry_topic",
       (F, "(failure.from_retry_topic or delay >= retry_topic.min_delay)",
        "(delay >= retry_topic.min_delay)")),
    _r("a hand-off is due after the backoff of this assignment's failure count",
       "failures_retry_topic",
       (F, "due=now + delay,",
        "due=now + retry.delay(attempts - failure.prior_attempts, jitter),")),
    _r("HandOff.attempt counts this assignment's failures only",
       "failures_retry_topic",
       (F, "attempt=attempts,\n            due=",
        "attempt=attempts - failure.prior_attempts,\n            due=")),
    _r("2^(n-1) is not bounded (it overflows to infinity past 2^1023)",
       "failures_backoff_bits",
       (R, "exponent = min(attempt - 1, _MAX_EXPONENT)", "exponent = attempt - 1"),
       (R, "self.base_delay * 2.0**exponent",
        "self.base_delay * (2.0**exponent if exponent < 1024 else float('inf'))")),
    # the circuit breaker (§4c)
    _r("the streak counts offsets, whatever their partition",
       "breaker_streak_trip",
       (K, "message = (tp, offset)", "message = offset")),
    _r("a message failing again counts again in the streak",
       "breaker_streak_trip",
       (K, "message = (tp, offset)", "message = (tp, offset, now)")),
    _r("an empty batch of successes breaks the streak",
       "breaker_streak_trip",
       (K, "            if offsets:\n                self._streak.clear()\n",
        "            self._streak.clear()\n            if offsets:\n")),
    _r("the rate is failures / calls >= failure_rate",
       "breaker_rate_exact",
       (K, "failures >= p.failure_rate * calls", "failures / calls >= p.failure_rate")),
    _r("min_calls counts failures, not calls",
       "breaker_rate_exact",
       (K, "if calls >= p.min_calls and", "if failures >= p.min_calls and")),
    _r("the bucket is floor(now x 10 / window)",
       "breaker_window_buckets",
       (K, "math.floor(now / (self.policy.window / BUCKETS))",
        "math.floor(now * BUCKETS / self.policy.window)")),
    _r("the window is the current bucket and the 10 before it",
       "breaker_window_buckets",
       (K, "oldest = self._bucket(now) - BUCKETS + 1", "oldest = self._bucket(now) - BUCKETS")),
    _r("the window keeps its counts across a trip",
       "breaker_rate_trip",
       (K, "        self._buckets.clear()\n", "")),
    _r("a failed probe's backoff is not capped by max_backoff",
       "breaker_probe_backoff",
       (K, "min(self.policy.max_backoff, self._backoff * self.policy.backoff_factor)",
        "self._backoff * self.policy.backoff_factor")),
    _r("a successful probe keeps the backoff",
       "breaker_probe_backoff",
       (K, "            self._backoff = self.policy.first_backoff\n            return self._step(",
        "            return self._step(")),
    _r("a failed probe keeps the error class of the trip",
       "breaker_probe_backoff",
       (K, "            self.error_class = error_class\n            self._open_until",
        "            self._open_until")),
    _r("Open cools down only after open_until (strictly)",
       "breaker_half_open_probe",
       (K, "and now >= self._open_until:", "and now > self._open_until:")),
    _r("any success while Probing closes the breaker",
       "breaker_half_open_probe",
       (K, "probe is not None and probe[0] == tp and probe[1] in offsets:",
        "probe is not None:")),
    _r("held_for is null once the breaker is HalfOpen",
       "breaker_half_open_probe",
       (K, "            return 0.0\n", "            return None\n")),
    _r("Open ends when now - (the time it opened) >= backoff",
       "breaker_open_time_bits",
       (K, "        self._open_until = now + self._backoff\n        return self._step(BE.TRIPPED)",
        "        self._open_until = now + self._backoff\n        self._since = now\n"
        "        return self._step(BE.TRIPPED)"),
       (K, "            self._open_until = now + self._backoff\n            return self._step(",
        "            self._open_until = now + self._backoff\n            self._since = now\n"
        "            return self._step("),
       (K, "self._open_until is not None and now >= self._open_until:",
        "self._open_until is not None and now - self._since >= self._backoff:")),
    _r("a probe is lost at since + probe_timeout (now >= since + probe_timeout)",
       "breaker_probe_lost",
       (K, "now - self._probe_since >= self.policy.probe_timeout:",
        "now >= self._probe_since + self.policy.probe_timeout:")),
    _r("probe_started when not HalfOpen is ignored, not refused",
       "breaker_refused_and_ignored",
       (K, "            raise IllegalTransition(f\"breaker: can't start a probe when",
        "            return None\n            raise IllegalTransition(f\"")),
)


def _copy_core(into: Path, changes: tuple[tuple[str, str, str], ...]) -> None:
    """``htmqc/__init__.py`` and ``htmqc/core/`` under ``into``, with ``changes`` made."""
    package = into / "htmqc"
    shutil.copytree(SRC / "core", package / "core", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(SRC / "__init__.py", package / "__init__.py")
    for name, old, new in changes:
        path = package / "core" / name
        text = path.read_text()
        if text.count(old) != 1:
            raise AssertionError(f"{name} no longer holds {old!r} exactly once: update the reading")
        path.write_text(text.replace(old, new))


#: Modules of ``spec.conformance`` that the replay imports and that import ``htmqc``.
KIND_MODULES = ("replay", "gate", "failures", "breaker")


def _bound_to_core(name: str) -> bool:
    """Whether module ``name`` must be loaded afresh for a copy of the core."""
    return (name == "htmqc" or name.startswith("htmqc.")
            or name in {f"spec.conformance.{m}" for m in KIND_MODULES})


@contextmanager
def replay_of_copy(root: Path) -> Iterator[ModuleType]:
    """``replay`` bound to the core copied under ``root`` (contracts off); the real
    ``htmqc`` modules are back in place afterwards."""
    saved = {k: v for k, v in sys.modules.items() if _bound_to_core(k)}
    # the vector kinds' modules (imported by the replay) are loaded afresh with the copy too
    package = sys.modules["spec.conformance"]
    kinds = {n: getattr(package, n) for n in KIND_MODULES if hasattr(package, n)}
    contracts = os.environ.get("HTMQC_CONTRACTS")
    for name in saved:
        del sys.modules[name]
    for name in kinds:
        delattr(package, name)
    sys.path.insert(0, str(root))
    os.environ["HTMQC_CONTRACTS"] = "0"
    try:
        spec = importlib.util.spec_from_file_location("_replay_of_copy", REPLAY)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert Path(sys.modules["htmqc"].__file__ or "").is_relative_to(root)
        yield module
    finally:
        sys.path.remove(str(root))
        for name in [k for k in sys.modules if _bound_to_core(k)]:
            del sys.modules[name]
        sys.modules.update(saved)
        for name in KIND_MODULES:
            if hasattr(package, name):
                delattr(package, name)
        for name, module in kinds.items():
            setattr(package, name, module)
        if contracts is None:
            os.environ.pop("HTMQC_CONTRACTS", None)
        else:
            os.environ["HTMQC_CONTRACTS"] = contracts


def _load(path: Path, int_as_double: bool) -> dict[str, object]:
    if not int_as_double:
        return replay.load(path)
    # What a JavaScript port's JSON.parse does: every number becomes the nearest double.
    data: dict[str, object] = json.loads(path.read_text(), parse_int=lambda s: int(float(s)))
    return data


def rejecting_vectors(reading: Reading, tmp: Path) -> list[str]:
    """Every vector that reports a difference when replayed through ``reading``."""
    _copy_core(tmp, reading.changes)
    with replay_of_copy(tmp) as copy:
        return [
            path.stem
            for path in replay.vector_files()
            if next(copy.mismatches(_load(path, reading.int_as_double)), None) is not None
        ]


def test_the_unchanged_copy_passes_every_vector(tmp_path: Path) -> None:
    assert rejecting_vectors(Reading("the spec itself", ""), tmp_path) == []


def test_the_real_modules_are_back_after_a_copy(tmp_path: Path) -> None:
    import htmqc.core

    home = htmqc.core.__file__  # src/, or a mutated copy under `make mutate`
    rejecting_vectors(READINGS[0], tmp_path)
    assert sys.modules["htmqc.core"] is htmqc.core
    assert htmqc.core.__file__ == home and not Path(home or "").is_relative_to(tmp_path)


@pytest.mark.parametrize("reading", READINGS, ids=[r.says for r in READINGS])
def test_a_vector_rejects_the_reading(reading: Reading, tmp_path: Path) -> None:
    _copy_core(tmp_path, reading.changes)
    path = replay.VECTORS / f"{reading.vector}.json"
    with replay_of_copy(tmp_path) as copy:
        first = next(copy.mismatches(_load(path, reading.int_as_double)), None)
    assert first is not None
    assert "raised unexpected" not in first  # a faithful reading, not a broken copy
