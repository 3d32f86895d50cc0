"""One CPU for htmqc's Python threads (``--python-cpu``).

Contract
--------
:func:`check` refuses a CPU this process may not use (``build_engine`` asks before
anything connects); :func:`pin` sets the calling thread's CPU affinity to ``{cpu}`` and
returns the set it had; :func:`unpin` gives it back. On Linux a thread starts with the
affinity of the thread that starts it, so the engine pins its poll thread after the
consumer exists (librdkafka's threads are already running, and keep every CPU) and
before it starts its workers: the poll loop, the handler threads and whatever the poll
thread starts later share one CPU, librdkafka's fetchers and the broker the others.
:meth:`~htmqc.runtime.Engine.run` unpins the poll thread when it returns.

Why: the two Python threads take turns on the GIL anyway; on two CPUs what they share
(each message is built on the poll thread and read, then freed, on a worker; the
interpreter's own state) moves between the CPUs' caches at every turn, on one it does
not (the likely mechanism: the cost of the two CPUs is measured, its parts are not).
Measured (benchmarks/README.md, "One CPU for the Python threads"): at-least-once on the
bundled broker 10 % more throughput, on Apache Kafka 0.95x and 1.05x the raw loop at
100 B and 1 KiB instead of 0.81x and 0.89x. The
cost, why it is not the default: a handler that releases the GIL to compute (a C
extension, compression) then shares its CPU with the poll loop, and several consumers
pinned to the same CPU share it even when others are idle.

:raises UsageError: the CPU is not one this process may run on, or the platform has no
    ``sched_setaffinity`` (only Linux has it).
"""

from __future__ import annotations

import os

from htmqc.errors import UsageError

#: The calling thread, for ``sched_setaffinity`` (on Linux: the thread, not the process).
_THIS_THREAD = 0


def _ranges(cpus: set[int]) -> str:
    """``{0, 1, 2, 5}`` as ``0-2,5``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def check(cpu: int) -> set[int]:
    """The calling thread's affinity now, if ``cpu`` is in it (else :class:`UsageError`)."""
    if not hasattr(os, "sched_setaffinity"):
        raise UsageError(
            "--python-cpu needs sched_setaffinity, which this platform lacks (Linux has it)",
            "leave --python-cpu out",
        )
    allowed = os.sched_getaffinity(_THIS_THREAD)
    if cpu not in allowed:
        raise UsageError(
            f"--python-cpu {cpu} is not a CPU this process may run on "
            f"(allowed: {_ranges(allowed)})",
            "give one of the allowed CPUs, or leave --python-cpu out",
        )
    return allowed


def pin(cpu: int) -> set[int]:
    """Pin the calling thread (and the threads it starts from now on) to ``cpu``;
    return its affinity before, for :func:`unpin`."""
    before = check(cpu)
    os.sched_setaffinity(_THIS_THREAD, {cpu})
    return before


def unpin(before: set[int]) -> None:
    """Give the calling thread back the affinity :func:`pin` returned."""
    os.sched_setaffinity(_THIS_THREAD, before)
