"""Graph replay: the real ``htmqc.core`` checked against every edge of the TLA+ model.

Contract
--------
``python -m model_checks.graph_replay [--config small] [--model NAME]...``
takes the models of that size that ``tla/manifest.json`` marks ``"replay":
true``, has TLC dump each one's whole reachable state graph
(:mod:`model_checks.state_graph`, cached under ``build/graphs/``) and replays
it through ``htmqc.core.ConsumerCore``, one core per member, imported the
normal way (a mutated copy of ``htmqc/core`` first on ``PYTHONPATH`` is what
gets tested). It prints, per model, the states and edges checked and the
seconds taken, and exits 0; at the first disagreement it prints one line
(model, action, member/partition, state numbers, what differs) and exits 1.
Bad usage exits 2.

How
---
States are visited in TLC's (breadth-first) order. Each reachable state gets
one *core state*: a core per member plus its epoch history (the refinement
mapping's history variable, :mod:`model_checks.refinement`), reached along
some path. For every edge ``s -[A]-> t`` the cores of ``s`` are copied
(``copy.deepcopy``), the core call(s) action ``A`` stands for are made on the
acting member's copy, and:

1. **state**: the mapped core (:func:`model_checks.refinement.core_view`)
   must equal the abstraction of ``t``'s view for every member and
   partition (the other members' views must be unchanged);
2. **decisions**: what the call hands out must be what ``t`` shows: the
   offsets ``fetched`` returns to run (those ``t`` has Pending);
   ``failed``'s :class:`RetryAt` or :class:`DeadLetter` (Retrying or Failed in
   ``t``, with the attempt count); ``commit_requested``'s offset, epoch and
   ``finished_above`` (the answer in ``t``'s ``net``, and when stored,
   ``t``'s ``durable`` and ``durableAbove``: the exactly-once payload);
   ``revoked``'s final commit; the booleans of the lifecycle events, acks
   and commit failures (False exactly when the model ignores the event as
   late).

Lifecycle events of a single offset are made twice, on two copies: the single
form (``succeeded``) and the batch form with that one offset
(``succeeded_many``); both must land in ``t``.

The parameters of an action (TLC's label is only its name) are read off the
two states: the view that changed, the offset whose state changed, the
running handler or the answer that left. Environment actions
(``SessionExpired``, ``AnswerLost``) make no core call: every view must stay
as it was.

**Refusals.** Every state is also checked for what the model cannot do from
it. For each member and held partition, on a copy of the core (whose
fingerprint must not change):

* a lifecycle event on an offset whose spec state is not the event's source
  state (the source states are read from the graph's own edges) must raise
  ``IllegalTransition``, in single and batch form, alone, next to an offset
  that could move (all or nothing) and twice in one batch;
* every event tagged with a stale epoch (each core epoch this member had
  before, and 0, never handed out) must be ignored (``False``/``None``/no
  offsets);
* an ack above the watermark must raise ``IllegalTransition``;
* with no ``CommitRequested`` edge from the state for that partition,
  ``commit_requested`` must hand out nothing.

Cost. Cores are copied by pickling (each state keeps its members' pickled
cores, shared between states). An edge's check is a function of the acting
member's core and the parts of the two states it reads (that member's view
and handlers, the network, the durable positions, ownership); edges that agree
on all of them get the same verdict, so it is computed once and reused.
Refusals are likewise checked once per member core state. Every edge is still
covered; only identical computations are skipped.
"""

from __future__ import annotations

import argparse
import copy
import json
import pickle
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from htmqc.core import (
    Commit,
    ConsumerCore,
    DeadLetter,
    FailureKind,
    IllegalTransition,
    RetryAt,
    RetryPolicy,
)
from htmqc.errors import HtmqcError, UsageError
from model_checks.refinement import (
    EpochHistory,
    MappingError,
    core_view,
    difference,
    spec_view,
    topic_partition,
)
from model_checks.state_graph import StateGraph, load_graph
from model_checks.tlc import TLA_DIR

MANIFEST = TLA_DIR / "manifest.json"
#: The variables of Consumer.tla the replay reads.
VARIABLES = frozenset(
    {"owner", "epoch", "fence", "down", "view", "work", "net", "durable", "durableAbove"}
)
#: Lifecycle actions: the core calls for one offset (single form, batch form).
LIFECYCLE: dict[str, tuple[str, str | None]] = {
    "Started": ("started", "started_many"),
    "RetryDue": ("retry_due", None),
    "Succeeded": ("succeeded", "succeeded_many"),
    "Failed": ("failed", None),
    "DeadLettered": ("dead_lettered", "dead_lettered_many"),
}
_NOW = 100.0
_JITTER = 0.5

