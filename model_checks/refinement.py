"""The refinement mapping from ``htmqc.core`` to ``tla/Consumer.tla``, as code.

``spec/refinement.md`` describes this module; where the two disagree, this
module is what :mod:`model_checks.graph_replay` checks.

What is mapped
--------------
One :class:`~htmqc.core.ConsumerCore` per group member stands for that
member's ``view[m]`` (its PartitionTracker per partition). The rest of the
spec's state (``owner``, ``epoch``, ``fence``, ``down``, ``work``, ``net``,
``durable``, ``durableAbove``, ``effects``, ``dead``) is the environment:
coordinator, sink, network, running handlers. It has no counterpart in the
core and is taken from the model as it is.

Names. Spec partition ``p`` is the topic-partition ``(p, 0)``
(:func:`topic_partition`).

Epochs. The spec's ``epoch[p]`` counts assignments of ``p`` group-wide; the
core's epoch counts assignments in one process (``ConsumerCore._last_epoch``).
They are different numbers for the same event, so the mapping carries a
*history variable*, :class:`EpochHistory`: when ``assign``/``restored``
returns core epoch ``c`` for the assignment the spec numbers ``e``, it
records ``c -> (p, e)``. A view's ``epoch`` is then ``history[core.epoch(tp)]``
and an event the spec tags with ``(p, e)`` is passed to the core with the
``c`` recorded for it. A core epoch handed out twice makes the mapping
ill-defined, which :meth:`EpochHistory.record` reports as a mismatch (an
assignment that does not get a fresh epoch).

The abstraction of a view
-------------------------
:func:`core_view` maps a core to the record :func:`spec_view` makes of a
spec view; the two are compared field by field:

==============  =================================  =================================
field           core (``PartitionTracker`` t)      spec (``view[m][p]`` v)
==============  =================================  =================================
``held``        ``core.epoch(tp) is not None``     ``v.held``
``epoch``       history of ``core.epoch(tp)``      ``v.epoch``
``next``        ``t.next``                         ``v.next``
``processed``   ``t.processed``                    ``Processed(v)``: the smallest
                                                   Live offset, else ``v.next``
``committed``   ``t.committed``                    ``v.committed``
``requested``   ``t.requested``                    ``v.requested``
``unsent``      ``t._unsent``                      ``v.unsent``
``st[o]``       ``t.state_of(o).value`` if live;   ``v.st[o]`` if Live; else
                else ``Finished`` below ``next``,  ``Finished`` below ``v.next``
                ``None`` from ``next`` on          (Succeeded, DeadLettered and
                                                   gaps alike), ``None`` above
``fails[o]``    ``t.failures(o)``, live offsets    ``v.fails[o]``, Live offsets
``skip``        ``t._skip``                        ``v.skip``
==============  =================================  =================================

Not mapped: the spec's ``token`` (the runtime keeps the fence token it got
from ``Sink.claim``, not the core) and ``pending`` (effects in the open sink
transaction). The core forgets how a finished offset finished and does not
tell a gap from a finished offset; the spec remembers (for its properties),
so both sides are compared after merging those into ``Finished``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from htmqc.core import ConsumerCore, PartitionTracker, TopicPartition

#: The spec's lifecycle states in which an offset holds back the watermark.
LIVE = frozenset({"Pending", "Processing", "Failed", "Retrying"})
#: An offset below ``next`` that is not live (succeeded, dead-lettered, a gap).
FINISHED = "Finished"
#: An offset not fetched yet.
UNFETCHED = "None"

View = dict[str, Any]


class MappingError(Exception):
    """The mapping is not defined for this core state (e.g. a reused epoch)."""


def topic_partition(partition: str) -> TopicPartition:
    """The core's name of spec partition ``partition``."""
    return (partition, 0)


