"""``htmqc chaos``: a fault-injected exactly-once run, checked (Jepsen-style).

Starts a dedicated broker behind the chaos proxy (--broker kafka-cluster: three
Apache Kafka nodes, every listener proxied), a topic with --partitions
partitions, and for each --sink a group of --consumers ``htmqc run --mode
exactly-once`` processes; produces --messages messages, injects --faults faults
drawn from --seed (the same seed gives the same schedule; on the cluster half
of them broker faults), restarts what it killed, and audits each sink: lost,
duplicated, out-of-order effects, committed offsets that moved backwards,
effects written by a fenced generation, aborted Kafka output that was read.
Details: :mod:`htmqc.chaos.harness`. Exit status: 0 no anomaly, 1 anomalies
(or a failure), 2 bad options.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from htmqc.chaos.harness import BROKERS, SINKS, ChaosConfig, run_chaos
from htmqc.chaos.schedule import KINDS, parse_kinds
from htmqc.errors import UsageError

DEFAULT_PG_URL = "postgresql://127.0.0.1:5432/test"


def register(subparsers: Any) -> None:
    """Add the ``chaos`` subcommand."""
    parser = subparsers.add_parser(
        "chaos",
        help="fault-injected exactly-once run with an audit (lost, duplicate, order...)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    defaults = ChaosConfig()
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault schedule")
    parser.add_argument("--partitions", type=int, default=defaults.partitions)
    parser.add_argument("--consumers", type=int, default=defaults.consumers)
    parser.add_argument("--messages", type=int, default=defaults.messages)
    parser.add_argument("--faults", type=int, default=defaults.faults, help="faults to inject")
    parser.add_argument(
        "--kinds",
        default="all",
        help=f"comma-separated fault kinds to draw from ({', '.join(KINDS)}); default all "
        "that apply: the broker-* kinds with --broker kafka-cluster, no zombie with sqlite",
    )
    parser.add_argument("--report", help="write the JSON report to this file")
    parser.add_argument("--trace-dir", help="consumers write --trace files here (validated)")
    parser.add_argument(
        "--sink",
        default="postgresql",
        help=f"comma-separated sinks, one consumer group each ({', '.join(SINKS)}; "
        "kafka: Kafka->Kafka, needs a Kafka broker); default postgresql",
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("HTMQC_CHAOS_PG_URL", DEFAULT_PG_URL),
        help="PostgreSQL database for --sink postgresql (env HTMQC_CHAOS_PG_URL)",
    )
    parser.add_argument(
        "--produce-seconds",
        type=float,
        default=defaults.produce_seconds,
        help="spread production over this many seconds",
    )
    parser.add_argument(
        "--timeout", type=float, default=defaults.timeout, help="give up after SECONDS"
    )
    parser.add_argument("--work-dir", help="logs and control file here (default: a temp dir)")
    parser.add_argument(
        "--broker",
        choices=BROKERS,
        default=defaults.broker,
        help="the bundled broker (tansu, default), one Apache Kafka node (kafka), or "
        "three (kafka-cluster: replication factor 3, min ISR 2, broker faults)",
    )
    parser.add_argument("--keep-tables", action="store_true", help="keep the run's database tables")
    parser.add_argument(
        "--unsafe-disable-fence",
        action="store_true",
        help="DEBUG ONLY: consumers skip the generation fence (shows the checker failing)",
    )
    parser.add_argument(
        "--zombie-in-transaction",
        action="store_true",
        help="a zombie stops itself inside a handler call, so its late transaction holds "
        "effects (not at whatever moment the fault fires)",
    )
    parser.set_defaults(func=run)


def _kinds(text: str) -> tuple[str, ...] | None:
    """The kinds asked for; ``None`` for "all" (the harness picks what applies:
    :func:`htmqc.chaos.harness.default_kinds`)."""
    return None if text.strip() in ("", "all") else parse_kinds(text)


def run(args: argparse.Namespace) -> int:
    """Run, print the summary, write the report; 0 iff no anomaly."""
    config = ChaosConfig(
        seed=args.seed,
        partitions=args.partitions,
        consumers=args.consumers,
        messages=args.messages,
        faults=args.faults,
        kinds=_kinds(args.kinds),
        sinks=tuple(s.strip() for s in args.sink.split(",") if s.strip()),
        pg_url=args.pg_url,
        produce_seconds=args.produce_seconds,
        timeout=args.timeout,
        trace_dir=Path(args.trace_dir) if args.trace_dir else None,
        work_dir=Path(args.work_dir) if args.work_dir else None,
        keep_tables=args.keep_tables,
        unsafe_disable_fence=args.unsafe_disable_fence,
        zombie_in_transaction=args.zombie_in_transaction,
        progress=True,
        broker=args.broker,
    )
    report_path = Path(args.report) if args.report else None
    if report_path is not None and not report_path.parent.is_dir():
        raise UsageError(f"--report {report_path}: no such directory", "create it first")
    result = run_chaos(config)
    if report_path is not None:
        report_path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    print(result.summary())
    sys.stdout.flush()
    return 0 if result.ok else 1
