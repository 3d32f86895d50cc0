"""The proxies in front of a three-node cluster see every link between the nodes,
and tell whose it is: each identified connection at a node's internal or
controller proxy carries a client id of exactly one *other* node's
:func:`~htmqc.chaos.cluster.outbound_ids` (or the node's own, for its links to
itself). ``broker-isolate`` blackholes by these ids, so a Kafka release that
renames its clients shows up here rather than as an isolation that isolates
nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from htmqc.chaos.cluster import ClusterFront, outbound_ids
from htmqc.errors import HtmqcError
from htmqc.kafka_cluster import KafkaCluster, java_binary, kafka_libs, start_kafka
from htmqc.produce import produce
from tests.services import missing

pytestmark = [pytest.mark.broker, pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture
def fronted(tmp_path: Path) -> Iterator[tuple[KafkaCluster, ClusterFront]]:
    try:
        java_binary()
        kafka_libs()
    except HtmqcError as exc:
        missing(exc.problem)
    front = ClusterFront()
    try:
        with start_kafka(3, front=front, work_dir=tmp_path / "kafka") as cluster:
            cluster.warm_up()
            yield cluster, front
    finally:
        front.stop()


def _owners(client_id: str, nodes: list[int]) -> list[int]:
    return [n for n in nodes if client_id.startswith(outbound_ids(n))]


def test_every_link_between_nodes_is_attributed(
    fronted: tuple[KafkaCluster, ClusterFront],
) -> None:
    cluster, front = fronted
    produce(cluster.bootstrap, "front", 200, partitions=3, transactional=True)
    assert cluster.wait_in_sync(60.0)
    nodes = front.nodes
    assert nodes == [1, 2, 3]
    seen: dict[int, set[str]] = {n: set() for n in nodes}
    for (node, listener), ids in front.client_ids().items():
        if listener == "client":
            continue
        for client_id in ids:
            assert client_id is not None, f"an unidentified link at node {node}'s {listener}"
            owners = _owners(client_id, nodes)
            assert len(owners) == 1, (node, listener, client_id)
            seen[owners[0]].add(client_id)
    for node in nodes:
        assert any(c.startswith(f"raft-client-{node}") for c in seen[node]), seen[node]
        assert any(c.startswith(f"broker-{node}-fetcher") for c in seen[node]), seen[node]
