"""``htmqc audit``: check that a run stored every produced message exactly once.

Reads the produced ids (a JSON-lines file; with ``--spark`` also the topic
itself, ``kafka://BOOTSTRAP/TOPIC``), the sink's effects (``sqlite:///PATH``,
``postgresql://...?table=T``, a JSON-lines file; with ``--spark`` also
``parquet:DIR``), and optionally the dead-letter entries, the committed-offset history
(JSON lines or a runtime ``--trace`` file) and the aborted ids; prints a short
summary and optionally writes the JSON report. File formats and anomaly
definitions: :mod:`htmqc.audit.load`, :mod:`htmqc.audit.model`.
Exit status: 0 no anomaly, 1 anomalies found, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from htmqc.audit import load
from htmqc.audit.check import audit
from htmqc.audit.model import DEFAULT_EXAMPLES, AuditReport
from htmqc.errors import UsageError


def register(subparsers: Any) -> None:
    """Add the ``audit`` subcommand."""
    parser = subparsers.add_parser(
        "audit",
        help="check a run's effects against what was produced (lost, duplicate, ...)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    parser.add_argument(
        "--produced",
        required=True,
        help="JSON lines of produced ids, or kafka://BOOTSTRAP/TOPIC (with --spark: the "
        "topic read_committed; its aborted records count as --aborted)",
    )
    parser.add_argument(
        "--effects",
        required=True,
        help="sqlite:///PATH[?table=T], postgresql://...?table=T, a JSON-lines file, or "
        "parquet:DIR (with --spark)",
    )
    parser.add_argument("--dlq", help="JSON lines of dead-lettered ids")
    parser.add_argument("--committed", help="JSON lines of committed offsets, or a trace file")
    parser.add_argument("--aborted", help="ids of aborted transactions, one per line")
    parser.add_argument("--json", dest="json_out", help="write the JSON report to this file")
    parser.add_argument(
        "--examples", type=int, default=DEFAULT_EXAMPLES, help="examples kept per anomaly"
    )
    parser.add_argument("--spark", action="store_true", help="compute the audit with Spark")
    parser.add_argument("--master", default="local[2]", help="Spark master (with --spark)")
    parser.set_defaults(func=run)


_SPARK_ONLY = {"--produced": "kafka://", "--effects": "parquet:"}
_NOT_FILES = ("kafka://", "parquet:", "sqlite:", "postgresql://", "postgres://")


def _check_files(args: argparse.Namespace) -> None:
    for option, scheme in _SPARK_ONLY.items():
        value = getattr(args, option[2:])
        if value.startswith(scheme) and not args.spark:
            raise UsageError(f"{option} {scheme}... needs --spark", "add --spark")
    named = {"--produced": args.produced, "--dlq": args.dlq, "--committed": args.committed}
    named["--aborted"] = args.aborted
    named["--effects"] = args.effects
    named = {k: v for k, v in named.items() if v is None or not v.startswith(_NOT_FILES)}
    for option, value in named.items():
        if value is not None and not Path(value).is_file():
            raise UsageError(f"{option} {value}: no such file", f"check the {option} path")
    if args.examples < 0:
        raise UsageError("--examples must not be negative", "pass 0 or more")
    if args.master != "local[2]" and not args.spark:
        raise UsageError("--master needs --spark", "add --spark or drop --master")


def run(args: argparse.Namespace) -> int:
    """Audit; exit 0 if ok, 1 if anomalies (bad input raises UsageError: exit 2)."""
    _check_files(args)
    report: AuditReport
    if args.spark:
        from htmqc.spark.audit_job import audit_files
        from htmqc.spark.session import spark_session

        with spark_session(args.master, app="htmqc-audit") as spark:
            report = audit_files(
                spark,
                produced=args.produced,
                effects=args.effects,
                dlq=args.dlq,
                committed=args.committed,
                aborted=args.aborted,
                limit=args.examples,
            )
    else:
        report = audit(
            load.produced_from_jsonl(args.produced),
            load.effects_from_source(args.effects),
            dlq=load.dlq_from_jsonl(args.dlq) if args.dlq else (),
            committed=load.commits_from_jsonl(args.committed) if args.committed else (),
            aborted=load.aborted_from_file(args.aborted) if args.aborted else (),
            limit=args.examples,
        )
    if args.json_out:
        try:
            Path(args.json_out).write_text(json.dumps(report.to_json(), indent=2) + "\n")
        except OSError as exc:
            raise UsageError(
                f"cannot write --json {args.json_out}: {exc.strerror}", "check the directory"
            ) from None
    print(report.summary())
    return 0 if report.ok else 1
