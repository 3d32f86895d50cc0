"""The fault schedule of a chaos run: a pure function of the seed and the run's shape.

:func:`build_schedule` draws everything from one ``random.Random(seed)``, in a
fixed order, so the same ``(seed, faults, consumers, messages, kinds,
session_timeout_s)`` always gives the same list of :class:`Fault` s (a test
pins this). What is *not* reproducible is the exact instant a fault lands on
a running process: a fault fires when the fraction ``at`` of the messages has
been stored (and its target is free), which depends on timing.

Kinds, grouped in families; fault ``i`` takes family ``i mod 4`` (process,
network, sink, handler; families with no allowed kind are skipped), so any
four consecutive faults cover every allowed family:

=================  ==============================================================
``kill``           SIGKILL consumer ``consumer``; restart it ``seconds`` later
``zombie``         SIGSTOP it for ``seconds`` (past the session timeout), then SIGCONT
``net-drop``       blackhole its connections (or everyone's: ``consumer`` None)
``net-delay``      add ``delay_ms`` to every chunk, for ``seconds``
``net-half-close`` half-close its connections (and new ones), for ``seconds``
``net-reset``      reset its connections (and new ones), for ``seconds``
``sink-slow``      every handler call sleeps ``delay_ms`` first, for ``seconds``
``sink-error``     the first attempt of a ``rate`` share of messages fails in the
                   database (a failing statement), for ``seconds``
``handler-error``  the first attempt of a ``rate`` share of messages raises, for
                   ``seconds``
``poison``         the messages ``ids`` always fail (they end in the dead-letter
                   table); in force from the start
=================  ==============================================================

Sink and handler faults apply to every consumer (``consumer`` is None).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from htmqc.errors import UsageError

FAMILIES: tuple[tuple[str, ...], ...] = (
    ("kill", "zombie"),
    ("net-drop", "net-delay", "net-half-close", "net-reset"),
    ("sink-slow", "sink-error"),
    ("handler-error", "poison"),
)
KINDS: tuple[str, ...] = tuple(kind for family in FAMILIES for kind in family)
PROCESS_KINDS = frozenset(FAMILIES[0])
NETWORK_KINDS = frozenset(FAMILIES[1])
SWITCH_KINDS = frozenset({"sink-slow", "sink-error", "handler-error"})
#: Faults fire when this share of the messages is stored: not at the very start
#: (the group is still forming) and not at the very end (nothing left to hit).
FIRST_AT, LAST_AT = 0.05, 0.85


@dataclass(frozen=True, slots=True)
class Fault:
    """One scheduled fault (fields by kind: see module docs)."""

    index: int
    kind: str
    at: float
    seconds: float
    consumer: int | None = None
    delay_ms: float = 0.0
    rate: float = 0.0
    ids: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        out = asdict(self)
        out["ids"] = list(self.ids)
        return out

    def describe(self) -> str:
        """One short line for people."""
        who = "all" if self.consumer is None else f"c{self.consumer}"
        extra = ""
        if self.delay_ms:
            extra += f" {self.delay_ms:g} ms"
        if self.rate:
            extra += f" rate {self.rate:.2f}"
        if self.ids:
            return f"#{self.index} poison ids {list(self.ids)}"
        return f"#{self.index} {self.kind} {who} at {self.at:.0%} for {self.seconds:.1f} s{extra}"


def parse_kinds(text: str | None) -> tuple[str, ...]:
    """``"kill,net-drop"`` -> the kinds; ``None`` or ``"all"`` -> :data:`KINDS`.

    :raises UsageError: an unknown kind.
    """
    if text is None or text.strip() in ("", "all"):
        return KINDS
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise UsageError(f"unknown fault kind(s) {unknown}", f"use some of {', '.join(KINDS)}")
    return kinds


def build_schedule(
    seed: int,
    faults: int,
    *,
    consumers: int,
    messages: int,
    kinds: Sequence[str] = KINDS,
    session_timeout_s: float = 6.0,
) -> list[Fault]:
    """The schedule (see module docs), sorted by ``at`` then index.

    :raises UsageError: negative ``faults``, no consumers or messages, or no
        kind allowed.
    """
    if faults < 0:
        raise UsageError(f"--faults must not be negative, got {faults}", "pass 0 or more")
    if consumers < 1 or messages < 1:
        raise UsageError("a chaos run needs at least one consumer and one message", "raise them")
    allowed = [tuple(k for k in family if k in kinds) for family in FAMILIES]
    families = [f for f in allowed if f]
    if faults and not families:
        raise UsageError("no fault kind allowed", f"pass some of {', '.join(KINDS)}")
    rng = random.Random(seed)
    out: list[Fault] = []
    for i in range(faults):
        kind = rng.choice(families[i % len(families)])
        at = round(rng.uniform(FIRST_AT, LAST_AT), 4)
        target = rng.randrange(consumers)
        spread = rng.random()
        if kind == "kill":
            fault = Fault(i, kind, at, round(0.2 + 2.0 * spread, 2), consumer=target)
        elif kind == "zombie":
            fault = Fault(i, kind, at, round(session_timeout_s + 2 + 3 * spread, 2), target)
        elif kind in NETWORK_KINDS:
            who = None if rng.random() < 0.25 else target
            seconds = round(1.0 + 9.0 * spread, 2)  # some outlast the session timeout
            delay = round(rng.uniform(20, 300), 1) if kind == "net-delay" else 0.0
            fault = Fault(i, kind, at, seconds, who, delay_ms=delay)
        elif kind == "sink-slow":
            delay = round(rng.uniform(1, 20), 1)
            fault = Fault(i, kind, at, round(2 + 4 * spread, 2), delay_ms=delay)
        elif kind in ("sink-error", "handler-error"):
            rate = round(rng.uniform(0.02, 0.2), 3)
            fault = Fault(i, kind, at, round(2 + 4 * spread, 2), rate=rate)
        else:  # poison
            ids = tuple(sorted(rng.sample(range(messages), min(messages, rng.randint(1, 3)))))
            fault = Fault(i, kind, 0.0, 0.0, ids=ids)
        out.append(fault)
    return sorted(out, key=lambda f: (f.at, f.index))
