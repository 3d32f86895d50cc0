"""What every contender shares: the trivial handler, the meter, the result shape.

The handler is the same for all contenders: parse the message id from the
value (``htmqc produce`` format, :func:`htmqc.produce.parse_id`) and add it to
a running sum. :class:`Meter` wraps it and records:

- ``rate``: messages per second from the first message to the ``count``-th
  (group joins and start-up excluded);
- ``cpu_s_per_million``: process CPU seconds (user + system, every thread,
  librdkafka's included) between those two messages, scaled to 10^6 messages;
- ``peak_rss_mib``: the process's peak resident set (``VmHWM``); each
  contender runs in its own process, so this is the contender's alone;
- with ``latency=True``: end-to-end latency samples, now minus the message's
  produce timestamp (CreateTime, ms), kept only for messages produced after
  the contender received its first message (so the group join is excluded);
- with ``ids_path``: every id handled, one per line, written to the OS as it
  is handled (line-buffered), for duplicate counting after a SIGKILL.

Stdlib only, so any contender's process (even another virtualenv) can import it;
:func:`parse_id` repeats :func:`htmqc.produce.parse_id` for that reason.
"""

from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass, field
from typing import IO, Any

ID_WIDTH = 12  # htmqc.produce.ID_WIDTH


def parse_id(value: bytes) -> int:
    """The message number in a value written by ``htmqc produce``."""
    return int(value[:ID_WIDTH])


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB.

    ``VmHWM`` from ``/proc/self/status``: Linux keeps ``ru_maxrss`` across
    ``execve``, so a worker would report its parent's peak if it was larger.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@dataclass
class Meter:
    """Counts handled messages and times the first to the ``count``-th."""

    count: int
    latency: bool = False
    ids_path: str | None = None
    seen: int = 0
    total: int = 0
    first_at: float = 0.0
    last_at: float = 0.0
    first_cpu: float = 0.0
    last_cpu: float = 0.0
    first_wall_ms: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    _ids_file: IO[str] | None = None

    @property
    def done(self) -> bool:
        """Whether ``count`` messages were handled."""
        return self.seen >= self.count

    def handle(self, value: bytes | None, timestamp_ms: float | None = None) -> None:
        """The trivial handler plus bookkeeping: parse the id, add it to the sum."""
        if self.seen == 0:
            self.first_at = time.perf_counter()
            self.first_cpu = cpu_seconds()
            self.first_wall_ms = time.time() * 1000.0
        ident = parse_id(value or b"0")
        self.total += ident
        self.seen += 1
        if self.latency and timestamp_ms is not None and timestamp_ms >= self.first_wall_ms:
            self.latencies_ms.append(time.time() * 1000.0 - timestamp_ms)
        if self.ids_path is not None:
            self._write_id(ident)
        if self.seen == self.count:
            self.last_at = time.perf_counter()
            self.last_cpu = cpu_seconds()

    def _write_id(self, ident: int) -> None:
        """Append ``ident`` to ``ids_path``, handed to the OS at once (survives SIGKILL)."""
        if self._ids_file is None:
            self._ids_file = open(self.ids_path or "", "a", buffering=1)  # noqa: SIM115
        self._ids_file.write(f"{ident}\n")

    def close(self) -> None:
        """Close the id file, if any."""
        if self._ids_file is not None:
            self._ids_file.close()
            self._ids_file = None

    def result(self, contender: str, mode: str, **extra: Any) -> dict[str, Any]:
        """The figures every contender reports (see the module docstring)."""
        self.close()
        seconds = self.last_at - self.first_at if self.done else 0.0
        cpu = self.last_cpu - self.first_cpu if self.done else 0.0
        out: dict[str, Any] = {
            "contender": contender,
            "mode": mode,
            "count": self.count,
            "seen": self.seen,
            "seconds": round(seconds, 4),
            "rate": round(self.count / seconds) if seconds > 0 else None,
            "cpu_s_per_million": round(cpu * 1_000_000 / self.count, 3) if seconds > 0 else None,
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "checksum": self.total,
        }
        if self.latency:
            out["latency_ms"] = latency_summary(self.latencies_ms)
            step = max(1, len(self.latencies_ms) // 2000)  # at most ~2,000 kept for the CDF
            out["latency_samples_ms"] = [round(x, 2) for x in self.latencies_ms[::step]]
        out.update(extra)
        return out


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The ``q``-quantile (0..1) of ``sorted_values`` by nearest rank; None if empty."""
    if not sorted_values:
        return None
    rank = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[rank]


def latency_summary(samples: list[float]) -> dict[str, Any]:
    """``{"n", "p50", "p99", "p999", "max"}`` in milliseconds."""
    ordered = sorted(samples)
    quantiles = (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))
    pick = {name: percentile(ordered, q) for name, q in quantiles}
    return {
        "n": len(ordered),
        **{k: round(v, 2) if v is not None else None for k, v in pick.items()},
        "max": round(ordered[-1], 2) if ordered else None,
    }
