"""Handlers the replay tests run (importable by ``htmqc replay`` and ``htmqc run``)."""

from __future__ import annotations

from typing import Any

from examples.effects import record as _record


def record(msg: Any, tx: Any) -> None:
    """Exactly-once: the demo's effect row (``examples.effects:record``)."""
    _record(msg, tx)
