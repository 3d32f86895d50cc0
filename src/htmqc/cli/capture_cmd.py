"""``htmqc capture``: copy a topic range into a local segment file.

The segment format is documented in :mod:`htmqc.replay.segment`; replay it
with ``htmqc replay``. Prints one summary line.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from htmqc.replay.capture import capture, parse_offsets, parse_partitions

_DESCRIPTION = """\
Copy [--from, --to) of each partition of a topic into a segment file (default:
every partition, from the log start to the high watermark now). Records are
stored in the order they arrived, with topic, partition, offset, timestamp,
key, value and headers, in a checksummed format; `htmqc replay FILE.seg
MODULE:FUNCTION` feeds them through the runtime offline."""


def register(subparsers: Any) -> None:
    """Add the ``capture`` subcommand."""
    parser = subparsers.add_parser(
        "capture",
        help="copy a topic range into a local segment file",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--bootstrap", required=True, help="bootstrap servers, HOST:PORT[,...]")
    parser.add_argument("--topic", required=True, help="topic to read")
    parser.add_argument("--out", required=True, metavar="FILE.seg", help="segment file to write")
    parser.add_argument("--partitions", help="partitions to capture, e.g. 0,2 (default: all)")
    parser.add_argument(
        "--from",
        dest="start",
        metavar="OFFSETS",
        help="first offset: N for every partition, or P:N,P:N (default: log start)",
    )
    parser.add_argument(
        "--to",
        dest="end",
        metavar="OFFSETS",
        help="end offset, exclusive: N or P:N,P:N (default: high watermark now)",
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to read the range (default 60)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Parse the range, capture, print one summary line."""
    report = capture(
        args.bootstrap,
        args.topic,
        args.out,
        partitions=parse_partitions(args.partitions),
        start=parse_offsets(args.start, "--from"),
        end=parse_offsets(args.end, "--to"),
        timeout=args.timeout,
        progress=sys.stderr.isatty(),
    )
    print(report.summary())
    return 0
