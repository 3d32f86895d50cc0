"""The Z3 model against the code, on every state of a small exhaustive domain.

The proofs of :mod:`proofs.tracker` and :mod:`proofs.epochs` are about the
definitions of :mod:`proofs.model`. This check runs the *same* definitions, read
as Python values (:class:`proofs.logic.Concrete`), beside the real
:class:`htmqc.core.ConsumerCore` and compares them, so what was proved is what
was compared with the code.

Search. Breadth first from a fresh consumer, over pairs (code state, model
state). From every pair it makes every event of :func:`events` on both sides
and compares

* the answer: the same value, or both refuse (the code raises a
  :class:`~htmqc.core.errors.CoreError` exactly when the model's ``pre`` is
  false, and then its state must not have changed at all);
* the observable state afterwards: per partition the epoch, the four
  watermarks, ``draining``, the live offsets and their states, failure counts
  and ``finished_above`` (hidden state such as ``unsent`` shows in a later
  answer, since every event is tried from every state).

The domain (:class:`Domain`): one partition; offsets ``0..top``; every start
and every held set at the first assignment, one more assignment after a
revoke or crash; fetches of every subset of the offsets from ``next - 1`` up with
every end (and out-of-order and duplicate lists, which must be refused); every
lifecycle event on every offset, single and in every batch of up to ``batch``
offsets (and a duplicate batch); ``failed`` of every kind; acks at every offset
from -1 to above the watermark; commit requests, failures, revoking, revoked,
crashed; every event again with a stale epoch. Failure counts stop at
``max_retries + 1`` (the consumer's retry policy ends there; a direct
:class:`PartitionTracker` caller could go on failing one offset for ever).

Two rules belong to the harness, not the model: a list that is not strictly
increasing (fetch) or holds an offset twice (batch) does not denote a set, and
the code must refuse it; ``fetched([], None)`` covers no range and is not an
event (the code must answer ``()`` and change nothing).

``python -m proofs`` runs it after the proofs (:data:`proofs.run.DIFFERENTIAL`);
or call :func:`check`. The first disagreement is reported on one line with the
state, the event and both answers.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from enum import Enum
from itertools import combinations, pairwise
from types import ModuleType
from typing import Any, NoReturn

import htmqc.core
from proofs.logic import Concrete, Table, Term
from proofs.model import (
    GHOSTS,
    INVARIANTS,
    LIVE,
    TRANSITIONS,
    Members,
    Tracker,
    assign,
    crash,
    current,
    finished_above,
    initial,
    members_initial,
    release,
)

TP = ("t", 0)
BUDGET = next(i for i in INVARIANTS if i.name == "retries_within_budget")
#: The model's number for :data:`TP`.
TP_INDEX = 0
NOW = 100.0
JITTER = 0.5
#: The consumer events that take one offset and answer whether they were current.
SINGLE = {
    "started": "START",
    "succeeded": "SUCCEED",
    "retry_due": "RETRY_DUE",
    "dead_lettered": "DEAD_LETTER",
}
#: Their batch forms on ConsumerCore.
MANY = {"started_many": "START", "succeeded_many": "SUCCEED", "dead_lettered_many": "DEAD_LETTER"}
#: Lifecycle events a ConsumerCore never makes alone, tried on its tracker directly.
TRACKER_SINGLE = ("FAIL", "SCHEDULE_RETRY")
TRACKER_MANY = ("FAIL", "SCHEDULE_RETRY", "RETRY_DUE")


@dataclass(frozen=True)
class Domain:
    """The bounds of the search (module docs)."""

    top: int = 2
    batch: int = 2
    max_retries: int = 1
    assignments: int = 2

    @property
    def universe(self) -> range:
        """The offsets the model's arrays are kept on: every offset a message, a
        batch or a held set names (a fetch's end, an ack and a stale offset need no
        array entry)."""
        return range(self.top + 1)


@dataclass(frozen=True)
class Side:
    """The model's consumer: its epochs, and the tracker of :data:`TP` if held."""

    members: Members
    tracker: Tracker | None


