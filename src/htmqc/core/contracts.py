"""The one switch for runtime contracts.

icontract pre/postconditions guard every core transition. They are on unless
the environment variable ``HTMQC_CONTRACTS`` is ``0`` (or ``false``/``off``)
when :mod:`htmqc.core` is first imported. Turn them off in production and in
benchmarks; keep them on in tests. The switch is read once, at import: the
decorators are then either applied or not applied at all, so disabled
contracts cost nothing on the hot path.

Reading one environment variable at import is the only contact the core has
with its surroundings; it decides which code is loaded, not what it does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final, TypeVar

import icontract


def _enabled(value: str | None) -> bool:
    return (value or "1").strip().lower() not in {"0", "false", "off", "no"}


#: Whether icontract conditions are checked in this process.
ENABLED: Final[bool] = _enabled(os.environ.get("HTMQC_CONTRACTS"))


_F = TypeVar("_F", bound=Callable[..., Any])


def capture_old(capture: Callable[..., Any], name: str) -> Callable[[_F], _F]:
    """``icontract.snapshot`` that follows the switch (icontract's own snapshot
    has no ``enabled`` flag and refuses to stand without a postcondition)."""
    if not ENABLED:
        return lambda func: func
    decorator: Callable[[_F], _F] = icontract.snapshot(capture, name=name)
    return decorator


def keeps_invariant(invariant: Callable[[Any], bool], name: str) -> Callable[[_F], _F]:
    """A postcondition that ``invariant(self)`` holds after the method (a named
    function, not a lambda: icontract reads a failing lambda's source to report
    it, and cannot when it is not written in the decorator itself)."""

    def holds_after(self: Any) -> bool:
        return invariant(self)

    decorator: Callable[[_F], _F] = icontract.ensure(
        holds_after, f"the {name} invariant holds", enabled=ENABLED
    )
    return decorator
