"""``--commit-metadata-bytes`` for the tools that commit a group's offsets from
outside a running consumer (``htmqc positions``, ``htmqc dlq redrive``).

The same setting as the consumer's (:mod:`htmqc.runtime.options`): the broker's
``offset.metadata.max.bytes``. A commit whose finished-above text would be
longer goes without metadata and its offsets ride in the positions topic only,
instead of being refused by a broker configured below Kafka's default.
"""

from __future__ import annotations

import argparse
import os

from htmqc.core.metadata_budget import DEFAULT_LIMIT, MIN_LIMIT
from htmqc.errors import UsageError

_ENV = "HTMQC_COMMIT_METADATA_BYTES"


def add_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--commit-metadata-bytes N`` (default ``$HTMQC_COMMIT_METADATA_BYTES`` or 4096)."""
    parser.add_argument(
        "--commit-metadata-bytes", type=int, metavar="N",
        default=os.environ.get(_ENV, DEFAULT_LIMIT),
        help="the broker's offset.metadata.max.bytes, as given to the consumer "
        f"(default {DEFAULT_LIMIT}, or ${_ENV}): longer finished-above sets go to "
        "the positions topic only",
    )  # fmt: skip


def from_args(args: argparse.Namespace) -> int:
    """The limit given (the default for a command without the option);
    :raises UsageError: below :data:`MIN_LIMIT`."""
    limit = int(getattr(args, "commit_metadata_bytes", DEFAULT_LIMIT))
    if limit < MIN_LIMIT:
        raise UsageError(
            f"--commit-metadata-bytes must be at least {MIN_LIMIT}, got {limit}",
            f"pass the broker's offset.metadata.max.bytes (default {DEFAULT_LIMIT})",
        )
    return limit
