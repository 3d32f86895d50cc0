"""Errors the core raises.

Every error is a :class:`CoreError`. The core raises only for events that can
never happen in a correct runtime (a bug in the caller); events that are merely
*late* (an ack or a completion for a partition that was revoked, or from an
earlier assignment) are not errors: the core ignores them and says so in its
return value.
"""

from __future__ import annotations


class CoreError(Exception):
    """Base class of everything the core raises."""


class IllegalTransition(CoreError):
    """An event that the transition table does not allow in the current state.

    Examples: completing an offset twice, completing an offset that was never
    fetched, starting a message that is already running, acking a commit that
    was never requested.
    """


class OffsetOrderError(CoreError):
    """Offsets that break Kafka's per-partition order.

    Examples: a fetched batch that starts below ``next`` or is not strictly
    increasing, an assignment at a negative offset.
    """


class NotAssigned(CoreError):
    """A partition this consumer does not hold was asked for by name
    (:meth:`ConsumerCore.tracker`). Events for a partition not held are late
    and ignored instead (``False``, ``None`` or nothing to run), never this."""
