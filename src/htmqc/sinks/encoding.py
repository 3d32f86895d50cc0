"""The text form of ``finished_above`` (re-exported; the one definition is the
core's :mod:`htmqc.core.position_text`, which the commit-metadata budget of
:mod:`htmqc.core.metadata_budget` measures)."""

from __future__ import annotations

from htmqc.core.position_text import (
    MAX_DECODED_OFFSETS,
    METADATA_PREFIX,
    decode_finished,
    decode_metadata,
    encode_finished,
    encode_metadata,
)

__all__ = [
    "MAX_DECODED_OFFSETS",
    "METADATA_PREFIX",
    "decode_finished",
    "decode_metadata",
    "encode_finished",
    "encode_metadata",
]
