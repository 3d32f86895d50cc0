"""``htmqc.sinks.encoding`` re-exports the core's text form: one definition."""

from __future__ import annotations

from htmqc.core import position_text
from htmqc.sinks import encoding


def test_the_sinks_use_the_cores_text_form() -> None:
    for name in encoding.__all__:
        assert getattr(encoding, name) is getattr(position_text, name), name
