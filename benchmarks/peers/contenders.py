"""The contender slots: which module and mode, what the tables call them.

A :class:`Slot` names one measured configuration; ``count_cap`` bounds the
messages a slow loop reads (the naive loop makes one broker round trip per
message, so a million would take minutes); ``baseline`` slots run an older
htmqc (:data:`BASELINE_ENV`) beside this one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    """One contender configuration."""

    key: str  # stable id used in peers.json
    module: str  # module in benchmarks.peers
    mode: str
    label: str  # for tables and charts
    count_cap: int | None = None  # slow loops read fewer messages
    baseline: bool = False  # htmqc imported from $HTMQC_PEERS_BASELINE (module docs)


SLOTS: tuple[Slot, ...] = (
    Slot("raw", "raw", "raw", "raw confluent-kafka loop (async commit per batch)"),
    Slot("naive", "raw", "naive", "naive loop (sync commit per message)", count_cap=20_000),
    Slot("aiokafka", "aio", "at-least-once", "aiokafka 0.14 (commit per batch)"),
    Slot("quix_alo", "quix", "at-least-once", "Quix Streams 3.28 at-least-once"),
    Slot("quix_eo", "quix", "exactly-once", "Quix Streams 3.28 exactly-once (no output)"),
    Slot("quix_kk", "quix", "exactly-once-kafka", "Quix Streams 3.28 exactly-once Kafka→Kafka"),
    Slot("faust", "faust_peer", "at-least-once", "faust-streaming 0.15 at-least-once"),
    Slot("htmqc_alo", "htmqc_peer", "at-least-once", "htmqc at-least-once"),
    Slot("htmqc_eo", "htmqc_peer", "exactly-once", "htmqc exactly-once into SQLite"),
    Slot("htmqc_alo_ll", "htmqc_peer", "at-least-once+low-latency",
         "htmqc at-least-once, --profile low-latency"),
    Slot("htmqc_eo_ll", "htmqc_peer", "exactly-once+low-latency",
         "htmqc exactly-once into SQLite, --profile low-latency"),
    Slot("htmqc_kk", "htmqc_peer", "exactly-once-kafka", "htmqc exactly-once Kafka→Kafka"),
    Slot("base_alo", "htmqc_peer", "at-least-once", "baseline htmqc at-least-once",
         baseline=True),
    Slot("base_eo", "htmqc_peer", "exactly-once", "baseline htmqc exactly-once into SQLite",
         baseline=True),
    Slot("base_kk", "htmqc_peer", "exactly-once-kafka",
         "baseline htmqc exactly-once Kafka→Kafka", baseline=True),
)
#: The ``src`` folder of an exported older htmqc that the ``base_*`` slots import
#: instead of this checkout's (``git archive COMMIT src | tar -x -C DIR``; then
#: ``HTMQC_PEERS_BASELINE=DIR/src``): this tree's harness drives that tree's
#: ``htmqc run``, so a change's cost is measured against its parent in one run.
BASELINE_ENV = "HTMQC_PEERS_BASELINE"
BY_KEY = {slot.key: slot for slot in SLOTS}