@dataclass
class Report:
    """What a run did: states visited, events compared, the first disagreement."""

    states: int = 0
    transitions: int = 0
    seconds: float = 0.0
    disagreement: str | None = None

    @property
    def ok(self) -> bool:
        """True when the code agreed with the model everywhere."""
        return self.disagreement is None

    def line(self) -> str:
        """The one-line verdict."""
        size = f"{self.states} states, {self.transitions} events in {self.seconds:.1f}s"
        if self.disagreement is None:
            return f"AGREES differential: model and code, {size}"
        return f"DISAGREES differential: {self.disagreement} ({size})"


class Refused(Exception):
    """The model disables the event (its ``pre`` is false)."""


REFUSED = "refused"


# -- the two sides of an event ---------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One event: its label, what it does to the code, and what the model says."""

    label: str
    code: Callable[[Any], Any]
    model: Callable[[Side], tuple[Side, Any]]


class Harness:
    """The model's side of every event, and how answers are put side by side."""

    def __init__(self, domain: Domain, core: ModuleType | Any) -> None:
        self.domain = domain
        self.core = core
        self.logic = Concrete(domain.universe)
        self.policy = core.RetryPolicy(
            max_retries=domain.max_retries, base_delay=0.5, max_delay=2.0
        )

    # -- model steps -----------------------------------------------------------------

    def set_of(self, offsets: Any) -> Table:
        """A set of offsets as a concrete boolean array."""
        return self.logic.table(dict.fromkeys(offsets, True), False)

    def step(self, side: Side, name: str, **given: Term) -> tuple[Side, Any]:
        """The tracker transition ``name`` on the held partition; refused if ``pre`` fails."""
        assert side.tracker is not None
        step = TRANSITIONS[name].run(self.logic, side.tracker, **given)
        if not all(step.pre):
            raise Refused
        if not all(step.defs):
            raise AssertionError(f"{name}: a definition has no solution")
        return Side(side.members, step.post), step.out

    def on_current(
        self, epoch: int, stale: Any, then: Callable[[Side], tuple[Side, Any]]
    ) -> Callable[[Side], tuple[Side, Any]]:
        """A consumer event stamped ``epoch``: ignored (answer ``stale``) unless current."""

        def run(side: Side) -> tuple[Side, Any]:
            if not current(self.logic, side.members, TP_INDEX, epoch):
                return side, stale
            return then(side)

        return run

    def commit(self, side: Side) -> tuple[Side, Any]:
        """``ConsumerCore.commit_requested``: a Commit of the watermark, or None."""
        if side.tracker is None or not side.members.assigned[TP_INDEX]:
            return side, None
        after, (due, offset, handed) = self.step(side, "commit_requested")
        if not due:
            return after, None
        epoch = side.members.epoch[TP_INDEX]
        return after, ("Commit", TP, epoch, offset, self.logic.members(handed))

    def commits(self, side: Side) -> tuple[Side, Any]:
        """``ConsumerCore.commits``: the commit of every held partition that has one."""
        after, commit = self.commit(side)
        return after, [commit] if commit is not None else []

    def assign(self, start: int, held: tuple[int, ...]) -> Callable[[Side], tuple[Side, Any]]:
        """``ConsumerCore.assign``: a fresh epoch and a new tracker."""

        def run(side: Side) -> tuple[Side, Any]:
            allowed, members = assign(self.logic, side.members, TP_INDEX)
            step = initial(self.logic, start, self.set_of(held), self.domain.max_retries)
            if not (allowed and all(step.pre)):
                raise Refused
            return Side(members, step.post), members.last

        return run

    def failed(self, epoch: int, offset: int, kind: Enum) -> Callable[[Side], tuple[Side, Any]]:
        """``ConsumerCore.failed``: a RetryAt or a DeadLetter."""
        permanent = kind is self.core.FailureKind.PERMANENT

        def then(side: Side) -> tuple[Side, Any]:
            after, (retry, attempts) = self.step(
                side, "consumer.failed", offset=offset, permanent=permanent
            )
            if retry:
                at = NOW + self.policy.delay(attempts, JITTER)
                return after, ("RetryAt", TP, epoch, offset, attempts, at)
            return after, ("DeadLetter", TP, epoch, offset, attempts, permanent)

        return self.on_current(epoch, None, then)

    # -- observation ---------------------------------------------------------------------

    def observe_model(self, side: Side) -> Any:
        """The observable state of the model's consumer."""
        m = side.members
        if not m.assigned[TP_INDEX]:
            return None
        t = side.tracker
        assert t is not None
        live = tuple((o, s) for o, s in t.states.items() if s in LIVE)
        return (
            m.epoch[TP_INDEX],
            t.next,
            t.processed,
            t.committed,
            t.requested,
            t.draining,
            live,
            tuple((o, n) for o, n in t.failures.items() if n),
            tuple(o for o in self.logic.universe if finished_above(self.logic, t, o)),
        )

    def observe_code(self, consumer: Any) -> Any:
        """The observable state of the code's consumer (public API only)."""
        epoch = consumer.epoch(TP)
        if epoch is None:
            return None
        t = consumer.tracker(TP)
        return (
            epoch,
            t.next,
            t.processed,
            t.committed,
            t.requested,
            t.draining,
            tuple((o, s.name) for o, s in sorted(t.in_flight().items())),
            tuple((o, n) for o in self.domain.universe if (n := t.failures(o))),
            tuple(t.finished_above()),
        )

    def model_key(self, side: Side) -> Any:
        """The model state less its ghosts, with what no transition or observation
        tells apart merged: which finished state an offset reached, and anything
        below the watermark."""
        m = side.members
        if side.tracker is None or not m.assigned[TP_INDEX]:
            return (m.last,)
        t = side.tracker
        values = []
        for f in fields(Tracker):
            if f.name in GHOSTS:
                continue
            value = getattr(t, f.name)
            if f.name == "states":
                value = tuple(
                    "-" if o < t.processed else (s if s in LIVE or s == "ABSENT" else "DONE")
                    for o, s in value.items()
                )
            elif isinstance(value, Table):
                value = value.values
            values.append(value)
        return (m.last, m.epoch[TP_INDEX], *values)


