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
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType
from typing import Any

from htmqc.broker import start_broker
from htmqc.errors import RuntimeFailure


def register(subparsers: Any) -> None:
    """Add the ``broker`` subcommand."""
    parser = subparsers.add_parser(
        "broker",
        help="run the bundled Kafka-protocol broker on loopback (memory only)",
        description=(
            "Run the bundled Kafka-protocol broker (Tansu) on 127.0.0.1 in the foreground. "
            "Prints 'bootstrap: HOST:PORT' when ready; Ctrl-C or SIGTERM stops it. "
            "Everything is kept in memory and lost on stop."
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
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Start the broker, print its bootstrap, wait for a signal or its exit."""
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
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
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