class EpochHistory:
    """Core epoch -> ``(partition, spec epoch)`` of one member (see module docs)."""

    def __init__(self) -> None:
        self._spec: dict[int, tuple[str, int]] = {}
        self._core: dict[tuple[str, int], int] = {}

    def record(self, core_epoch: int, partition: str, spec_epoch: int) -> None:
        """The core answered an assignment the spec numbers ``spec_epoch`` with
        ``core_epoch``.

        :raises MappingError: ``core_epoch`` was handed out before.
        """
        if core_epoch in self._spec:
            old = self._spec[core_epoch]
            raise MappingError(
                f"core epoch {core_epoch} handed out again (it was {old[0]}'s epoch {old[1]})"
            )
        self._spec[core_epoch] = (partition, spec_epoch)
        self._core[(partition, spec_epoch)] = core_epoch

    def spec(self, core_epoch: int | None) -> tuple[str, int] | None:
        """``(partition, spec epoch)`` of a core epoch, ``None`` if unknown."""
        return None if core_epoch is None else self._spec.get(core_epoch)

    def core(self, partition: str, spec_epoch: int) -> int | None:
        """The core epoch of the spec's assignment ``(partition, spec_epoch)``."""
        return self._core.get((partition, spec_epoch))

    def others(self, current: int | None) -> list[int]:
        """Every core epoch handed out so far except ``current``: all stale."""
        return [c for c in self._spec if c != current]


def offset_class(state: str, offset: int, next_offset: int) -> str:
    """The abstraction of one offset's spec state (see module docs)."""
    if state in LIVE:
        return state
    return FINISHED if offset < next_offset else UNFETCHED


def spec_view(v: Mapping[str, Any]) -> View:
    """The abstraction of a spec view ``view[m][p]`` (see module docs)."""
    if not v["held"]:
        return {"held": False}
    nxt = v["next"]
    st = {o: offset_class(s, o, nxt) for o, s in v["st"].items()}
    live = [o for o, s in st.items() if s in LIVE]
    return {
        "held": True,
        "epoch": v["epoch"],
        "next": nxt,
        "processed": min(live) if live else nxt,
        "committed": v["committed"],
        "requested": v["requested"],
        "unsent": v["unsent"],
        "st": st,
        "fails": {o: v["fails"][o] for o in live},
        "skip": frozenset(v["skip"]),
    }


def tracker_fields(t: PartitionTracker, offsets: Iterable[int]) -> View:
    """The tracker's part of :func:`core_view` (no epoch)."""
    nxt = t.next
    st: dict[int, str] = {}
    fails: dict[int, int] = {}
    for o in offsets:
        state = t.state_of(o)
        if state is not None:
            st[o] = state.value
            fails[o] = t.failures(o)
        else:
            st[o] = FINISHED if o < nxt else UNFETCHED
    return {
        "held": True,
        "next": nxt,
        "processed": t.processed,
        "committed": t.committed,
        "requested": t.requested,
        "unsent": t._unsent,
        "st": st,
        "fails": fails,
        "skip": frozenset(t._skip),
    }


def core_view(
    core: ConsumerCore, partition: str, history: EpochHistory, offsets: Iterable[int]
) -> View:
    """The abstraction of ``core``'s state for ``partition`` (see module docs)."""
    tp = topic_partition(partition)
    epoch = core.epoch(tp)
    if epoch is None:
        return {"held": False}
    origin = history.spec(epoch)
    if origin is None or origin[0] != partition:
        raise MappingError(f"core epoch {epoch} of {partition} was never handed out for it")
    fields = tracker_fields(core.tracker(tp), offsets)
    fields["epoch"] = origin[1]
    return fields


def difference(core: View, spec: View) -> str | None:
    """The first field where the two abstractions differ, as text, or None."""
    for name in ("held", "epoch", "next", "processed", "committed", "requested", "unsent"):
        if core.get(name) != spec.get(name):
            return f"{name}: core {core.get(name)!r} != model {spec.get(name)!r}"
    for name in ("st", "fails"):
        a, b = core.get(name, {}), spec.get(name, {})
        for o in sorted(set(a) | set(b)):
            if a.get(o) != b.get(o):
                return f"{name}[{o}]: core {a.get(o)!r} != model {b.get(o)!r}"
    if core.get("skip") != spec.get("skip"):
        return (
            f"skip: core {sorted(core.get('skip') or ())} != model {sorted(spec.get('skip') or ())}"
        )
    return None