def answer_of(value: Any) -> Any:
    """A code answer in the model's terms: decisions as tuples, states by name."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, Enum):
        return value.name
    name = type(value).__name__
    if name == "Commit":
        return (name, value.tp, value.epoch, value.offset, tuple(value.finished_above))
    if name == "RetryAt":
        return (name, value.tp, value.epoch, value.offset, value.attempt, value.at)
    if name == "DeadLetter":
        return (name, value.tp, value.epoch, value.offset, value.attempts, value.permanent)
    if isinstance(value, list):
        return [answer_of(v) for v in value]
    return tuple(value)


# -- the events ---------------------------------------------------------------------------


def _subsets(items: range, most: int | None = None) -> Iterator[tuple[int, ...]]:
    top = len(items) if most is None else most
    for size in range(top + 1):
        yield from combinations(items, size)


def events(h: Harness, side: Side) -> Iterator[Case]:
    """Every event of the domain from the model state ``side`` (module docs)."""
    d = h.domain
    offsets = range(d.top + 1)
    m = side.members
    if not m.assigned[TP_INDEX]:
        if m.last < d.assignments:
            yield from _assignments(h, side)
        yield from _stale(h, side, m.last)
        yield Case(
            "crashed()",
            lambda c: c.crashed(),
            lambda s: (Side(crash(h.logic, s.members), None), None),
        )
        return
    t = side.tracker
    assert t is not None
    epoch = m.epoch[TP_INDEX]
    for name in ("assign", "restored"):
        yield Case(
            f"{name}(t/0, 0)",
            lambda c, name=name: getattr(c, name)(TP, 0),
            h.assign(0, ()),
        )
    yield from _fetches(h, side, epoch)
    for method, event in SINGLE.items():
        for o in offsets:
            yield Case(
                f"{method}(t/0, e{epoch}, {o})",
                lambda c, method=method, o=o: getattr(c, method)(TP, epoch, o),
                h.on_current(epoch, False, _lifecycle(h, event, o, True)),
            )
    for o in offsets:
        for kind in h.core.FailureKind:
            yield Case(
                f"failed(t/0, e{epoch}, {o}, {kind.name})",
                lambda c, o=o, kind=kind: c.failed(TP, epoch, o, kind, NOW, JITTER),
                h.failed(epoch, o, kind),
            )
    batches = [b for b in _subsets(offsets, d.batch) if len(b) != 1]
    batches.append((t.processed, t.processed))
    for method, event in MANY.items():
        for batch in batches:
            yield Case(
                f"{method}(t/0, e{epoch}, {list(batch)})",
                lambda c, method=method, batch=batch: getattr(c, method)(TP, epoch, list(batch)),
                h.on_current(epoch, False, _lifecycle(h, event, batch, True)),
            )
    for event in TRACKER_SINGLE:
        for o in offsets:
            yield Case(
                f"tracker.apply({event}, {o})",
                lambda c, event=event, o=o: c.tracker(TP).apply(htmqc.core.Event[event], o),
                _lifecycle(h, event, o),
            )
    for event in TRACKER_MANY:
        for batch in batches:
            yield Case(
                f"tracker.apply_many({event}, {list(batch)})",
                lambda c, event=event, batch=batch: c.tracker(TP).apply_many(
                    htmqc.core.Event[event], list(batch)
                ),
                _lifecycle(h, event, batch, None),
            )
    yield Case("commit_requested(t/0)", lambda c: c.commit_requested(TP), h.commit)
    yield Case(
        "commits()",
        lambda c: c.commits(),
        h.commits,
    )
    for o in range(-1, d.top + 3):
        yield Case(
            f"commit_acked(t/0, e{epoch}, {o})",
            lambda c, o=o: c.commit_acked(TP, epoch, o),
            h.on_current(epoch, False, lambda s, o=o: h.step(s, "commit_acked", offset=o)),
        )
    yield Case(
        f"commit_failed(t/0, e{epoch}, {t.requested})",
        lambda c: c.commit_failed(TP, epoch, t.requested),
        h.on_current(
            epoch,
            False,
            lambda s: (h.step(s, "commit_failed", offset=t.requested)[0], True),
        ),
    )
    yield Case(
        "revoking(t/0)",
        lambda c: c.revoking(TP),
        lambda s: (h.step(s, "begin_drain")[0], None),
    )
    yield Case("revoked(t/0)", lambda c: c.revoked(TP), lambda s: _revoked(h, s))
    yield Case(
        "crashed()",
        lambda c: c.crashed(),
        lambda s: (Side(crash(h.logic, s.members), None), None),
    )
    for stale in {epoch + 1, max(epoch - 1, 1)} - {epoch}:
        yield from _stale(h, side, stale)


def _lifecycle(
    h: Harness, event: str, chosen: int | tuple[int, ...], answer: Any = "target"
) -> Callable[[Side], tuple[Side, Any]]:
    """A lifecycle event on one offset or on a batch; answers ``answer``, or the
    target state if ``answer`` is ``"target"`` (what ``PartitionTracker.apply`` says)."""
    value = htmqc.core.Event[event].value

    def run(side: Side) -> tuple[Side, Any]:
        if isinstance(chosen, int):
            after, target = h.step(side, f"apply[{value}]", offset=chosen)
        elif len(set(chosen)) != len(chosen):
            raise Refused
        else:
            after, target = h.step(side, f"apply_many[{value}]", batch=h.set_of(chosen))
        return after, target if answer == "target" else answer

    return run


def _revoked(h: Harness, side: Side) -> tuple[Side, Any]:
    after, commit = h.commit(side)
    return Side(release(h.logic, after.members, TP_INDEX), None), commit


def _assignments(h: Harness, side: Side) -> Iterator[Case]:
    d = h.domain
    if side.members.last == 0:
        starts = [(s, held) for s in range(d.top + 1) for held in _subsets(range(s + 1, d.top + 1))]
        method = "assign"
    else:
        starts = [(1, (d.top,))]
        method = "restored"
    for start, held in [*starts, (-1, ()), (1, (1,))]:
        yield Case(
            f"{method}(t/0, {start}, {list(held)})",
            lambda c, start=start, held=held: getattr(c, method)(TP, start, held),
            h.assign(start, held),
        )


def _fetches(h: Harness, side: Side, epoch: int) -> Iterator[Case]:
    t = side.tracker
    assert t is not None
    lo = max(0, t.next - 1)
    span = range(lo, h.domain.top + 1)
    lists: list[tuple[int, ...]] = list(_subsets(span))
    if len(span) >= 2:
        lists += [(span[1], span[0]), (span[0], span[0])]
    for arrived in lists:
        ends = range(arrived[-1], h.domain.top + 2) if arrived else range(lo, h.domain.top + 2)
        for end in [None, *ends]:
            yield Case(
                f"fetched(t/0, e{epoch}, {list(arrived)}, {end})",
                lambda c, arrived=arrived, end=end: tuple(
                    c.fetched(TP, epoch, list(arrived), end)
                ),
                h.on_current(epoch, (), _fetch(h, arrived, end)),
            )


def _fetch(
    h: Harness, arrived: tuple[int, ...], end: int | None
) -> Callable[[Side], tuple[Side, Any]]:
    def run(side: Side) -> tuple[Side, Any]:
        if not arrived and end is None:
            return side, ()
        if any(a >= b for a, b in pairwise(arrived)):
            raise Refused
        stop = arrived[-1] + 1 if end is None else end
        after, run_set = h.step(side, "fetched", arrived=h.set_of(arrived), end=stop)
        return after, h.logic.members(run_set)

    return run


def _stale(h: Harness, side: Side, epoch: int) -> Iterator[Case]:
    """One of each epoch-stamped event with ``epoch``, which is not current."""
    nxt = side.tracker.next if side.tracker is not None else 0

    def ignored(answer: Any) -> Callable[[Side], tuple[Side, Any]]:
        return h.on_current(epoch, answer, lambda s: (s, "current: not a stale epoch"))

    yield Case(
        f"fetched(t/0, e{epoch}, [{nxt}], None)",
        lambda c: tuple(c.fetched(TP, epoch, [nxt], None)),
        ignored(()),
    )
    for method in SINGLE:
        yield Case(
            f"{method}(t/0, e{epoch}, 0)",
            lambda c, method=method: getattr(c, method)(TP, epoch, 0),
            ignored(False),
        )
    for method in MANY:
        yield Case(
            f"{method}(t/0, e{epoch}, [0])",
            lambda c, method=method: getattr(c, method)(TP, epoch, [0]),
            ignored(False),
        )
    yield Case(
        f"failed(t/0, e{epoch}, 0, RETRYABLE)",
        lambda c: c.failed(TP, epoch, 0, h.core.FailureKind.RETRYABLE, NOW, JITTER),
        ignored(None),
    )
    yield Case(
        f"commit_acked(t/0, e{epoch}, 0)", lambda c: c.commit_acked(TP, epoch, 0), ignored(False)
    )
    yield Case(
        f"commit_failed(t/0, e{epoch}, 0)", lambda c: c.commit_failed(TP, epoch, 0), ignored(False)
    )
    if not side.members.assigned[TP_INDEX]:
        yield Case("commit_requested(t/0)", lambda c: c.commit_requested(TP), h.commit)
        yield Case("revoking(t/0)", lambda c: c.revoking(TP), lambda s: (s, None))
        yield Case("revoked(t/0)", lambda c: c.revoked(TP), lambda s: (s, None))


# -- the search ---------------------------------------------------------------------------


def _clone(value: Any) -> Any:
    """A copy of a code object deep enough that stepping it leaves ``value`` alone."""
    kind = type(value)
    if kind is dict:
        return {k: _clone(v) for k, v in value.items()}
    if kind is list or kind is set or kind is deque:
        return kind(value)
    if hasattr(value, "__dict__") and not isinstance(value, type | Enum):
        copy = object.__new__(kind)
        copy.__dict__.update({k: _clone(v) for k, v in vars(value).items()})
        return copy
    return value


def _freeze(value: Any) -> Any:
    """A hashable image of a code object's whole state (private fields included)."""
    kind = type(value)
    if kind is dict:
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if kind is set or kind is frozenset:
        return tuple(sorted(value))
    if kind is list or kind is deque or kind is tuple:
        return tuple(value) if all(type(v) is int for v in value) else tuple(map(_freeze, value))
    if hasattr(value, "__dict__") and not isinstance(value, type | Enum):
        return (kind.__name__, *map(_freeze, vars(value).values()))
    return value