State = Mapping[str, Any]


class Mismatch(Exception):
    """The core and the model disagree (see :meth:`Replay.run`)."""

    def __str__(self) -> str:
        if not self.where:
            return self.detail
        return f"{self.where}, depth {len(self.path) - 1}: {self.detail}"

    def __init__(self, detail: str, where: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.where = where
        #: The model's way to the disagreement, ``(action, state)`` from an
        #: initial state (action ``""``); set by :meth:`Replay.run`.
        self.path: list[tuple[str, int]] = []
        #: :func:`explain` of ``path``; set by :func:`replay_graph`.
        self.explanation: list[str] = []


@dataclass
class Member:
    """One member's core and the mapping's epoch history."""

    core: ConsumerCore
    history: EpochHistory = field(default_factory=EpochHistory)


#: The members' cores in one state: frozen (pickled bytes, shared between
#: states) or, for the member a step acts on, a live copy.
Cores = dict[str, "Member | bytes"]


@dataclass
class ReplayStats:
    """What one model's replay covered."""

    model: str
    states: int
    edges: int
    refusals: int
    seconds: float
    cached: bool


# -- reading the two states of an edge -----------------------------------------------------


def _views(s: State, member: str) -> Mapping[str, Any]:
    views: Mapping[str, Any] = s["view"][member]
    return views


def _changed_views(s: State, t: State) -> list[tuple[str, str]]:
    out = []
    for m in sorted(s["view"]):
        a, b = s["view"][m], t["view"][m]
        if a is b:
            continue
        out += [(m, p) for p in sorted(a) if a[p] != b[p]]
    return out


def _one(items: Sequence[Any], what: str) -> Any:
    if len(items) != 1:
        raise Mismatch(f"cannot tell the {what} of this step ({len(items)} candidates)")
    return items[0]


def _left(s: State, t: State, var: str, member: str | None = None) -> list[Any]:
    before = s[var] if member is None else s[var][member]
    after = t[var] if member is None else t[var][member]
    return sorted(before - after, key=repr)


# -- the replay ------------------------------------------------------------------------------


class Replay:
    """Replays one model's state graph (see module docs)."""

    def __init__(self, graph: StateGraph) -> None:
        self.graph = graph
        consts = graph.constants
        self.max_retries = int(consts.get("MaxRetries", "0"))
        first = graph.states[graph.initial[0]]
        self.members = sorted(first["view"])
        self.partitions = sorted(first["owner"])
        any_view = first["view"][self.members[0]][self.partitions[0]]
        self.offsets = sorted(any_view["st"])
        self.probe_offsets = [*self.offsets, self.offsets[-1] + 1 if self.offsets else 0]
        self.out = graph.out_edges()
        self.sources = self._sources()
        self.refusals = 0
        self._refused: set[tuple[Any, ...]] = set()
        self.handlers: dict[str, Callable[[str, State, State, Cores], Cores]] = {
            "Assign": self._assign,
            "Restored": self._restored,
            "Crashed": self._crashed,
            "Revoked": self._revoked,
            "RevokedLost": self._revoked_lost,
            "SessionExpired": self._environment,
            "AnswerLost": self._environment,
            "Fetched": self._fetched,
            "Started": self._lifecycle_offset,
            "RetryDue": self._lifecycle_offset,
            "DeadLettered": self._lifecycle_offset,
            "Succeeded": self._completion,
            "Failed": self._completion,
            "CommitRequested": self._commit_requested,
            "CommitAcked": self._ack,
            "AckDuplicated": self._ack,
            "CommitFailed": self._commit_failed,
        }

    def new_member(self) -> Member:
        """A fresh core with the model's retry limit."""
        return Member(ConsumerCore(RetryPolicy(max_retries=self.max_retries)))

    # -- driving ---------------------------------------------------------------------------

    def run(self) -> int:
        """Replay every edge; return the number of refusal checks made.

        :raises Mismatch: the first disagreement (``where`` names the edge,
            ``path`` the model's way there).
        """
        cores: dict[int, Cores] = {}
        self.parent: dict[int, tuple[int, str]] = {}
        for ident in self.graph.initial:
            start: Cores = {m: self.new_member() for m in self.members}
            self._compare_all(self.graph.states[ident], start, f"initial state {ident}")
            cores[ident] = _freeze(start)
            self._refusals(ident, cores[ident])
        done: dict[Any, Member | bytes | None] = {}
        for src, action, dst in self.graph.edges:
            s, t = self.graph.states[src], self.graph.states[dst]
            fresh = dst not in cores
            try:
                after = self._edge(action, s, t, cores[src], done, fresh)
            except Mismatch as exc:
                exc.where = f"{action} (state {src} -> {dst})"
                exc.path = [*self.path_to(src), (action, dst)]
                raise
            if fresh:
                cores[dst] = after
                self.parent[dst] = (src, action)
                try:
                    try:
                        self._refusals(dst, after)
                    except Mismatch:
                        raise
                    except Exception as exc:
                        raise Mismatch(_raised(exc)) from None
                except Mismatch as exc:
                    exc.where = f"refusals in state {dst}"
                    exc.path = self.path_to(dst)
                    raise
        return self.refusals

    def path_to(self, ident: int) -> list[tuple[str, int]]:
        """``(action, state)`` from an initial state (action ``""``) to ``ident``
        along the path whose core state the replay kept."""
        steps = []
        while ident in self.parent:
            src, action = self.parent[ident]
            steps.append((action, ident))
            ident = src
        steps.append(("", ident))
        return steps[::-1]

    def _edge(
        self, action: str, s: State, t: State, cores: Cores,
        done: dict[Any, Member | bytes | None], fresh: bool,
    ) -> Cores:
        """Check one edge; the cores of its target (frozen; empty unless ``fresh``)."""
        handler = self.handlers.get(action)
        if handler is None:
            raise Mismatch(f"no core mapping for action {action}")
        key = self._edge_key(action, s, t, cores)
        cached = done.get(key, False) if key is not None else False
        if key is not None and cached is not False and (cached is not None or not fresh):
            return {**cores, key[1]: cached} if fresh else {}  # type: ignore[dict-item]
        try:
            after = handler(action, s, t, cores)
        except Mismatch:
            raise
        except MappingError as exc:
            raise Mismatch(f"refinement mapping undefined: {exc}") from None
        except Exception as exc:  # whatever the core raises is a finding
            raise Mismatch(_raised(exc)) from None
        if fresh:
            after = _freeze(after)
        if key is not None:
            done[key] = after[key[1]] if fresh else None
        return after

    def _edge_key(self, action: str, s: State, t: State, cores: Cores) -> Any:
        """What an edge's check depends on, when one member acts (else None).

        Edges that agree on it are checked once: the acting member's frozen
        core, its view and handlers before and after, the network, the durable
        positions, the ownership, and whether the other members' views stay."""
        actors = [m for m in self.members if _moved(s, t, m)]
        if not actors and action in ("CommitAcked", "CommitFailed"):
            actors = [msg["member"] for msg in s["net"] - t["net"]]
        if len(actors) != 1:
            return None
        m = actors[0]
        return (
            action, m, cores[m], s["view"][m], t["view"][m], s["work"][m], t["work"][m],
            s["net"], t["net"], s["durable"], t["durable"], s["durableAbove"],
            t["durableAbove"], m in s["down"], m in t["down"], s["owner"],
        )

    def _member(self, cores: Cores, member: str) -> Member:
        """A live copy of ``member``'s core (the frozen one stays as it is)."""
        frozen = cores[member]
        if isinstance(frozen, Member):
            return copy.deepcopy(frozen)
        live: Member = pickle.loads(frozen)
        return live

    def _copy(self, cores: Cores, member: str) -> tuple[Cores, Member]:
        """``cores`` with a live copy of ``member``'s core, and that copy."""
        live = self._member(cores, member)
        return {**cores, member: live}, live

    def _compare(self, t: State, cores: Cores, member: str) -> None:
        live = cores[member]
        assert isinstance(live, Member)
        for p in self.partitions:
            core = core_view(live.core, p, live.history, self.offsets)
            diff = difference(core, spec_view(t["view"][member][p]))
            if diff is not None:
                raise Mismatch(f"{member}/{p} {diff}")

    def _compare_all(self, t: State, cores: Cores, where: str) -> None:
        try:
            for m in self.members:
                self._compare(t, self._copy(cores, m)[0], m)
        except Mismatch as exc:
            raise Mismatch(exc.detail, where) from None

    def _settle(self, s: State, t: State, cores: Cores, member: str) -> Cores:
        """Compare the acting member with ``t``; the others must not have moved."""
        self._compare(t, cores, member)
        for m in self.members:
            if m != member and s["view"][m] != t["view"][m]:
                raise Mismatch(f"the model changed {m}'s view in a step of {member}")
        return cores

    def _epoch(self, member: Member | bytes, p: str, spec_epoch: int) -> int:
        live: Member = member if isinstance(member, Member) else pickle.loads(member)
        core_epoch = live.history.core(p, spec_epoch)
        if core_epoch is None:
            raise Mismatch(f"no core epoch for {p}'s assignment {spec_epoch}")
        return core_epoch

    # -- membership ------------------------------------------------------------------------

    def _assign(self, action: str, s: State, t: State, cores: Cores) -> Cores:
        m, p = _one(_changed_views(s, t), "assigned view")
        cores, member = self._copy(cores, m)
        self._take(member.core.assign, member, m, p, s, t)
        return self._settle(s, t, cores, m)

    def _restored(self, action: str, s: State, t: State, cores: Cores) -> Cores:
        m = _one(sorted(s["down"] - t["down"]), "restarted member")
        cores, member = self._copy(cores, m)
        for p in self.partitions:
            if s["owner"][p] == m:
                self._take(member.core.restored, member, m, p, s, t)
        return self._settle(s, t, cores, m)

    def _take(
        self, call: Callable[[Any, int, list[int]], int], member: Member, m: str, p: str,
        s: State, t: State,
    ) -> None:
        """``assign``/``restored`` at the spec's durable position of ``p``; the
        epoch it returns goes into the history."""
        epoch = call(topic_partition(p), s["durable"][p], sorted(s["durableAbove"][p]))
        member.history.record(epoch, p, t["view"][m][p]["epoch"])

    def _crashed(self, action: str, s: State, t: State, cores: Cores) -> Cores:
        m = _one(sorted(t["down"] - s["down"]), "crashed member")
        cores, member = self._copy(cores, m)
        member.core.crashed()
        return self._settle(s, t, cores, m)

    def _revoked(self, action: str, s: State, t: State, cores: Cores) -> Cores:
        m, p = _one(_changed_views(s, t), "revoked view")
        cores, member = self._copy(cores, m)
        commit = member.core.revoked(topic_partition(p))
        if commit is None:
            if (t["durable"][p], t["durableAbove"][p]) != (s["durable"][p], s["durableAbove"][p]):
                raise Mismatch(
                    f"{m}/{p} revoked: the model stores a final commit, the core hands out none"
                )
        else:
            self._check_commit(commit, m, p, s["view"][m][p]["epoch"], member)
            stored = (t["durable"][p], t["durableAbove"][p])
            if stored != (commit.offset, frozenset(commit.finished_above)):
                raise Mismatch(
                    f"{m}/{p} revoked: final commit {_commit_text(commit)}, "
                    f"model stores offset {stored[0]} above {sorted(stored[1])}"
                )
        return self._settle(s, t, cores, m)

    def _revoked_lost(self, action: str, s: State, t: State, cores: Cores) -> Cores:
        m, p = _one(_changed_views(s, t), "lost view")
        cores, member = self._copy(cores, m)
        member.core.revoked(topic_partition(p))
        return self._settle(s, t, cores, m)

    def _environment(self, action: str, s: State, t: State, cores: Cores) -> Cores:
        if s["view"] != t["view"]:
            raise Mismatch("an environment step changed a member's view")
        return cores

    # -- fetching and the lifecycle --------------------------------------------------------

    def _fetched(self, action: str, s: State, t: State, cores: Cores) -> Cores:
        m, p = _one(_changed_views(s, t), "fetching view")
        sv, tv = s["view"][m][p], t["view"][m][p]
        cores, member = self._copy(cores, m)
        arrived = [o for o in range(sv["next"], tv["next"]) if tv["st"][o] != "None"]
        run = list(
            member.core.fetched(
                topic_partition(p), self._epoch(member, p, sv["epoch"]), arrived, tv["next"]
            )
        )
        expected = [o for o in arrived if tv["st"][o] == "Pending"]
        if run != expected:
            raise Mismatch(
                f"{m}/{p} fetched {arrived} up to {tv['next']}: the core hands out {run} "
                f"to run, the model {expected}"
            )
        return self._settle(s, t, cores, m)

    def _moved_offset(self, s: State, t: State) -> tuple[str, str, int]:
        m, p = _one(_changed_views(s, t), "view")
        sv, tv = s["view"][m][p], t["view"][m][p]
        o = _one([o for o in self.offsets if sv["st"][o] != tv["st"][o]], "offset")
        return m, p, o

    def _lifecycle_offset(self, action: str, s: State, t: State, cores: Cores) -> Cores:
        m, p, o = self._moved_offset(s, t)
        single, batch = LIFECYCLE[action]
        epoch = self._epoch(cores[m], p, s["view"][m][p]["epoch"])
        results = []
        for name, arg in ((single, o), (batch, [o])):
            if name is None:
                continue
            copied, live = self._copy(cores, m)
            ok = getattr(live.core, name)(topic_partition(p), epoch, arg)
            if ok is not True:
                raise Mismatch(f"{m}/{p} {name}({arg}) returned {ok!r}, the model takes it")
            self._settle(s, t, copied, m)
            results.append(copied)
        return results[0]

    def _completion(self, action: str, s: State, t: State, cores: Cores) -> Cores:
        m = _one([m for m in self.members if s["work"][m] != t["work"][m]], "member")
        w = _one(_left(s, t, "work", m), "finished handler")
        p, o = w["p"], w["o"]
        taken = s["view"][m][p] != t["view"][m][p]
        epoch = self._epoch(cores[m], p, w["epoch"])
        tp = topic_partition(p)
        if action == "Succeeded":
            results = []
            for name, arg in (("succeeded", o), ("succeeded_many", [o])):
                copied, live = self._copy(cores, m)
                ok = getattr(live.core, name)(tp, epoch, arg)
                if ok is not taken:
                    raise Mismatch(
                        f"{m}/{p} {name}({arg}) of epoch {w['epoch']} returned {ok!r}, "
                        f"the model {'takes' if taken else 'ignores'} it"
                    )
                self._settle(s, t, copied, m)
                results.append(copied)
            return results[0]
        cores, member = self._copy(cores, m)
        tv = t["view"][m][p]
        attempts = tv["fails"][o]
        if not taken:
            kind = FailureKind.UNKNOWN
        elif tv["st"][o] == "Retrying":
            kind = FailureKind.RETRYABLE
        else:
            kind = FailureKind.PERMANENT if attempts <= self.max_retries else FailureKind.UNKNOWN
        decision = member.core.failed(tp, epoch, o, kind, _NOW, _JITTER)
        expected = _expected_failure(taken, tv["st"][o], attempts, kind)
        got = _decision_text(decision, epoch)
        if got != expected:
            raise Mismatch(
                f"{m}/{p} failed({o}, {kind.value}) decides {got}, the model {expected}"
            )
        return self._settle(s, t, cores, m)

    # -- commits ---------------------------------------------------------------------------

    def _check_commit(
        self, commit: Commit, m: str, p: str, spec_epoch: int, member: Member
    ) -> None:
        origin = member.history.spec(commit.epoch)
        if origin != (p, spec_epoch):
            raise Mismatch(
                f"{m}/{p} commit carries core epoch {commit.epoch} = {origin}, "
                f"the model's assignment is {spec_epoch}"
            )
        above = list(commit.finished_above)
        if above != sorted(set(above)) or any(o < commit.offset for o in above):
            raise Mismatch(f"{m}/{p} commit {_commit_text(commit)}: finished_above is malformed")

    def _commit_requested(self, action: str, s: State, t: State, cores: Cores) -> Cores:
        m, p = _one(_changed_views(s, t), "committing view")
        cores, member = self._copy(cores, m)
        sv, tv = s["view"][m][p], t["view"][m][p]
        commit = member.core.commit_requested(topic_partition(p))
        if commit is None:
            raise Mismatch(f"{m}/{p} commit_requested hands out nothing, the model commits")
        self._check_commit(commit, m, p, sv["epoch"], member)
        answer = {"member": m, "part": p, "epoch": sv["epoch"], "off": commit.offset}
        stored = (
            t["durable"][p] == commit.offset
            and t["durableAbove"][p] == frozenset(commit.finished_above)
            and _has_answer(t["net"], answer, ok=True)
        )
        refused = (
            (t["durable"][p], t["durableAbove"][p]) == (s["durable"][p], s["durableAbove"][p])
            and _has_answer(t["net"], answer, ok=False)
        )
        if not (stored or refused):
            raise Mismatch(
                f"{m}/{p} commit_requested hands out {_commit_text(commit)}; the model "
                f"requests {tv['requested']} and stores offset {t['durable'][p]} "
                f"above {sorted(t['durableAbove'][p])}"
            )
        return self._settle(s, t, cores, m)

    def _ack(self, action: str, s: State, t: State, cores: Cores) -> Cores:
        changed = _changed_views(s, t)
        left = _left(s, t, "net")
        if left:
            candidates = [_one(left, "delivered answer")]
        else:
            candidates = [
                msg for msg in sorted(s["net"], key=repr)
                if msg["ok"] and (not changed or (msg["member"], msg["part"]) == changed[0])
            ]
        problem = Mismatch("no answer in the network could be delivered")
        for msg in candidates:
            moved = s["view"][msg["member"]][msg["part"]] != t["view"][msg["member"]][msg["part"]]
            try:
                return self._deliver("commit_acked", msg, moved, s, t, cores)
            except Mismatch as exc:
                problem = exc
            except IllegalTransition as exc:
                problem = Mismatch(f"{msg['member']}/{msg['part']} commit_acked raised: {exc}")
        raise problem

    def _commit_failed(self, action: str, s: State, t: State, cores: Cores) -> Cores:
        msg = _one(_left(s, t, "net"), "failed answer")
        sv = s["view"][msg["member"]][msg["part"]]
        current = bool(sv["held"]) and sv["epoch"] == msg["epoch"]
        return self._deliver("commit_failed", msg, current, s, t, cores)

    def _deliver(
        self, name: str, msg: Mapping[str, Any], taken: bool, s: State, t: State, cores: Cores
    ) -> Cores:
        """An answer ``msg`` reaches its member's core (``commit_acked`` or
        ``commit_failed``), which must take it exactly when the model does."""
        m, p = msg["member"], msg["part"]
        cores, member = self._copy(cores, m)
        ok = getattr(member.core, name)(
            topic_partition(p), self._epoch(member, p, msg["epoch"]), msg["off"]
        )
        if ok is not taken:
            raise Mismatch(
                f"{m}/{p} {name}({msg['off']}) of epoch {msg['epoch']} returned {ok!r}, "
                f"the model {'takes' if taken else 'ignores'} it"
            )
        return self._settle(s, t, cores, m)

    # -- refusals --------------------------------------------------------------------------

    def _sources(self) -> dict[str, frozenset[str]]:
        """Per lifecycle action, the spec states its offset is in before every
        edge of the graph that moves it (the action's source states)."""
        found: dict[str, set[str]] = {}
        for src, action, dst in self.graph.edges:
            if action not in LIFECYCLE:
                continue
            s, t = self.graph.states[src], self.graph.states[dst]
            changed = _changed_views(s, t)
            if not changed:
                continue  # a late completion: the view does not move
            m, p = changed[0]
            for o in self.offsets:
                if s["view"][m][p]["st"][o] != t["view"][m][p]["st"][o]:
                    found.setdefault(action, set()).add(s["view"][m][p]["st"][o])
        return {a: frozenset(states) for a, states in found.items()}

    def _commits_from(self, ident: int) -> set[tuple[str, str]]:
        s = self.graph.states[ident]
        out: set[tuple[str, str]] = set()
        for action, dst in self.out.get(ident, []):
            if action == "CommitRequested":
                out.update(_changed_views(s, self.graph.states[dst]))
        return out

    def _refusals(self, ident: int, cores: Cores) -> None:
        s = self.graph.states[ident]
        committing = self._commits_from(ident)
        for m in self.members:
            for p in self.partitions:
                sv = s["view"][m][p]
                if not sv["held"]:
                    continue
                key = (m, p, cores[m], (m, p) in committing)
                if key in self._refused:
                    continue
                self._refusals_of(self._member(cores, m), m, p, sv, (m, p) in committing)
                self._refused.add(key)

    def _refusals_of(self, member: Member, m: str, p: str, sv: Mapping[str, Any],
                     may_commit: bool) -> None:
        probe = member
        core = probe.core
        before = pickle.dumps(core, protocol=pickle.HIGHEST_PROTOCOL)
        tp = topic_partition(p)
        current = self._epoch(probe, p, sv["epoch"])

        def unchanged(what: str) -> None:
            self.refusals += 1
            now = pickle.dumps(core, protocol=pickle.HIGHEST_PROTOCOL)
            # Bytes differ also when only a dict's order changed: compare then
            # order-insensitively.
            if now != before and _fingerprint(core) != _fingerprint(pickle.loads(before)):
                raise Mismatch(f"{m}/{p} {what} changed the core, the model cannot take it")

        def refused(what: str, call: Callable[[], object]) -> None:
            try:
                result = call()
            except IllegalTransition:
                unchanged(what)
                return
            raise Mismatch(f"{m}/{p} {what} returned {result!r}, the model cannot take it")

        st = {o: sv["st"].get(o, "None") for o in self.probe_offsets}
        for action, (single, batch) in LIFECYCLE.items():
            sources = self.sources.get(action)
            if sources is None:
                continue
            good = [o for o in self.offsets if st[o] in sources]
            for o in self.probe_offsets:
                if st[o] in sources:
                    continue
                refused(f"{single}({o}) on {st[o]}", _call(core, single, tp, current, o))
                if batch is not None:
                    refused(f"{batch}([{o}]) on {st[o]}", _call(core, batch, tp, current, [o]))
                    for g in good:
                        refused(
                            f"{batch}([{g}, {o}]) with {o} {st[o]}",
                            _call(core, batch, tp, current, [g, o]),
                        )
            if batch is not None:
                for g in good:
                    refused(f"{batch}([{g}, {g}])", _call(core, batch, tp, current, [g, g]))
        for stale in [0, *probe.history.others(current)]:
            for single, batch in LIFECYCLE.values():
                for o in self.probe_offsets:
                    for name, arg in ((single, o), (batch, [o])):
                        if name is None:
                            continue
                        try:
                            result = _call(core, name, tp, stale, arg)()
                        except Exception as exc:
                            raise Mismatch(
                                f"{m}/{p} {name}({arg}) with stale epoch {stale}: {_raised(exc)}"
                            ) from None
                        if result not in (False, None):
                            raise Mismatch(
                                f"{m}/{p} {name}({arg}) with stale epoch {stale} returned "
                                f"{result!r}: a late event taken"
                            )
                        unchanged(f"{name}({arg}) with stale epoch {stale}")
            for name in ("commit_acked", "commit_failed"):
                result = getattr(core, name)(tp, stale, sv["next"])
                if result is not False:
                    raise Mismatch(f"{m}/{p} {name} with stale epoch {stale} returned {result!r}")
                unchanged(f"{name} with stale epoch {stale}")
            late = core.fetched(tp, stale, [sv["next"]], sv["next"] + 1)
            if list(late):
                raise Mismatch(f"{m}/{p} fetched with stale epoch {stale} handed out {list(late)}")
            unchanged(f"fetched with stale epoch {stale}")
        processed = spec_view(sv)["processed"]
        for off in range(processed + 1, sv["next"] + 2):
            refused(
                f"commit_acked({off}) above the watermark {processed}",
                _call(core, "commit_acked", tp, current, off),
            )
        if not may_commit:
            commit = core.commit_requested(tp)
            if commit is not None:
                raise Mismatch(
                    f"{m}/{p} commit_requested hands out {_commit_text(commit)}, "
                    "the model has no commit to make"
                )
            unchanged("commit_requested with nothing due")


# -- helpers ---------------------------------------------------------------------------------


def _raised(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"the core raised {type(exc).__name__}: {text[0] if text else ''}"


def _call(core: ConsumerCore, name: str, tp: Any, epoch: int, arg: Any) -> Callable[[], object]:
    if name == "failed":
        return lambda: core.failed(tp, epoch, arg, FailureKind.UNKNOWN, _NOW, _JITTER)
    method = getattr(core, name)
    return lambda: method(tp, epoch, arg)


def _has_answer(net: Iterable[Mapping[str, Any]], answer: Mapping[str, Any], *, ok: bool) -> bool:
    return any(dict(msg) == {**answer, "ok": ok} for msg in net)


def _commit_text(commit: Commit) -> str:
    return f"offset {commit.offset} above {list(commit.finished_above)} (epoch {commit.epoch})"


def _expected_failure(taken: bool, to: str, attempts: int, kind: FailureKind) -> str:
    if not taken:
        return "nothing (late)"
    if to == "Retrying":
        return f"retry, attempt {attempts}"
    return f"dead letter after {attempts} attempts (permanent={kind is FailureKind.PERMANENT})"


def _decision_text(decision: object, epoch: int) -> str:
    if decision is None:
        return "nothing (late)"
    if not isinstance(decision, RetryAt | DeadLetter):
        return f"an unexpected {type(decision).__name__}"
    if decision.epoch != epoch:
        return f"a decision of epoch {decision.epoch}, not {epoch}"
    if isinstance(decision, RetryAt):
        return f"retry, attempt {decision.attempt}"
    return f"dead letter after {decision.attempts} attempts (permanent={decision.permanent})"


def _moved(s: State, t: State, m: str) -> bool:
    """Whether member ``m``'s view, handlers or liveness differ between the states."""
    a, b = s["view"][m], t["view"][m]
    if a is not b and a != b:
        return True
    a, b = s["work"][m], t["work"][m]
    return (a is not b and a != b) or ((m in s["down"]) != (m in t["down"]))


def _freeze(cores: Cores) -> Cores:
    return {
        m: pickle.dumps(c, protocol=pickle.HIGHEST_PROTOCOL) if isinstance(c, Member) else c
        for m, c in cores.items()
    }


def _normal(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted(((repr(k), _normal(v)) for k, v in value.items())))
    if isinstance(value, set | frozenset):
        return tuple(sorted(repr(v) for v in value))
    if isinstance(value, list | tuple | deque):
        return tuple(_normal(v) for v in value)
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return (type(value).__name__, _normal(vars(value)))
    return repr(value)


def _fingerprint(core: ConsumerCore) -> Any:
    """The core's whole state, insensitive to dict and set order."""
    return _normal(vars(core))


# -- entry points ----------------------------------------------------------------------------


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "[" + ", ".join(f"{k} |-> {_show(v)}" for k, v in value.items()) + "]"
    if isinstance(value, frozenset):
        return "{" + ", ".join(sorted(_show(v) for v in value)) + "}"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    return str(value)


def _changes(before: Any, after: Any, name: str) -> list[str]:
    if before == after:
        return []
    if isinstance(before, dict) and isinstance(after, dict) and set(before) == set(after):
        return [line for k in before for line in _changes(before[k], after[k], f"{name}.{k}")]
    return [f"{name} = {_show(after)}"]


def explain(graph: StateGraph, path: Sequence[tuple[str, int]]) -> list[str]:
    """The model's way to a state, step by step: the action and the variables
    it changed (the first state in full)."""
    lines: list[str] = []
    previous: State | None = None
    for number, (action, ident) in enumerate(path):
        state = graph.states[ident]
        lines.append(f"{number}: {action or 'initial state'} -> state {ident}")
        for name in sorted(state):
            old = previous[name] if previous is not None else None
            for line in (_changes(old, state[name], name) if previous else
                         [f"{name} = {_show(state[name])}"]):
                lines.append(f"    {line}")
        previous = state
    return lines


def replay_graph(graph: StateGraph, *, cached: bool = False) -> ReplayStats:
    """Replay one loaded graph.

    :raises Mismatch: the first disagreement (with its :func:`explain`).
    """
    started = time.perf_counter()
    replay = Replay(graph)
    try:
        refusals = replay.run()
    except Mismatch as exc:
        exc.explanation = explain(graph, exc.path)
        raise
    return ReplayStats(
        graph.model, len(graph.states), len(graph.edges), refusals,
        round(time.perf_counter() - started, 2), cached,
    )


def replay_model(entry: Mapping[str, Any], *, refresh: bool = False) -> ReplayStats:
    """Load (or have TLC dump) one manifest entry's graph and replay it.

    :raises Mismatch: the first disagreement.
    :raises RuntimeFailure: TLC could not produce the graph.
    """
    graph, cached = load_graph(
        entry["name"], entry["module"], entry["config"], keep=VARIABLES, refresh=refresh
    )
    return replay_graph(graph, cached=cached)


def replay_entries(config: str, models: Sequence[str] = (), manifest: Path = MANIFEST) -> list[
    dict[str, Any]
]:
    """The manifest entries of size ``config`` marked for replay (or those named).

    :raises UsageError: no such size or model.
    """
    try:
        entries = json.loads(manifest.read_text())["models"]
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"cannot read {manifest}: {exc}", "run from the repository root") from None
    chosen = [e for e in entries if e["size"] == config and e.get("replay")]
    if models:
        known = {e["name"] for e in chosen}
        unknown = sorted(set(models) - known)
        if unknown:
            raise UsageError(
                f"no {config} replay model named {', '.join(unknown)}",
                f"choose from {', '.join(sorted(known)) or '(none)'}",
            )
        chosen = [e for e in chosen if e["name"] in models]
    if not chosen:
        sizes = sorted({e["size"] for e in entries if e.get("replay")})
        raise UsageError(f"no replay models of size {config!r}", f"choose from {', '.join(sizes)}")
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see module docs); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m model_checks.graph_replay",
        description="Replay the TLA+ models' state graphs through htmqc.core.",
    )
    parser.add_argument("--config", default="small", help="model size from tla/manifest.json")
    parser.add_argument("--model", action="append", default=[], help="replay only this model")
    parser.add_argument("--refresh", action="store_true", help="dump the graphs again with TLC")
    parser.add_argument(
        "--explain", action="store_true", help="on a mismatch, print the model's way there"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        entries = replay_entries(args.config, args.model)
        totals = [0, 0]
        for entry in entries:
            try:
                stats = replay_model(entry, refresh=args.refresh)
            except Mismatch as exc:
                print(f"graph_replay: MISMATCH {entry['name']}: {exc}")
                if args.explain:
                    print("\n".join(exc.explanation))
                return 1
            totals[0] += stats.states
            totals[1] += stats.edges
            print(
                f"{stats.model}: {stats.states:,} states, {stats.edges:,} edges, "
                f"{stats.refusals:,} refusals, {stats.seconds:.1f} s"
                + (" (graph cached)" if stats.cached else " (graph dumped by TLC)"),
                flush=True,
            )
    except HtmqcError as exc:
        print(f"graph_replay: error: {exc.line()}", file=sys.stderr)
        return exc.exit_code
    print(
        f"graph_replay: {len(entries)} models, {totals[0]:,} states, {totals[1]:,} edges "
        f"checked, {time.perf_counter() - started:.1f} s: the core refines the model"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
