"""``htmqc run MODULE:FUNCTION ...``: consume a topic with a handler.

Options come from the command line, ``HTMQC_*`` variables and a TOML file
(see :mod:`htmqc.config`). Exit codes: 0 after a clean stop (signal,
``--max-messages``, ``--idle-exit``), 2 for bad input, 1 for runtime failures.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from htmqc.config import parse_pairs, redacted, resolve
from htmqc.logs import setup as setup_logging
from htmqc.runtime.options import OPTIONS, REQUIRED_VALUE, RunOptions

#: Attributes of the parsed command line that are not :class:`RunOptions` fields.
_NOT_OPTIONS = frozenset({"kafka_config", "config", "func", "log_level"})


def register(subparsers: Any) -> None:
    """Add the ``run`` subcommand."""
    p = subparsers.add_parser(
        "run",
        help="consume a topic with a handler (at-least-once or exactly-once)",
        description="Consume --topic with MODULE:FUNCTION (def or async def). at-least-once "
        "calls handler(msg); exactly-once calls handler(msg, tx) inside the sink transaction.",
    )
    p.add_argument("handler", metavar="MODULE:FUNCTION")
    for o in OPTIONS:  # one flag per option of the schema (htmqc.runtime.options)
        default = None if o.default is REQUIRED_VALUE else o.default
        shown = (
            "" if default in (None, False, "")
            else f" ({default:g})" if isinstance(default, float)
            else f" ({default})"
        )
        if o.kind is bool:
            # A switch that is on by default is also offered as --no-FLAG.
            action = argparse.BooleanOptionalAction if o.default is True else "store_true"
            p.add_argument(o.flag, action=action, default=None, help=o.spec.help)
            continue
        p.add_argument(
            o.flag,
            type=o.kind,
            choices=o.spec.choices,
            metavar=o.spec.metavar,
            help=o.spec.help + shown,
        )
    p.add_argument(
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting (repeatable)",
    )
    p.add_argument("--config", help="TOML file with these options ([run] and [kafka])")
    p.add_argument("--log-level", default="INFO", help="logging level (INFO)")
    p.set_defaults(func=main)


def current_directory_on_path() -> None:
    """Put the working directory first on ``sys.path`` (if it is not there), as
    ``python -m`` does, so ``htmqc run mymodule:handle`` finds ``./mymodule.py``."""
    cwd = os.getcwd()
    if cwd not in {os.path.abspath(p) for p in sys.path}:
        sys.path.insert(0, cwd)


def options_of(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> RunOptions:
    """The options ``htmqc run`` runs with, from its parsed command line ``args``,
    the ``HTMQC_*`` variables of ``environ`` (default: the process's) and the
    ``--config`` file (:func:`htmqc.config.resolve`).

    :raises UsageError: a missing or invalid option.
    """
    cli = {k: v for k, v in vars(args).items() if k not in _NOT_OPTIONS}
    return resolve(
        cli,
        parse_pairs(args.kafka_config, "--kafka-config"),
        config_file=args.config,
        environ=environ,
    )


def main(args: argparse.Namespace) -> int:
    """Resolve the options and run."""
    from htmqc.api import Consumer
    from htmqc.runtime import load_handler
    from htmqc.sinks import redact_url

    current_directory_on_path()

    options = options_of(args)
    setup_logging(args.log_level, options.log_format)
    # The bootstrap may be a URL with a query (another log's TLS files): the topic
    # is named on its own, and librdkafka settings only where they apply.
    kafka = f" kafka {redacted(options.kafka_config)}" if options.source == "kafka" else ""
    logging.getLogger("htmqc.runtime").info(
        "run %s: source %s at %s, topic %s, group %s, mode %s, sink %s%s",
        args.handler,
        options.source,
        options.bootstrap,
        options.topic,
        options.group,
        options.mode,
        redact_url(options.sink) if options.sink else "-",
        kafka,
    )
    finished = Consumer.from_options(options, load_handler(args.handler)).run()
    logging.getLogger("htmqc.runtime").info("finished %d messages", finished)
    return 0
