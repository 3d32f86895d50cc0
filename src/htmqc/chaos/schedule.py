"""The fault schedule of a chaos run: a pure function of the seed and the run's shape.

:func:`build_schedule` draws everything from one ``random.Random(seed)``, in a
fixed order, so the same ``(seed, faults, consumers, messages, kinds,
session_timeout_s, partitions, nodes, broker_session_s)`` always gives the
same list of :class:`Fault` s (a test pins this). What is *not* reproducible
is the exact instant a fault lands on a running process: a fault fires when
the fraction ``at`` of the messages has been stored (and its target is free),
which depends on timing; which broker a role names (the leader of a
partition, the active controller, a coordinator) is looked up when the fault
fires.

Consumer kinds, grouped in families; fault ``i`` takes family ``i mod 4``
(process, network, sink, handler; families with no allowed kind are skipped),
so any four consecutive faults cover every allowed family:

=================  ==============================================================
``kill``           SIGKILL consumer ``consumer``; restart it ``seconds`` later
``zombie``         SIGSTOP it for ``seconds`` (past the session timeout), then SIGCONT
``net-drop``       blackhole its connections (or everyone's: ``consumer`` None)
``net-delay``      add ``delay_ms`` to every chunk, for ``seconds``
``net-half-close`` half-close its connections (and new ones), for ``seconds``
``net-reset``      reset its connections (and new ones), for ``seconds``
``sink-slow``      every handler call sleeps ``delay_ms`` first, for ``seconds``
``sink-error``     the first attempt of a ``rate`` share of messages fails in the
                   sink (a failing statement; Kafka: an output record the broker
                   refuses, which aborts the transaction), for ``seconds``
``handler-error``  the first attempt of a ``rate`` share of messages raises, for
                   ``seconds``
``poison``         the messages ``ids`` always fail (they end in the dead-letter
                   table); in force from the start
=================  ==============================================================

Sink and handler faults apply to every consumer (``consumer`` is None).

Broker kinds (a Kafka cluster, :data:`BROKER_KINDS`; their Jepsen names in
:data:`JEPSEN`). When any is allowed, every even-numbered fault (0, 2, 4...)
is a broker fault and fault ``2j+1`` takes consumer family ``j mod 4``, so
half of the faults hit the brokers. The broker faults take the allowed broker
kinds in a rotation whose order is drawn first, so ``n`` broker faults cover
``min(n, kinds)`` kinds. At most one broker fault runs at a time, and it ends
only once every replica is back in sync:

==========================  =====================================================
``broker-kill-leader``      SIGKILL the leader of input partition ``partition``;
                            restart it ``seconds`` later
``broker-kill-controller``  SIGKILL the active controller (the KRaft quorum
                            leader); restart it ``seconds`` later
``broker-kill-coordinator`` SIGKILL a coordinator: with a Kafka sink in the
                            run, the transaction coordinator of the
                            transactional id of that pipeline's consumer
                            ``consumer`` mod its size; else the coordinator of
                            consumer ``consumer``'s group; restart it
                            ``seconds`` later
``broker-pause``            SIGSTOP broker ``node`` for ``seconds`` (past the
                            broker session timeout), then SIGCONT
``broker-isolate``          cut broker ``node`` off from clients *and* the other
                            brokers and controllers (every listener blackholed
                            through the proxies), for ``seconds``
``broker-partition-clients`` cut broker ``node`` off from the clients only (the
                            cluster still sees it healthy), for ``seconds``
``broker-rolling-restart``  stop (SIGTERM: a controlled shutdown) and start every
                            broker in turn, each once the previous one is back
                            in sync
==========================  =====================================================
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
CONSUMER_KINDS: tuple[str, ...] = tuple(kind for family in FAMILIES for kind in family)
BROKER_KINDS: tuple[str, ...] = (
    "broker-kill-leader",
    "broker-kill-controller",
    "broker-kill-coordinator",
    "broker-pause",
    "broker-isolate",
    "broker-partition-clients",
    "broker-rolling-restart",
)
KINDS: tuple[str, ...] = CONSUMER_KINDS + BROKER_KINDS
#: Each kind in the vocabulary of Jepsen's nemeses (``kill``, ``pause``,
#: ``partition`` with a target; jepsen.nemesis.combined), for the report.
JEPSEN: dict[str, str] = {
    "kill": "kill :client",
    "zombie": "pause :client (past the session)",
    "net-drop": "partition :client (blackhole)",
    "net-delay": "slow :client",
    "net-half-close": "partition :client (half-open TCP)",
    "net-reset": "partition :client (TCP reset)",
    "sink-slow": "slow :sink",
    "sink-error": "fail :sink (transient)",
    "handler-error": "fail :handler (transient)",
    "poison": "poison messages",
    "broker-kill-leader": "kill :primaries (one partition's leader), then restart",
    "broker-kill-controller": "kill :controller (KRaft quorum leader), then restart",
    "broker-kill-coordinator": "kill :coordinator (transaction or group), then restart",
    "broker-pause": "pause :one (SIGSTOP past broker.session.timeout.ms), then resume",
    "broker-isolate": "partition :one (isolated from clients, brokers and controllers)",
    "broker-partition-clients": "partition :one from the clients (cluster links intact)",
    "broker-rolling-restart": "restart :all, one at a time (rolling restart)",
}
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
    node: int | None = None
    partition: int | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        out = asdict(self)
        out["ids"] = list(self.ids)
        return out

    def describe(self) -> str:
        """One short line for people."""
        who = "all" if self.consumer is None else f"c{self.consumer}"
        if self.node is not None:
            who = f"broker {self.node}"
        elif self.partition is not None:
            who = f"leader of partition {self.partition}"
        elif self.kind == "broker-kill-controller":
            who = "the active controller"
        elif self.kind == "broker-kill-coordinator":
            who = f"the coordinator of c{self.consumer}"
        elif self.kind == "broker-rolling-restart":
            return f"#{self.index} {self.kind} at {self.at:.0%}"
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
    kinds: Sequence[str] = CONSUMER_KINDS,
    session_timeout_s: float = 6.0,
    partitions: int = 1,
    nodes: int = 3,
    broker_session_s: float = 9.0,
) -> list[Fault]:
    """The schedule (see module docs), sorted by ``at`` then index.

    ``partitions`` and ``nodes`` (broker ids ``1..nodes``) bound the broker
    faults' targets; ``broker_session_s`` is the brokers'
    ``broker.session.timeout.ms`` in seconds (a paused broker stays paused
    longer). Without a broker kind in ``kinds`` they change nothing.

    :raises UsageError: negative ``faults``, no consumers or messages, or no
        kind allowed.
    """
    if faults < 0:
        raise UsageError(f"--faults must not be negative, got {faults}", "pass 0 or more")
    if consumers < 1 or messages < 1:
        raise UsageError("a chaos run needs at least one consumer and one message", "raise them")
    allowed = [tuple(k for k in family if k in kinds) for family in FAMILIES]
    families = [f for f in allowed if f]
    broker = tuple(k for k in BROKER_KINDS if k in kinds)
    if faults and not families and not broker:
        raise UsageError("no fault kind allowed", f"pass some of {', '.join(KINDS)}")
    rng = random.Random(seed)
    rotation = rng.sample(broker, len(broker)) if broker else []
    out: list[Fault] = []
    for i in range(faults):
        if broker and (not families or i % 2 == 0):
            kind = rotation[sum(1 for f in out if f.kind in BROKER_KINDS) % len(rotation)]
        elif broker:
            kind = rng.choice(families[(i // 2) % len(families)])
        else:
            kind = rng.choice(families[i % len(families)])
        at = round(rng.uniform(FIRST_AT, LAST_AT), 4)
        target = rng.randrange(consumers)
        spread = rng.random()
        if kind in BROKER_KINDS:
            fault = _broker_fault(
                rng, i, kind, at, target, spread, partitions, nodes, broker_session_s
            )
        elif kind == "kill":
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


def _broker_fault(
    rng: random.Random,
    index: int,
    kind: str,
    at: float,
    target: int,
    spread: float,
    partitions: int,
    nodes: int,
    broker_session_s: float,
) -> Fault:
    """One broker fault (see module docs); draws after the common four."""
    down = round(1.0 + 4.0 * spread, 2)  # a killed broker's downtime before its restart
    if kind == "broker-kill-leader":
        return Fault(index, kind, at, down, partition=rng.randrange(max(1, partitions)))
    if kind == "broker-kill-controller":
        return Fault(index, kind, at, down)
    if kind == "broker-kill-coordinator":
        return Fault(index, kind, at, down, consumer=target)
    if kind == "broker-rolling-restart":
        return Fault(index, kind, at, 0.0)
    node = rng.randrange(max(1, nodes)) + 1
    if kind == "broker-pause":
        seconds = broker_session_s + 2.0 + 3.0 * spread
    elif kind == "broker-isolate":
        seconds = 3.0 + 12.0 * spread  # some within the broker session, some past it
    else:  # broker-partition-clients
        seconds = 2.0 + 8.0 * spread
    return Fault(index, kind, at, round(seconds, 2), node=node)
