"""``htmqc produce``: write numbered test messages to a topic.

The message format is documented in :mod:`htmqc.produce`. Prints one summary
line: how many messages were written, how long it took, and the rate.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from htmqc.config import parse_pairs, remember_secrets
from htmqc.produce import produce, validate

_DESCRIPTION = """\
Write numbered test messages to a topic and print one summary line.

Message i (from --start-id): key "k{i % KEYS}" (none with --keys 0), value the
12-digit id padded with "." to --size bytes, header htmqc-id=i. With
--transactional, transactions of 1000 messages; --abort-every N aborts every
N-th one (its messages never reach readers)."""


def register(subparsers: Any) -> None:
    """Add the ``produce`` subcommand."""
    parser = subparsers.add_parser(
        "produce",
        help="write numbered test messages to a topic",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--bootstrap", required=True, help="bootstrap servers, HOST:PORT[,...]")
    parser.add_argument("--topic", required=True, help="topic to write to")
    parser.add_argument("--count", type=int, required=True, help="number of messages")
    parser.add_argument(
        "--partitions", type=int, default=None, help="create the topic with this many partitions"
    )
    parser.add_argument(
        "--keys", type=int, default=1000, help="distinct keys, k{i %% KEYS}; 0 = no keys"
    )
    parser.add_argument("--size", type=int, default=100, help="value size in bytes (>= 12)")
    parser.add_argument("--start-id", type=int, default=0, help="number of the first message")
    parser.add_argument(
        "--transactional", action="store_true", help="write in transactions of 1000 messages"
    )
    parser.add_argument(
        "--abort-every",
        type=int,
        default=0,
        metavar="N",
        help="abort every N-th transaction (needs --transactional)",
    )
    parser.add_argument(
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting, e.g. security.protocol=ssl (repeatable)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Validate the options, produce, print one summary line."""
    validate(args.count, args.keys, args.size, args.start_id, args.abort_every)
    kafka_config = parse_pairs(args.kafka_config, "--kafka-config")
    remember_secrets(kafka_config)
    report = produce(
        args.bootstrap,
        args.topic,
        args.count,
        keys=args.keys,
        size=args.size,
        partitions=args.partitions,
        start_id=args.start_id,
        transactional=args.transactional,
        abort_every=args.abort_every,
        progress=sys.stderr.isatty(),
        kafka_config=kafka_config,
    )
    aborted = f", {len(report.aborted_ids)} aborted" if report.aborted_ids else ""
    print(
        f"produced {report.count} messages to {args.topic} in {report.seconds:.2f}s "
        f"({report.rate:,.0f} msg/s){aborted}"
    )
    return 0
