"""A three-node Kafka cluster with a chaos proxy in front of every listener.

Where the proxies sit
---------------------
Each node of :func:`htmqc.kafka_cluster.start_kafka` has three listeners:
clients (PLAINTEXT), the other brokers (INTERNAL: replica fetchers,
transaction markers, AddPartitionsToTxn) and the controllers (CONTROLLER: the
KRaft quorum, and every broker's channel to the active controller).
:class:`ClusterFront` is the cluster's ``front``: it starts one
:class:`~htmqc.chaos.proxy.ChaosProxy` per listener of each node and has the
cluster advertise the proxy's port, so every connection between any two
processes of the run passes a proxy: 9 proxies for 3 nodes.

Attribution
-----------
Inbound traffic of node N is what its own three proxies carry. Outbound
traffic of N is told apart at the *other* nodes' proxies by the client id of
its connections (the proxy reads it from the first request header). Kafka
4.1 uses, for node N (seen on this machine by listing the proxies' client ids
of a running cluster, ``tests/chaos/test_cluster_front_broker.py`` pins it):

====================================  ==============================================
``raft-client-N``                     N's Raft client (votes, fetches of the log)
``N``                                 N's broker to the active controller
                                      (heartbeats, AlterPartition, forwarding)
``broker-N-fetcher-K``                N's replica fetchers
``broker-N-txn-marker-sender``        N's transaction markers
``AddPartitionsManager-client-N``     N's AddPartitionsToTxn verification
====================================  ==============================================

Faults
------
Consumer faults (:meth:`ClusterFront.set` / :meth:`~ClusterFront.heal`, the
:class:`~htmqc.chaos.proxy.ChaosProxy` interface) apply to every node's
*client* proxy. :meth:`~ClusterFront.cut_clients` blackholes one node's client
proxy: the cluster still sees the node healthy, so its leaderships stay and the
clients can reach none of them. :meth:`~ClusterFront.isolate` blackholes all
three of its proxies and, at the other nodes' internal and controller
proxies, every connection that carries its client ids: the node is cut off
from clients, brokers and controllers alike (Jepsen's ``partition :one``).
Its connections to itself pass its own proxies and are cut too. Node ids must
be 1-9: the bare-id prefix ``N`` would also match ``N0``.
"""

from __future__ import annotations

from collections import Counter

from htmqc.chaos.proxy import ChaosProxy, Mode
from htmqc.kafka_cluster import HOST


def outbound_ids(node: int) -> tuple[str, ...]:
    """Client-id prefixes of the connections node ``node`` opens to other nodes."""
    return (
        f"raft-client-{node}",
        f"{node}",
        f"broker-{node}-",
        f"AddPartitionsManager-client-{node}",
    )


class ClusterFront:
    """The proxies in front of a cluster's listeners (see module docs).

    Pass the instance as ``start_kafka(front=...)``; it then knows ``nodes``.
    """

    def __init__(self) -> None:
        self.proxies: dict[tuple[int, str], ChaosProxy] = {}

    def __call__(self, node: int, listener: str, port: int) -> int:
        """The :data:`htmqc.kafka_cluster.Front` hook: a proxy in front of ``port``."""
        old = self.proxies.pop((node, listener), None)
        if old is not None:  # a start retried with fresh ports
            old.stop()
        proxy = ChaosProxy((HOST, port)).start()
        self.proxies[(node, listener)] = proxy
        return proxy.port

    @property
    def nodes(self) -> list[int]:
        return sorted({n for n, _l in self.proxies})

    def _client_proxies(self) -> list[ChaosProxy]:
        return [p for (_n, listener), p in sorted(self.proxies.items()) if listener == "client"]

    # -- consumer faults: the ChaosProxy interface over every client proxy ------------

    def set(self, mode: Mode, target: str | None = None, *, delay_ms: float = 0.0) -> None:
        """:meth:`ChaosProxy.set` on every node's client proxy."""
        for proxy in self._client_proxies():
            proxy.set(mode, target, delay_ms=delay_ms)

    def heal(self, target: str | None = None) -> None:
        """:meth:`ChaosProxy.heal` on every node's client proxy."""
        for proxy in self._client_proxies():
            proxy.heal(target)

    def stats(self) -> dict[str, int]:
        """The client proxies' counters, summed."""
        total: Counter[str] = Counter()
        for proxy in self._client_proxies():
            total.update(proxy.stats())
        return dict(total)

    # -- broker faults -----------------------------------------------------------------

    def cut_clients(self, node: int) -> None:
        """Blackhole every client connection of ``node``."""
        self.proxies[(node, "client")].set("drop")

    def isolate(self, node: int) -> None:
        """Blackhole ``node``'s listeners and its connections to the other nodes."""
        self._isolation(node, "drop")

    def rejoin(self, node: int) -> None:
        """Undo :meth:`cut_clients` and :meth:`isolate`: everything flows again."""
        self._isolation(node, "pass")

    def _isolation(self, node: int, mode: Mode) -> None:
        for (n, listener), proxy in self.proxies.items():
            if n == node:
                proxy.set(mode)
            elif listener != "client":
                for prefix in outbound_ids(node):
                    proxy.set(mode, prefix)

    def client_ids(self) -> dict[tuple[int, str], list[str | None]]:
        """The client ids of each proxy's open connections."""
        return {key: proxy.client_ids() for key, proxy in sorted(self.proxies.items())}

    def stop(self) -> None:
        """Stop every proxy (idempotent)."""
        for proxy in self.proxies.values():
            proxy.stop()
