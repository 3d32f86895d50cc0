"""``htmqc produce``: write numbered test messages, or a file's records, to a topic.

The message format is documented in :mod:`htmqc.produce`, the file formats of
``--from`` in :mod:`htmqc.records_file`. Prints one summary line: how many
messages were written, how long it took, and the rate.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from htmqc.config import parse_pairs, remember_secrets
from htmqc.errors import UsageError
from htmqc.produce import produce, validate
from htmqc.records_file import FORMATS, check_sizes, read_records

#: librdkafka's default ``message.max.bytes``.
MESSAGE_MAX_BYTES = 1_000_000

_DESCRIPTION = """\
Write numbered test messages to a topic and print one summary line.

Message i (from --start-id): key "k{i % KEYS}" (none with --keys 0), value the
12-digit id padded with "." to --size bytes, header htmqc-id=i. With
--transactional, transactions of 1000 messages; --abort-every N aborts every
N-th one (its messages never reach readers).

--from FILE sends your own records instead: JSON lines (each line's text is a
value; --key-field NAME keys it by that field) or plain lines (each line is a
value), the whole file checked before anything is sent."""


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
    parser.add_argument(
        "--count", type=int, default=None,
        help="number of messages (with --from: the first N records; default all)",
    )
    parser.add_argument(
        "--from", dest="source", metavar="FILE", default=None,
        help="send this file's records (- for standard input) instead of test messages",
    )
    parser.add_argument(
        "--format", choices=FORMATS, default="auto",
        help="--from's format: jsonl, lines, or auto (jsonl for .jsonl/.ndjson/.json)",
    )
    parser.add_argument(
        "--key-field", metavar="NAME", default=None,
        help="with JSON lines: key each record by this top-level field",
    )
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
    records = None
    if args.source is not None:
        records = read_records(args.source, args.format, args.key_field)
        name = "standard input" if args.source == "-" else args.source
        if not records:
            raise UsageError(f"{name} holds no records", "pass a file with records")
        limit = int(parse_pairs(args.kafka_config, "--kafka-config").get(
            "message.max.bytes", MESSAGE_MAX_BYTES))
        check_sizes(name, records, limit)
        if args.count is None:
            args.count = len(records)
    elif args.key_field is not None or args.format != "auto":
        raise UsageError("--format and --key-field need --from", "add --from FILE")
    elif args.count is None:
        raise UsageError("--count is required", "pass --count N, or --from FILE")
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
        records=records,
    )
    aborted = f", {len(report.aborted_ids)} aborted" if report.aborted_ids else ""
    print(
        f"produced {report.count} messages to {args.topic} in {report.seconds:.2f}s "
        f"({report.rate:,.0f} msg/s){aborted}"
    )
    return 0
