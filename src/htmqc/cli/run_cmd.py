"""``htmqc run MODULE:FUNCTION ...``: consume a topic with a handler.

Options come from the command line, ``HTMQC_*`` variables and a TOML file
(see :mod:`htmqc.config`). Exit codes: 0 after a clean stop (signal,
``--max-messages``, ``--idle-exit``), 2 for bad input, 1 for runtime failures.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from htmqc.config import parse_pairs, redacted, resolve
from htmqc.logs import setup as setup_logging
from htmqc.runtime.options import FLOWS, GROUP_PROTOCOLS, LOG_FORMATS, MODES


def register(subparsers: Any) -> None:
    """Add the ``run`` subcommand."""
    p = subparsers.add_parser(
        "run",
        help="consume a topic with a handler (at-least-once or exactly-once)",
        description="Consume --topic with MODULE:FUNCTION (def or async def). at-least-once "
        "calls handler(msg); exactly-once calls handler(msg, tx) inside the sink transaction.",
    )
    p.add_argument("handler", metavar="MODULE:FUNCTION")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers HOST:PORT")
    p.add_argument("--topic")
    p.add_argument("--group", help="consumer group")
    p.add_argument("--mode", choices=MODES)
    p.add_argument("--sink", help="sqlite:///PATH | postgresql://... | kafka:TOPIC (exactly-once)")
    p.add_argument("--workers", type=int, help="handler threads (at-least-once; default 1)")
    p.add_argument("--max-in-flight", type=int, help="unfinished messages before pausing (10000)")
    p.add_argument("--txn-messages", type=int, help="messages per sink transaction (1000)")
    p.add_argument("--txn-ms", type=float, help="milliseconds per sink transaction (100)")
    p.add_argument("--commit-ms", type=float, help="at-least-once commit interval (500)")
    p.add_argument(
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting (repeatable)",
    )
    p.add_argument("--config", help="TOML file with these options ([run] and [kafka])")
    p.add_argument(
        "--create-topic", type=int, metavar="PARTITIONS", help="create the topic if it is missing"
    )
    p.add_argument(
        "--member-id",
        help="stable name of this member (transactional id, static membership); unique per "
        "live member",
    )
    p.add_argument(
        "--group-protocol",
        choices=GROUP_PROTOCOLS,
        help="consumer-group protocol: classic (default) or consumer (KIP-848, Kafka 4+)",
    )
    p.add_argument("--max-messages", type=int, help="stop after N messages finished")
    p.add_argument(
        "--idle-exit", type=float, metavar="SECONDS", help="stop when nothing arrived for SECONDS"
    )
    p.add_argument("--max-message-bytes", type=int, help="dead-letter larger messages")
    p.add_argument("--shutdown-seconds", type=float, help="bound on waiting for running work (10)")
    p.add_argument(
        "--sink-retry-seconds",
        type=float,
        help="how long to reconnect a lost exactly-once database before exit 1 (60)",
    )
    p.add_argument("--batch-size", type=int, help="messages per consume() call (1000)")
    p.add_argument("--connect-seconds", type=float, help="how long to wait for the broker (10)")
    p.add_argument("--trace", metavar="FILE", help="append core transitions as JSON lines")
    p.add_argument("--max-retries", type=int, help="retries before dead-lettering (3)")
    p.add_argument(
        "--permanent-errors", metavar="MODULE:CLASS,...", help="exception types never retried"
    )
    p.add_argument(
        "--retryable-errors", metavar="MODULE:CLASS,...", help="exception types always retried"
    )
    p.add_argument("--backoff-ms", type=float, help="first retry backoff, full jitter (100)")
    p.add_argument("--backoff-max-ms", type=float, help="backoff cap (30000)")
    p.add_argument(
        "--poison-threshold", type=int, help="failures within --poison-window that make poison (5)"
    )
    p.add_argument("--poison-window", type=float, metavar="SECONDS", help="(60)")
    p.add_argument(
        "--retry-topic",
        action="store_true",
        default=None,
        help="long backoffs wait in <topic>.retry, freeing the partition (breaks per-key order)",
    )
    p.add_argument(
        "--retry-topic-ms", type=float, help="shortest backoff sent to the retry topic (5000)"
    )
    p.add_argument("--flow", choices=FLOWS, help="in-flight window: adaptive (AIMD) or fixed")
    p.add_argument("--min-in-flight", type=int, help="smallest adaptive window (16)")
    p.add_argument(
        "--latency-target-ms", type=float, help="mean handler time that shrinks the window (1000)"
    )
    p.add_argument("--max-in-flight-bytes", type=int, help="value bytes before pausing (256 MiB)")
    p.add_argument(
        "--metrics-port", type=int, help="serve /metrics, /state, /state.json (0: a free port)"
    )
    p.add_argument("--metrics-host", help="address for --metrics-port (127.0.0.1)")
    p.add_argument("--redis-url", help="mirror backpressure into redis://host:port/db")
    p.add_argument("--log-format", choices=LOG_FORMATS, help="text (default) or json")
    p.add_argument(
        "--otel", action="store_true", default=None, help="OpenTelemetry spans (extra: otel)"
    )
    p.add_argument("--log-level", default="INFO", help="logging level (INFO)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Resolve the options and run."""
    from htmqc.runtime import run
    from htmqc.sinks import redact_url

    cli = {
        k: v
        for k, v in vars(args).items()
        if k not in {"kafka_config", "config", "func", "log_level"}
    }
    options = resolve(
        cli, parse_pairs(args.kafka_config, "--kafka-config"), config_file=args.config
    )
    setup_logging(args.log_level, options.log_format)
    logging.getLogger("htmqc.runtime").info(
        "run %s on %s/%s group %s mode %s sink %s kafka %s",
        args.handler,
        options.bootstrap,
        options.topic,
        options.group,
        options.mode,
        redact_url(options.sink) if options.sink else "-",
        redacted(options.kafka_config),
    )
    finished = run(args.handler, options)
    logging.getLogger("htmqc.runtime").info("finished %d messages", finished)
    return 0
