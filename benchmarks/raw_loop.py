"""Baseline: what a hand-written confluent-kafka loop reaches, to compare htmqc with.

Two loops over the same topic, each in a fresh consumer group:

- ``raw``: subscribe, ``consume(num_messages=500, timeout=...)``, call a Python
  handler per message, then store the batch's next offsets and
  ``commit(asynchronous=True)`` once per batch. This is the fastest honest
  at-least-once loop and the bar htmqc's overhead is measured against.
- ``naive``: the anti-pattern: handler, then a synchronous ``commit(message)``
  for every single message (one broker round trip per message).

The rate is measured from the first message received to the ``count``-th, so
the group join is excluded (reported separately as ``join_seconds``).
``load_1m`` records the 1-minute load average at the start: the box is
shared, so compare figures taken under similar load.

Usage::

    python -m benchmarks.raw_loop --bootstrap B --topic T --count N --mode raw|naive
    python -m benchmarks.raw_loop --start-broker --count 1000000 --partitions 8 --mode raw

``--start-broker`` runs the bundled broker, produces ``count`` 100-byte messages
(the ``htmqc produce`` format) and reports the produce time too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from htmqc.broker import start_broker, wait_reachable
from htmqc.errors import HtmqcError, UsageError
from htmqc.kafka_defaults import consumer_config
from htmqc.produce import produce

MODES = ("raw", "naive")
BATCH = 500

Handler = Callable[[Message], object]


def count_bytes(message: Message) -> int:
    """The default per-message handler: a Python call that touches the value."""
    value = message.value()
    return len(value) if value is not None else 0


def run(
    bootstrap: str,
    topic: str,
    count: int,
    mode: str = "raw",
    *,
    group: str | None = None,
    handler: Handler = count_bytes,
    timeout: float = 300.0,
    poll_timeout: float = 0.5,
) -> dict[str, Any]:
    """Consume ``count`` messages of ``topic`` with the ``mode`` loop; return figures.

    Raises :class:`TimeoutError` if ``count`` messages do not arrive within
    ``timeout`` seconds. Result keys: ``mode``, ``count``, ``seconds``,
    ``rate`` (msg/s, first to ``count``-th message), ``join_seconds``,
    ``commits`` (commit requests made), ``commit_acks`` (asynchronous commits
    acknowledged by the broker; synchronous ones do not count),
    ``commit_errors``, ``load_1m``.
    """
    if mode not in MODES:
        raise UsageError(f"unknown mode {mode!r}", f"use one of {', '.join(MODES)}")
    if count <= 0:
        raise UsageError(f"--count must be positive, got {count}", "pass --count 1 or more")
    load = os.getloadavg()[0]
    commit_errors = [0]
    commit_acks = [0]

    def on_commit(err: KafkaError | None, _partitions: list[TopicPartition]) -> None:
        if err is not None:
            commit_errors[0] += 1
        else:
            commit_acks[0] += 1

    overrides = {"on_commit": on_commit}
    consumer = Consumer(
        consumer_config(bootstrap, group or f"raw-loop-{uuid.uuid4().hex[:8]}", overrides)
    )
    consumer.subscribe([topic])
    subscribed = time.perf_counter()
    first = last = 0.0
    seen = commits = 0
    deadline = time.monotonic() + timeout
    try:
        while seen < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{mode}: got {seen} of {count} messages in {timeout:g}s")
            batch = consumer.consume(num_messages=BATCH, timeout=poll_timeout)
            if not batch:
                continue
            if not first:
                first = time.perf_counter()
            next_offsets: dict[tuple[str, int], int] = {}
            for message in batch:
                if message.error() is not None:
                    continue
                handler(message)
                seen += 1
                if mode == "naive":
                    consumer.commit(message=message, asynchronous=False)
                    commits += 1
                else:
                    key = cast(tuple[str, int], (message.topic(), message.partition()))
                    next_offsets[key] = cast(int, message.offset()) + 1
                if seen == count:
                    last = time.perf_counter()
                    break
            if next_offsets:
                consumer.store_offsets(
                    offsets=[TopicPartition(t, p, o) for (t, p), o in next_offsets.items()]
                )
                consumer.commit(asynchronous=True)
                commits += 1
        if mode == "raw":
            # after the measurement: wait for the last batch's offsets to be durable
            try:
                consumer.commit(asynchronous=False)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._NO_OFFSET:  # all already committed
                    raise
        consumer.poll(0)  # deliver outstanding commit callbacks
    finally:
        consumer.close()
    seconds = last - first
    return {
        "mode": mode,
        "count": count,
        "seconds": round(seconds, 3),
        "rate": round(count / seconds) if seconds > 0 else None,
        "join_seconds": round(first - subscribed, 3),
        "commits": commits,
        "commit_acks": commit_acks[0],
        "commit_errors": commit_errors[0],
        "load_1m": round(load, 2),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.raw_loop",
        description="Raw confluent-kafka consume loop baseline (see module docstring).",
    )
    parser.add_argument("--bootstrap", help="broker to read from (omit with --start-broker)")
    parser.add_argument("--topic", default=None, help="topic to read (default with --start-broker)")
    parser.add_argument("--count", type=int, required=True, help="messages to consume")
    parser.add_argument("--mode", choices=MODES, default="raw")
    parser.add_argument("--group", default=None, help="consumer group (default: a fresh one)")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after SECONDS")
    parser.add_argument(
        "--start-broker",
        action="store_true",
        help="start the bundled broker and produce --count messages first",
    )
    parser.add_argument("--partitions", type=int, default=8, help="with --start-broker")
    parser.add_argument("--size", type=int, default=100, help="with --start-broker")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    return parser


def _main(args: argparse.Namespace) -> dict[str, Any]:
    if args.count <= 0:
        raise UsageError(f"--count must be positive, got {args.count}", "pass --count 1 or more")
    if args.start_broker:
        topic = args.topic or "raw-loop"
        with start_broker() as broker:
            made = produce(
                broker.bootstrap,
                topic,
                args.count,
                size=args.size,
                partitions=args.partitions,
                progress=sys.stderr.isatty(),
            )
            result = run(broker.bootstrap, topic, args.count, args.mode, timeout=args.timeout)
            result["produce_seconds"] = round(made.seconds, 3)
            result["produce_rate"] = round(made.rate)
            result["partitions"] = args.partitions
            return result
    if not args.bootstrap or not args.topic:
        raise UsageError("--bootstrap and --topic are required", "pass both, or --start-broker")
    wait_reachable(args.bootstrap, timeout=5.0)
    return run(
        args.bootstrap, args.topic, args.count, args.mode, group=args.group, timeout=args.timeout
    )


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; prints the result as one JSON line."""
    args = _parser().parse_args(argv)
    try:
        result = _main(args)
    except HtmqcError as exc:
        print(f"raw_loop: error: {exc.line()}", file=sys.stderr)
        return exc.exit_code
    except TimeoutError as exc:
        print(f"raw_loop: error: {exc}; check the topic holds --count messages", file=sys.stderr)
        return 1
    line = json.dumps(result)
    print(line)
    if args.json is not None:
        args.json.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
