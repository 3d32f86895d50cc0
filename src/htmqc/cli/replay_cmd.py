"""``htmqc replay``: feed a captured segment through the runtime, offline.

See :mod:`htmqc.replay.run` for what makes a replay deterministic. Prints one
summary line; a corrupt or truncated segment is a one-line error (exit 1).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from htmqc.errors import UsageError
from htmqc.replay.run import replay
from htmqc.runtime.launch import load_handler
from htmqc.runtime.options import MODES

_DESCRIPTION = """\
Run MODULE:FUNCTION over the records of FILE.seg (from `htmqc capture`) with
the same runtime as `htmqc run`, in the captured order, without a broker.
Deterministic: a virtual clock, handlers on one thread, zero retry delays;
--faults SEED raises handler exceptions on a seeded schedule (each chosen
record fails 1..--fault-max-failures times), the same on every replay.
At-least-once dead letters are kept in memory and counted; exactly-once ones
go into the sink, as in a live run."""


def register(subparsers: Any) -> None:
    """Add the ``replay`` subcommand."""
    parser = subparsers.add_parser(
        "replay",
        help="feed a captured segment through the runtime, offline",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("segment", metavar="FILE.seg", help="segment written by htmqc capture")
    parser.add_argument("handler", metavar="MODULE:FUNCTION", help="the handler to run")
    parser.add_argument("--mode", choices=MODES, default="at-least-once")
    parser.add_argument("--sink", help="sqlite:///PATH or postgresql://... (exactly-once)")
    parser.add_argument("--group", default="htmqc-replay", help="group name stored in the sink")
    parser.add_argument("--faults", type=int, metavar="SEED", help="inject handler faults")
    parser.add_argument(
        "--fault-rate", type=float, default=0.02, help="share of records with a fault (0.02)"
    )
    parser.add_argument(
        "--fault-max-failures",
        type=int,
        default=4,
        metavar="K",
        help="a faulty record fails 1..K times (default 4)",
    )
    parser.add_argument("--max-retries", type=int, default=3, help="retries before the DLQ")
    parser.add_argument("--txn-messages", type=int, default=1000, help="messages per transaction")
    parser.add_argument("--trace", metavar="FILE", help="append core transitions (JSON lines)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the handler, replay, print one summary line."""
    if not 0.0 <= args.fault_rate <= 1.0:
        raise UsageError(f"--fault-rate {args.fault_rate} is not in [0, 1]", "pass e.g. 0.02")
    if args.fault_max_failures < 1:
        raise UsageError("--fault-max-failures must be 1 or more", "pass e.g. 4")
    handler = load_handler(args.handler)
    report = replay(
        args.segment,
        handler,
        mode=args.mode,
        sink=args.sink,
        group=args.group,
        faults=args.faults,
        fault_rate=args.fault_rate,
        max_failures=args.fault_max_failures,
        trace=args.trace,
        max_retries=args.max_retries,
        txn_messages=args.txn_messages,
        progress=sys.stderr.isatty(),
    )
    print(report.summary())
    return 0
