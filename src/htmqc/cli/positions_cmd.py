"""``htmqc positions show | reset | seek | skip``: a consumer group's stored positions.

Stores (``--sink``): none or ``kafka:TOPIC``: the group's committed offsets in
Kafka (:mod:`htmqc.sinks.group_offsets`); ``sqlite:///PATH`` or
``postgresql://...``: the sink's positions table
(:meth:`htmqc.sinks.sql.SqlSink.reposition`). Every command reads the topic's
partitions and watermarks from ``--bootstrap``.

Contract of the moves (``reset``, ``seek``, ``skip``): every check runs
before anything is written, ``--dry-run`` included (which then writes
nothing); a refused move prints one line and moves nothing; an accepted one
moves every selected partition or, on error, none (SQL: one transaction;
Kafka: one ``alter_consumer_group_offsets`` call) and prints one line
``moved N partitions of T for group G: P: OLD->NEW, ...``. Targets outside
the log's watermarks are refused unless ``--force``. SQL moves take each
partition's fence as a new owner does, so a member still running with the
old fence cannot overwrite the new position; Kafka moves are refused while
the group has live members, unless ``--force``. Offsets finished out of order
above a position follow :mod:`htmqc.sinks.moves`.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from htmqc.cli import metadata_limit
from htmqc.config import parse_pairs, remember_secrets
from htmqc.core.decisions import TopicPartition
from htmqc.errors import UsageError
from htmqc.ports import Position
from htmqc.sinks.factory import open_sink
from htmqc.sinks.group_offsets import GroupPosition, KafkaGroupOffsets, KafkaTopicInfo
from htmqc.sinks.kafka_positions import DEFAULT_POSITIONS_TOPIC
from htmqc.sinks.moves import Move, Request, Watermarks, plan, show_offsets, summary
from htmqc.sinks.sql import SqlSink
from htmqc.sinks.urls import parse_sink_url

_DESCRIPTION = """\
Show or move a consumer group's stored positions on one topic.

  htmqc positions show  --group G --topic T [--sink URL] [--json]
  htmqc positions reset --group G --topic T --to earliest|latest [--partition P]
  htmqc positions seek  --group G --topic T --to OFFSET [--partition P]
  htmqc positions skip  N --group G --topic T [--partition P]

Where the positions are: without --sink (or with --sink kafka:OUT), the
group's committed offsets in Kafka (at-least-once, Kafka->Kafka); with
--sink sqlite:///PATH or postgresql://..., the sink's positions table
(exactly-once into SQL). --bootstrap gives the topic's partitions and
watermarks either way.

Moves: reset goes to the log's first (earliest) or next (latest) offset; seek
to OFFSET; skip moves N offsets forward (skip -- -N: backward). A target
below the low watermark or past the high watermark is refused unless
--force. --dry-run runs every check and prints what would move, changing
nothing. Offsets that finished out of order above the old position are kept
when the position moves forward (those at or above the new one: their
effects are stored) and cleared when it moves backward (everything from the
new position runs again).

