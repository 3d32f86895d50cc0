"""Poison-pill detection: a message that keeps failing fast is taken out at once.

A message is *poison* when it has failed ``threshold`` times within ``window``
seconds (its own failures only; the window is half-open: at ``now`` a failure
at ``now - window`` has left it), whatever the retry budget says: it goes to the
poison dead-letter queue instead of being retried, so one message can never
crash-loop a consumer. The runtime also reports a handler that killed its
worker as a failure here. Memory: one short list of timestamps per message
that has failed and is not finished; :meth:`PoisonDetector.forget` drops it.
"""

from __future__ import annotations

from collections.abc import Hashable

import icontract

from htmqc.core.contracts import ENABLED


class PoisonDetector:
    """Counts each message's recent failures (see module docs). ``threshold`` and
    ``window`` have no defaults here: the runtime's option schema holds them
    (``--poison-threshold``, ``--poison-window``)."""

    def __init__(self, threshold: int, window: float) -> None:
        if threshold < 1:
            raise ValueError(f"threshold must be >= 1, got {threshold}")
        if window <= 0:
            raise ValueError(f"window must be > 0, got {window}")
        self.threshold = threshold
        self.window = window
        self._failures: dict[Hashable, list[float]] = {}

    @icontract.ensure(
        lambda self, message, result: result
        == (len(self._failures.get(message, ())) >= self.threshold),
        "poison exactly when threshold failures lie within the window",
        enabled=ENABLED,
    )
    def failed(self, message: Hashable, now: float) -> bool:
        """Record a failure of ``message`` at ``now``; True if it is now poison.

        Times must not go backwards for one message (a monotonic clock)."""
        times = self._failures.setdefault(message, [])
        times.append(now)
        horizon = now - self.window
        while times and times[0] <= horizon:
            del times[0]
        return len(times) >= self.threshold

    def forget(self, message: Hashable) -> None:
        """The message finished (or its partition went away): drop its history."""
        self._failures.pop(message, None)

    def tracked(self) -> int:
        """How many messages have a failure history."""
        return len(self._failures)
