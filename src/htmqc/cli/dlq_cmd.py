"""``htmqc dlq list | show | redrive``: inspect and replay dead letters.

Sources (one of):

* a Kafka DLQ: ``--bootstrap B --topic T`` reads ``T.dlq`` and ``T.dlq.poison``
  (``--poison``: only the poison topic); entry ids are ``DLQTOPIC/PARTITION/OFFSET``
  (:mod:`htmqc.dlq.kafka_source`);
* a SQL sink's dead-letter table: ``--sink sqlite:///PATH`` or ``postgresql://...``;
  entry ids are row ids; ``redrive`` also needs ``--bootstrap``
  (:mod:`htmqc.dlq.sql_source`).

``list`` prints a table (rich on a terminal, plain aligned columns otherwise)
or ``--json`` (an array); ``show ID`` prints one entry whole; ``redrive``
writes the selected entries that were not redriven yet back to their original
topic and partition and marks them, then prints one summary line. Filters
(``list`` and ``redrive``): ``--partition``, ``--offset-from``/``--offset-to``
(the original message's position, inclusive), ``--error-class``, ``--kind``,
``--since``/``--until`` (last failure time), ``--pending``, ``--limit``.
Bad input: one line, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from htmqc.cli import metadata_limit
from htmqc.config import parse_pairs, remember_secrets
from htmqc.dlq.entries import Selection, StoredDeadLetter, iso_time, parse_time, show_bytes
from htmqc.dlq.kafka_source import KafkaDlq, RedriveReport
from htmqc.dlq.record import DLQ_KINDS
from htmqc.dlq.sql_source import SqlDlq
from htmqc.errors import UsageError
from htmqc.progress import progress

_DESCRIPTION = """\
Inspect and replay dead letters.

  htmqc dlq list    --bootstrap B --topic T [filters] [--json]
  htmqc dlq show    --bootstrap B --topic T ID           (ID: T.dlq/0/17, as list shows)
  htmqc dlq redrive --bootstrap B --topic T [filters]
  htmqc dlq list    --sink sqlite:///PATH [filters]       (SQL dead-letter table)
  htmqc dlq redrive --sink sqlite:///PATH --bootstrap B [filters]