Running members. SQL: the move takes each partition's fence the way a new
owner does, so a running member's next commit is refused as a zombie (it
cannot overwrite the new position); after its fence grace it claims the
partition again and continues from the new position. Kafka: the move is
refused while the group has live members (state not Empty/Dead). That is
Kafka's own rule: it accepts offset commits from outside the group only
while the group is empty (otherwise UNKNOWN_MEMBER_ID), and a member would
overwrite the new offset with its next commit anyway. Stop the members
first. --force skips htmqc's check (for a broker that reports a stale
state) and the watermark bounds; the broker still applies its own rule."""


def _options(parser: argparse.ArgumentParser, *, moves: bool) -> None:
    env = os.environ
    parser.add_argument(
        "--bootstrap",
        default=env.get("HTMQC_BOOTSTRAP"),
        help="bootstrap servers, HOST:PORT[,...] (or $HTMQC_BOOTSTRAP)",
    )
    parser.add_argument("--group", default=env.get("HTMQC_GROUP"), help="the consumer group")
    parser.add_argument("--topic", default=env.get("HTMQC_TOPIC"), help="the input topic")
    parser.add_argument(
        "--sink",
        default=env.get("HTMQC_SINK"),
        help="the SQL sink holding the positions (sqlite:///PATH, postgresql://...); "
        "none or kafka:OUT: Kafka's committed offsets",
    )
    parser.add_argument(
        "--positions-topic",
        default=DEFAULT_POSITIONS_TOPIC,
        help=f"Kafka positions topic of the Kafka->Kafka sink ({DEFAULT_POSITIONS_TOPIC})",
    )
    parser.add_argument(
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka connection setting (repeatable)",
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds per broker or database operation"
    )
    if moves:
        parser.add_argument("--partition", type=int, action="append", metavar="P",
                            help="only partition P (repeatable; default: all)")  # fmt: skip
        parser.add_argument(
            "--dry-run", action="store_true", help="run the checks, print what would move"
        )
        metadata_limit.add_option(parser)
        parser.add_argument(
            "--force",
            action="store_true",
            help="move past the watermarks, and (Kafka) even while the group has live "
            "members: the broker still refuses commits from outside a non-empty group",
        )


def register(subparsers: Any) -> None:
    """Add the ``positions`` subcommand and its ``show``, ``reset``, ``seek``, ``skip``."""
    parser = subparsers.add_parser(
        "positions",
        help="show or move a consumer group's stored positions (Kafka or SQL)",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="positions_action", metavar="ACTION", required=True)
    fmt = argparse.RawDescriptionHelpFormatter
    show = actions.add_parser(
        "show", help="per partition: stored position, watermarks, lag, fence",
        description=_DESCRIPTION, formatter_class=fmt,
    )  # fmt: skip
    _options(show, moves=False)
    show.add_argument("--json", action="store_true", help="a JSON array, one object per partition")
    show.set_defaults(func=run_show)
    reset = actions.add_parser(
        "reset", help="move to the earliest or latest offset",
        description=_DESCRIPTION, formatter_class=fmt,
    )  # fmt: skip
    reset.add_argument("--to", required=True, choices=("earliest", "latest"), dest="to",
                       help="the log's first offset (low watermark) or next (high)")  # fmt: skip
    _options(reset, moves=True)
    reset.set_defaults(func=run_move)
    seek = actions.add_parser(
        "seek", help="move to an offset", description=_DESCRIPTION, formatter_class=fmt
    )
    seek.add_argument("--to", required=True, type=int, metavar="OFFSET", dest="to",
                      help="the next offset the group reads")  # fmt: skip
    _options(seek, moves=True)
    seek.set_defaults(func=run_move)
    skip = actions.add_parser(
        "skip", help="move N offsets forward", description=_DESCRIPTION, formatter_class=fmt
    )
    skip.add_argument("n", type=int, metavar="N", help="offsets to move (negative: backward)")
    _options(skip, moves=True)
    skip.set_defaults(func=run_move)


class _Target:
    """The options resolved: the topic on the broker and the store of positions."""

    def __init__(self, args: argparse.Namespace) -> None:
        kafka = parse_pairs(args.kafka_config, "--kafka-config")
        remember_secrets(kafka, [args.sink])
        if args.timeout <= 0:
            raise UsageError(f"--timeout must be positive, got {args.timeout}", "pass --timeout 30")
        if not args.group:
            raise UsageError("no consumer group given", "pass --group NAME")
        if not args.topic:
            raise UsageError("no topic given", "pass --topic NAME")
        if not args.bootstrap:
            raise UsageError(
                "the partitions and watermarks come from the broker",
                "pass --bootstrap HOST:PORT (or set HTMQC_BOOTSTRAP)",
            )
        self.group: str = args.group
        self.topic: str = args.topic
        self.info = KafkaTopicInfo(
            args.bootstrap, args.topic, kafka_config=kafka, timeout=args.timeout
        )
        self.kafka = KafkaGroupOffsets(
            self.info, args.group, positions_topic=args.positions_topic,
            metadata_max_bytes=metadata_limit.from_args(args),
        )  # fmt: skip
        self.sql: SqlSink | None = None
        if args.sink and parse_sink_url(args.sink).kind != "kafka":
            self.sql = _open_sql(args.sink, args.group)

    def close(self) -> None:
        if self.sql is not None:
            self.sql.close()


def _open_sql(url: str, group: str) -> SqlSink:
    """The SQL sink of ``url``, opened for ``group``.

    :raises UsageError: not a SQL sink URL, or an SQLite file that does not exist
        (a consumer never wrote there: most likely a typo)."""
    parsed = parse_sink_url(url)
    if parsed.kind == "sqlite" and not Path(parsed.target).is_file():
        raise UsageError(
            f"no SQLite file at {parsed.target}", "check --sink: it names the consumer's sink"
        )
    sink = open_sink(url)
    assert isinstance(sink, SqlSink)
    sink.open(group)
    return sink


def _partitions(target: _Target, chosen: list[int] | None) -> list[int]:
    parts = target.info.partitions()
    if chosen:
        unknown = sorted(set(chosen) - set(parts))
        if unknown:
            raise UsageError(
                f"topic {target.topic!r} has no partition {unknown[0]} (it has 0-{max(parts)})",
                "pass --partition with one of those",
            )
        return sorted(set(chosen))
    return parts


def run_show(args: argparse.Namespace) -> int:
    """``htmqc positions show``: a row per partition (or ``--json``)."""
    target = _Target(args)
    try:
        parts = _partitions(target, None)
        marks = target.info.watermarks(parts)
        rows = _rows(target, parts, marks)
    finally:
        target.close()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    store = "sql" if target.sql is not None else "kafka"
    head = ["partition", "position", "low", "high", "lag", "finished above"]
    head += ["fence", "updated"] if store == "sql" else ["from"]
    table = [head] + [[_cell(r[k]) for k in _keys(store)] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    where = target.sql.display if target.sql is not None else "Kafka committed offsets"
    print(f"group {target.group}, topic {target.topic}, positions in {where}")
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _keys(store: str) -> list[str]:
    keys = ["partition", "position", "low", "high", "lag", "finished_above"]
    return keys + (["fence", "updated_at"] if store == "sql" else ["source"])


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return show_offsets(value)
    return str(value)


def _rows(target: _Target, parts: list[int], marks: dict[int, Watermarks]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if target.sql is not None:
        stored = target.sql.stored(target.topic)
        for p in parts:
            row = stored.get((target.topic, p))
            pos = row.position if row is not None else None
            rows.append(_row(p, marks[p], pos.committed if pos else None,
                             pos.finished_above if pos else ()) | {
                "fence": pos.fence if pos else None,
                "updated_at": row.updated_at if row is not None else None,
            })  # fmt: skip
        return rows
    kafka = target.kafka.stored(parts)
    for p in parts:
        gp = kafka.get(p, GroupPosition(None))
        rows.append(_row(p, marks[p], gp.committed, gp.finished_above) | {"source": gp.source})
    return rows


def _row(
    p: int, marks: Watermarks, committed: int | None, finished: tuple[int, ...]
) -> dict[str, Any]:
    lag = None
    if committed is not None:
        done = sum(1 for o in finished if committed <= o < marks.high)
        lag = max(0, marks.high - max(committed, marks.low) - done)
    return {
        "partition": p,
        "position": committed,
        "low": marks.low,
        "high": marks.high,
        "lag": lag,
        "finished_above": list(finished),
    }


def _request(args: argparse.Namespace) -> Request:
    if args.positions_action == "skip":
        return Request("skip", args.n)
    if args.positions_action == "seek":
        return Request("offset", args.to)
    return Request("earliest" if args.to == "earliest" else "latest")


def run_move(args: argparse.Namespace) -> int:
    """``htmqc positions reset|seek|skip``: check, move (unless ``--dry-run``), one line."""
    request = _request(args)
    target = _Target(args)
    try:
        parts = _partitions(target, args.partition)
        marks = target.info.watermarks(parts)
        if target.sql is not None:
            moves = _move_sql(target, target.sql, parts, marks, request, args)
        else:
            moves = _move_kafka(target, parts, marks, request, args)
    finally:
        target.close()
    print(summary(moves, target.topic, target.group, dry_run=args.dry_run))
    return 0


def _move_sql(
    target: _Target,
    sink: SqlSink,
    parts: list[int],
    marks: dict[int, Watermarks],
    request: Request,
    args: argparse.Namespace,
) -> list[Move]:
    topic = target.topic

    def planned_from(p: int, pos: Position | None) -> Move:
        stored = pos.committed if pos is not None else None
        finished = pos.finished_above if pos is not None else ()
        return plan(request, p, stored, finished, marks[p], force=args.force)

    if args.dry_run:
        rows = sink.stored(topic)
        return [
            planned_from(p, rows[(topic, p)].position if (topic, p) in rows else None)
            for p in parts
        ]
    planned: dict[int, Move] = {}

    def decide(tp: TopicPartition, pos: Position | None) -> tuple[int, tuple[int, ...]] | None:
        move = planned[tp[1]] = planned_from(tp[1], pos)
        return (move.after, move.finished_after) if move.changed else None

    sink.reposition([(topic, p) for p in parts], decide)
    return [planned[p] for p in parts]


def _move_kafka(
    target: _Target,
    parts: list[int],
    marks: dict[int, Watermarks],
    request: Request,
    args: argparse.Namespace,
) -> list[Move]:
    live = target.kafka.live_state()
    if live is not None and not args.force:
        raise UsageError(
            f"group {target.group!r} has live members ({live}): Kafka accepts no offsets "
            "from outside a non-empty group, and a member would overwrite them",
            "stop the group's consumers and retry (see 'htmqc positions --help' about --force)",
        )
    stored = target.kafka.stored(parts)
    moves = [
        plan(request, p, stored[p].committed, stored[p].finished_above, marks[p], force=args.force)
        for p in parts
    ]
    if not args.dry_run:
        target.kafka.move(moves)
    return moves
