"""A seeded schedule of handler faults for ``htmqc replay --faults SEED``.

The schedule is a pure function of ``(seed, rate, number of records)``: one
``random.Random(seed)`` stream walks the records in segment order; record
``i`` gets a fault with probability ``rate``, and then fails its first
``k`` attempts, ``k`` drawn uniformly from ``1..max_failures`` (default 4:
with the default 3 retries, ``k = 4`` ends in the dead-letter queue). Attempts
are counted per record index, across redeliveries, so the same seed gives the
same failures in the same places on every replay.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class InjectedFault(RuntimeError):
    """The exception a scheduled fault raises in place of the handler."""


@dataclass
class FaultSchedule:
    """``failures[i]``: how many attempts of record ``i`` fail (see module docs)."""

    seed: int
    rate: float
    failures: Mapping[int, int]
    attempts: dict[int, int] = field(default_factory=dict)
    injected: int = 0

    @classmethod
    def build(
        cls, seed: int, records: int, rate: float = 0.02, max_failures: int = 4
    ) -> FaultSchedule:
        """The schedule for ``records`` records.

        :raises ValueError: ``rate`` outside ``[0, 1]`` or ``max_failures < 1``.
        """
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"fault rate must be in [0, 1], got {rate}")
        if max_failures < 1:
            raise ValueError(f"max_failures must be >= 1, got {max_failures}")
        rng = random.Random(seed)
        failures: dict[int, int] = {}
        for i in range(records):
            hit = rng.random() < rate
            k = rng.randint(1, max_failures)  # drawn for every record: stable stream
            if hit:
                failures[i] = k
        return cls(seed=seed, rate=rate, failures=failures)

    def wrap(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        """``handler`` with the schedule applied (messages need an ``index``)."""
        failures, attempts = self.failures, self.attempts

        def faulty(msg: Any, *args: Any) -> Any:
            k = failures.get(msg.index)
            if k is not None:
                n = attempts[msg.index] = attempts.get(msg.index, 0) + 1
                if n <= k:
                    self.injected += 1
                    raise InjectedFault(f"injected fault {n}/{k} at record {msg.index}")
            return handler(msg, *args)

        return faulty