#: Types whose values are kept as they are by :func:`_snapshot` (enums join on sight).
_ATOMS: set[type] = {int, bool, str, float, type(None), tuple}


def _snapshot(value: Any) -> Any:
    """A copy of a code object's whole state (private fields included) as plain
    dicts and lists, which compare with ``==`` whatever the insertion order."""
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in _ATOMS else _snapshot(v) for k, v in value.items()}
    if kind is list or kind is deque or kind is set:
        return kind(value)
    if isinstance(value, Enum):
        _ATOMS.add(kind)
        return value
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return (kind, _snapshot(vars(value)))
    return value


def _code_answer(h: Harness, case: Case, consumer: Any) -> Any:
    try:
        return answer_of(case.code(consumer))
    except h.core.CoreError:
        return REFUSED
    except Exception as error:  # any other exception is a disagreement, not a crash
        return f"raised {type(error).__name__}: {error}"


def _model_answer(case: Case, side: Side) -> tuple[Side, Any]:
    try:
        return case.model(side)
    except Refused:
        return side, REFUSED


def _within(h: Harness, side: Side) -> bool:
    """Explore on from ``side``: only states a ConsumerCore can reach, where a
    Retrying offset has failed at most ``max_retries`` times."""
    t = side.tracker
    return t is None or bool(BUDGET.holds(h.logic, t))


