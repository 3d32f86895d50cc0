"""Failure classification and retry backoff: pure decisions.

A handler failure has a :class:`FailureKind`. ``PERMANENT`` failures go to the
dead-letter queue at once; ``RETRYABLE`` and ``UNKNOWN`` ones are retried until
the message has failed ``max_retries + 1`` times, then dead-lettered.

The backoff is exponential with *full jitter* (AWS architecture blog, "Exponential
Backoff And Jitter"): the n-th retry waits ``jitter * min(cap, base * 2**(n-1))``
seconds, where ``jitter`` is a uniform random number in ``[0, 1]`` that the
caller draws (the core owns no random source, so a seed reproduces a run).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import icontract

from htmqc.core.contracts import ENABLED


class FailureKind(enum.Enum):
    """How a handler failure is classified."""

    RETRYABLE = "retryable"
    PERMANENT = "permanent"
    UNKNOWN = "unknown"


class Retryable(Exception):
    """Raise (or subclass) in a handler for a failure worth retrying."""


class Permanent(Exception):
    """Raise (or subclass) in a handler for a failure no retry can fix: the
    message goes to the dead-letter queue at once."""


def classify(
    exc: BaseException, mapping: Mapping[type[BaseException], FailureKind] | None = None
) -> FailureKind:
    """The kind of a handler's exception.

    ``mapping`` lets users classify their own (or third-party) exception types; the
    most specific class in the exception's MRO that appears in ``mapping`` wins. Then
    :class:`Retryable` and :class:`Permanent`; anything else is ``UNKNOWN``."""
    if mapping:
        for cls in type(exc).__mro__:
            kind = mapping.get(cls)
            if kind is not None:
                return kind
    if isinstance(exc, Permanent):
        return FailureKind.PERMANENT
    if isinstance(exc, Retryable):
        return FailureKind.RETRYABLE
    return FailureKind.UNKNOWN


#: The exponent is clamped here so ``2**n`` can never overflow a float.
_MAX_EXPONENT = 1000


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When to retry a failed message and how long to wait.

    ``max_retries``: retries after the first failure (0 = dead-letter on the first
    failure). ``base_delay``/``max_delay``: seconds, ``0 <= base <= max``.
    """

    max_retries: int = 3
    base_delay: float = 0.1
    max_delay: float = 30.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if not 0 <= self.base_delay <= self.max_delay:
            raise ValueError(
                f"need 0 <= base_delay <= max_delay, got {self.base_delay} and {self.max_delay}"
            )

    @icontract.require(lambda attempt: attempt >= 1, enabled=ENABLED)
    @icontract.require(lambda jitter: 0.0 <= jitter <= 1.0, enabled=ENABLED)
    @icontract.ensure(lambda self, result: 0.0 <= result <= self.max_delay, enabled=ENABLED)
    def delay(self, attempt: int, jitter: float) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        exponent = min(attempt - 1, _MAX_EXPONENT)
        ceiling = min(self.max_delay, self.base_delay * 2.0**exponent)
        return min(self.max_delay, max(0.0, jitter * ceiling))