redrive writes each selected entry back to its original topic and partition
(same key, value, headers, plus htmqc-redrive-of=ID) and marks it, so a second
redrive writes nothing; redrive --dry-run lists the entries it would write (the
selection's, not redriven yet) and writes nothing (for a Kafka DLQ it fails, as the
redrive would, if an entry's partition no longer exists). Kafka DLQs are redriven
exactly once (one transaction for the records and the marks); the README's
"Dead-letter queues" section says what the SQL crash window is and what a
redrive does to per-key order."""


def _source_options(parser: argparse.ArgumentParser) -> None:
    env = os.environ
    parser.add_argument(
        "--bootstrap",
        default=env.get("HTMQC_BOOTSTRAP"),
        help="bootstrap servers, HOST:PORT[,...] (or $HTMQC_BOOTSTRAP)",
    )
    parser.add_argument("--topic", help="the consumer's input topic T (reads T.dlq, T.dlq.poison)")
    parser.add_argument("--poison", action="store_true", help="only T.dlq.poison")
    parser.add_argument("--sink", help="SQL sink URL whose dead-letter table to read")
    parser.add_argument(
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting (repeatable)",
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds per broker or database operation"
    )


def _filter_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--partition", type=int, help="original partition")
    parser.add_argument("--offset-from", type=int, metavar="N", help="original offset >= N")
    parser.add_argument("--offset-to", type=int, metavar="N", help="original offset <= N")
    parser.add_argument("--error-class", help="exception class (module.Name or Name)")
    parser.add_argument("--kind", choices=DLQ_KINDS, help="why it was dead-lettered")
    parser.add_argument("--since", help="last failure at or after (ISO 8601, unix s, or 2h ago)")
    parser.add_argument("--until", help="last failure at or before (same forms)")
    parser.add_argument("--pending", action="store_true", help="only entries not redriven yet")
    parser.add_argument("--limit", type=int, help="at most N entries")


def register(subparsers: Any) -> None:
    """Add the ``dlq`` subcommand and its ``list``, ``show``, ``redrive``."""
    parser = subparsers.add_parser(
        "dlq",
        help="list, show and redrive dead letters",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="dlq_action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="list dead letters")
    _source_options(listing)
    _filter_options(listing)
    listing.add_argument("--json", action="store_true", help="a JSON array, every field")
    listing.set_defaults(func=run_list)
    show = actions.add_parser("show", help="show one dead letter whole")
    _source_options(show)
    show.add_argument("id", help="DLQTOPIC/PARTITION/OFFSET (or OFFSET, PARTITION/OFFSET); row id")
    show.add_argument("--json", action="store_true", help="JSON object")
    show.set_defaults(func=run_show)
    redrive = actions.add_parser("redrive", help="write dead letters back to their topic")
    _source_options(redrive)
    _filter_options(redrive)
    metadata_limit.add_option(redrive)
    redrive.add_argument(
        "--dry-run", action="store_true",
        help="list what would be redriven (selected, not redriven yet) and write nothing",
    )
    redrive.set_defaults(func=run_redrive)


def _source(args: argparse.Namespace) -> KafkaDlq | SqlDlq:
    """The DLQ store the options name; :raises UsageError: neither or both."""
    kafka = parse_pairs(args.kafka_config, "--kafka-config")
    remember_secrets(kafka, [args.sink])
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout}", "pass --timeout 30")
    if args.sink:
        if args.poison:
            raise UsageError("--poison is for Kafka DLQs", "filter with --kind poison instead")
        return SqlDlq(args.sink, timeout=args.timeout)
    if not args.topic:
        raise UsageError("no DLQ given", "pass --bootstrap B --topic T, or --sink URL")
    if not args.bootstrap:
        raise UsageError("a Kafka DLQ needs a broker", "pass --bootstrap HOST:PORT")
    return KafkaDlq(
        args.bootstrap,
        args.topic,
        poison_only=args.poison,
        kafka_config=kafka,
        timeout=args.timeout,
        metadata_max_bytes=metadata_limit.from_args(args),
    )


def _selection(args: argparse.Namespace, source: KafkaDlq | SqlDlq) -> Selection:
    return Selection(
        topic=args.topic if isinstance(source, SqlDlq) else None,
        partition=args.partition,
        offset_from=args.offset_from,
        offset_to=args.offset_to,
        error_class=args.error_class,
        kind=args.kind,
        since=parse_time(args.since, "--since") if args.since else None,
        until=parse_time(args.until, "--until") if args.until else None,
        pending=args.pending,
        limit=args.limit,
    )


def _close(source: KafkaDlq | SqlDlq) -> None:
    if isinstance(source, SqlDlq):
        source.close()


def run_list(args: argparse.Namespace) -> int:
    """``htmqc dlq list``."""
    source = _source(args)
    try:
        entries = source.entries(_selection(args, source))
        if args.json:  # streamed: one entry in memory at a time
            print("[")
            for i, entry in enumerate(entries):
                print(("," if i else "") + json.dumps(entry.to_json()))
            print("]")
        else:
            print_table(entries, rich_output=sys.stdout.isatty())
    finally:
        _close(source)
    skipped = getattr(source, "skipped", 0)
    if skipped:
        print(f"htmqc: {skipped} records on the DLQ topics are not htmqc dead letters (not shown)",
              file=sys.stderr)  # fmt: skip
    return 0


_HEAD = ("id", "original", "key", "kind", "retries", "last failure", "redriven", "reason")
_SHORT = frozenset({"kind", "retries", "redriven"})


def _row(e: StoredDeadLetter) -> tuple[str, ...]:
    return (
        e.id,
        e.origin,
        show_bytes(e.key, 24),
        e.info.kind,
        str(e.info.retries),
        (iso_time(e.info.last_failure_at) or "-")[:16].replace("T", " "),
        "yes" if e.redriven else "no",
        e.reason[:80],
    )


def print_table(entries: Iterable[StoredDeadLetter], *, rich_output: bool) -> None:
    """The ``list`` table: rich on a terminal, plain aligned text otherwise."""
    rows = [_row(e) for e in entries]
    if rich_output:
        from rich import box
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{len(rows)} dead letters", box=box.SIMPLE_HEAD, padding=(0, 1))
        for name in _HEAD:
            table.add_column(name, no_wrap=name in _SHORT, ratio=3 if name == "reason" else None)
        for row in rows:
            table.add_row(*row)
        Console().print(table)
        return
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(_HEAD)]
    for row in [_HEAD, *rows]:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())


def run_show(args: argparse.Namespace) -> int:
    """``htmqc dlq show ID``."""
    source = _source(args)
    try:
        entry = source.get(args.id)
    finally:
        _close(source)
    if args.json:
        json.dump(entry.to_json(), sys.stdout, indent=1)
        print()
        return 0
    info = entry.info
    lines = [
        ("id", entry.id),
        ("original", entry.origin),
        ("source", entry.source or "-"),
        ("key", show_bytes(entry.key)),
        ("kind", info.kind),
        ("error class", info.error_class),
        ("error message", info.error_message),
        ("retries", str(info.retries)),
        ("first failure", iso_time(info.first_failure_at) or "-"),
        ("last failure", iso_time(info.last_failure_at) or "-"),
        ("group", info.group),
        ("reason", entry.reason),
        ("dead-lettered", iso_time(entry.dead_lettered_at) or "-"),
        ("redriven", ("yes " + (iso_time(entry.redriven_at) or "")).strip()
                     if entry.redriven else "no"),
    ]  # fmt: skip
    for name, value in lines:
        print(f"{name + ':':15} {value}")
    print("headers:")
    for name, raw in entry.headers:
        print(f"  {name}: {show_bytes(raw)}")
    print("value:")
    print(f"  {show_bytes(entry.value)}")
    print("stack:")
    for line in info.stack.splitlines():
        print(f"  {line}")
    return 0


def run_redrive(args: argparse.Namespace) -> int:
    """``htmqc dlq redrive``: one summary line (plus progress)."""
    source = _source(args)
    selection = _selection(args, source)
    where = args.topic or "their topics"
    if args.dry_run:
        if args.limit is not None and isinstance(source, KafkaDlq):
            _close(source)
            raise UsageError(
                "--dry-run with --limit cannot list what a Kafka DLQ's redrive would write "
                "(it takes the first entries of all partitions as they arrive)",
                "leave out --limit, or narrow with --partition/--offset-from/--offset-to",
            )
        # The entries redrive would write: the selection's, not redriven yet; for a
        # Kafka DLQ, failing as the redrive would if one's partition is gone.
        try:
            entries = list(source.entries(replace(selection, pending=True)))
            if isinstance(source, KafkaDlq):
                source.check_targets(entries)
        finally:
            _close(source)
        print_table(entries, rich_output=sys.stdout.isatty())
        print(f"dry run: {len(entries)} dead letters would be redriven to {where}; "
              "nothing was written")
        return 0
    report: RedriveReport
    try:
        with _Progress() as bar:
            if isinstance(source, SqlDlq):
                if not args.bootstrap:
                    raise UsageError(
                        "redriving a SQL dead-letter table needs a broker",
                        "pass --bootstrap HOST:PORT",
                    )
                report = source.redrive(
                    selection,
                    bootstrap=args.bootstrap,
                    kafka_config=parse_pairs(args.kafka_config, "--kafka-config"),
                    progress=bar.advance,
                    on_total=bar.start,
                )
            else:
                report = source.redrive(selection, progress=bar.advance, on_total=bar.start)
    finally:
        _close(source)
    print(
        f"redrove {report.redriven} dead letters to {where} in {report.seconds:.2f}s "
        f"({report.transactions} transactions)"
        + (f"; {report.skipped} records were not dead letters" if report.skipped else "")
    )
    return 0


class _Progress:
    """The redrive's progress on stdout: rich bar on a terminal, plain lines otherwise
    (:func:`htmqc.progress.progress`), started once the total is known."""

    def __init__(self) -> None:
        self._cm: Any = None
        self._advance: Any = None

    def __enter__(self) -> _Progress:
        return self

    def start(self, total: int) -> None:
        """Show progress over ``total`` units (nothing for 0)."""
        if total > 0:
            self._cm = progress(total, "redrive", stream=sys.stdout)
            self._advance = self._cm.__enter__()

    def advance(self, n: int) -> None:
        """``n`` more units done."""
        if self._advance is not None:
            self._advance(n)

    def __exit__(self, *exc: object) -> None:
        if self._cm is not None:
            self._cm.__exit__(*exc)
