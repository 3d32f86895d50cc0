"""``htmqc broker``: run the bundled Kafka-protocol broker in the foreground.

Listens on loopback only, prints ``bootstrap: 127.0.0.1:PORT`` once it answers
requests, and stops the broker cleanly on Ctrl-C or SIGTERM (exit code 0).
The broker keeps everything in memory: stopping it loses all topics.

``--cert FILE --key FILE`` (PEM, both or neither): the printed port accepts
only TLS; clients connect with ``security.protocol=ssl`` and
``ssl.ca.location`` set to the CA that signed the certificate. htmqc
terminates the TLS itself (the bundled Tansu 0.6.0 cannot; see
:mod:`htmqc.broker`), so the plaintext broker also listens on a second
loopback port, printed on stderr.

``--kafka [--nodes 1|3]``: Apache Kafka instead (:mod:`htmqc.kafka_cluster`,
the jars of ``make setup`` and Java 17), one combined KRaft node or a
three-node cluster (replication factor 3, ``min.insync.replicas=2``), on free
loopback ports (``--port`` fixes the single node's). It prints the same
``bootstrap:`` line (every node's address), keeps its data in a temporary
directory and deletes it on stop. Tansu stays the default.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType
from typing import Any

from htmqc.broker import start_broker
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.kafka_cluster import start_kafka


def register(subparsers: Any) -> None:
    """Add the ``broker`` subcommand."""
    parser = subparsers.add_parser(
        "broker",
        help="run the bundled Kafka-protocol broker (or Apache Kafka) on loopback",
        description=(
            "Run the bundled Kafka-protocol broker (Tansu) on 127.0.0.1 in the foreground, "
            "or Apache Kafka with --kafka. "
            "Prints 'bootstrap: HOST:PORT' when ready; Ctrl-C or SIGTERM stops it. "
            "Everything is lost on stop."
        ),
    )
    parser.add_argument(
        "--port", type=int, default=None, help="port to listen on (default: a free one)"
    )
    parser.add_argument(
        "--cert", metavar="PEM", default=None, help="TLS certificate (chain); needs --key"
    )
    parser.add_argument(
        "--key", metavar="PEM", default=None, help="TLS private key (unencrypted); needs --cert"
    )
    parser.add_argument(
        "--kafka",
        action="store_true",
        help="run Apache Kafka (KRaft, from `make setup`'s jars) instead of the bundled broker",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        choices=(1, 3),
        default=None,
        help="with --kafka: one combined node (default) or a three-node cluster",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Start the broker, print its bootstrap, wait for a signal or its exit."""
    if args.kafka:
        return run_kafka(args)
    if args.nodes is not None:
        raise UsageError("--nodes needs --kafka", "add --kafka, or drop --nodes")
    stop = _SignalStop()
    try:
        with start_broker(args.port, cert=args.cert, key=args.key) as broker:
            print(f"bootstrap: {broker.bootstrap}", flush=True)
            if broker.tls:
                print(
                    f"tls: on (plaintext backend on {broker.host}:{broker.backend_port})",
                    file=sys.stderr,
                    flush=True,
                )
            print(f"log: {broker.log_path}  (Ctrl-C to stop)", file=sys.stderr, flush=True)
            while not stop.wait(0.5):
                if not broker.running():
                    broker.keep_log = True
                    raise RuntimeFailure(
                        f"the broker exited with code {broker.process.returncode}",
                        f"see {broker.log_path}",
                    )
    finally:
        stop.restore()
    return 0


def run_kafka(args: argparse.Namespace) -> int:
    """``--kafka``: start Apache Kafka, print its bootstrap, wait for a signal or a node's exit."""
    nodes = args.nodes or 1
    if args.cert is not None or args.key is not None:
        raise UsageError("--cert/--key do not apply to --kafka", "drop them, or drop --kafka")
    if args.port is not None and nodes != 1:
        raise UsageError("--port applies to a single Kafka node", "drop --port or --nodes 3")
    stop = _SignalStop()
    try:
        with start_kafka(nodes, ports=None if args.port is None else [args.port]) as cluster:
            print(f"bootstrap: {cluster.bootstrap}", flush=True)
            print(
                f"kafka: {nodes} node(s), logs and data in {cluster.work_dir}  (Ctrl-C to stop)",
                file=sys.stderr,
                flush=True,
            )
            while not stop.wait(0.5):
                for node in cluster.nodes:
                    if not node.running():
                        cluster.keep_logs = True
                        code = node.process.returncode if node.process is not None else None
                        raise RuntimeFailure(
                            f"Kafka node {node.node_id} exited with code {code}",
                            f"see {node.log_path}",
                        )
    finally:
        stop.restore()
    return 0


class _SignalStop(threading.Event):
    """Set by SIGTERM or SIGINT; :meth:`restore` puts the previous handlers back."""

    def __init__(self) -> None:
        super().__init__()
        self._previous = {
            s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)
        }

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        self.set()

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