def check(domain: Domain | None = None, core: ModuleType | Any = htmqc.core) -> Report:
    """Compare ``core`` (by default :mod:`htmqc.core`; anything with its
    ``ConsumerCore``, ``RetryPolicy``, ``FailureKind`` and ``CoreError``) with the
    model on every state of ``domain``; stop at the first disagreement.

    Where the model's state does not change (a refusal, a stale event) the code
    must not change either: not even a private field."""
    began = time.perf_counter()
    h = Harness(domain or Domain(), core)
    report = Report()
    root = (core.ConsumerCore(h.policy), Side(members_initial(h.logic), None))
    seen = {(_freeze(root[0]), h.model_key(root[1]))}
    queue = deque([root])
    while queue and report.ok:
        consumer, side = queue.popleft()
        report.states += 1
        before = _snapshot(consumer)
        shown = h.observe_model(side)
        for case in events(h, side):
            report.transitions += 1
            after, model_answer = _model_answer(case, side)
            unchanged = after is side
            code = consumer if unchanged else _clone(consumer)
            code_answer = _code_answer(h, case, code)
            if unchanged:
                seen_model = shown
                changed = _snapshot(code) != before
                seen_code = "its state changed" if changed else shown
            else:
                seen_model = h.observe_model(after)
                try:
                    seen_code = h.observe_code(code)
                except Exception as error:  # as in _code_answer
                    seen_code = f"unobservable: {type(error).__name__}: {error}"
            if (code_answer, seen_code) != (model_answer, seen_model):
                found = (
                    f"state={shown} event={case.label} code={code_answer} -> {seen_code} "
                    f"model={model_answer} -> {seen_model}"
                )
                report.disagreement = " ".join(found.split())  # one line, whatever was raised
                break
            if unchanged or not _within(h, after):
                continue
            key = (_freeze(code), h.model_key(after))
            if key not in seen:
                seen.add(key)
                queue.append((code, after))
    report.seconds = time.perf_counter() - began
    return report


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def main(argv: list[str] | None = None) -> int:
    """``python -m proofs.differential [--top N] [--batch N]``: the check over a
    larger domain than ``python -m proofs`` uses; 0 iff the code agrees."""
    parser = _Parser(prog="python -m proofs.differential")
    parser.add_argument("--top", type=int, default=Domain.top)
    parser.add_argument("--batch", type=int, default=Domain.batch)
    try:
        args = parser.parse_args(argv)
        if args.top < 1 or args.batch < 2:
            raise _UsageError(f"need --top >= 1 and --batch >= 2, got {args.top} and {args.batch}")
    except _UsageError as problem:
        print(f"error: {problem}; usage: python -m proofs.differential [--top N] [--batch N]")
        return 2
    report = check(Domain(top=args.top, batch=args.batch))
    print(report.line(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
