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
- with ``latency="handler"``: end-to-end latency samples, the moment the
  handler finished minus the message's produce timestamp (CreateTime, ms);
  with ``latency="commit"`` (the exactly-once contenders): the moment the
  transaction holding the message committed (the effect becomes visible only
  then) minus the produce timestamp; the contender calls :meth:`Meter.committed`
  right after each commit returns. Only messages produced after the contender
  received its first message count (so the group join is excluded);
- with ``store``: the handler's *effect*, one row ``(id, key, partition,
  offset)`` per handled message in the ``effects`` table of that SQLite file,
  committed per handler call (autocommit), the way a plain at-least-once
  handler writes a database; :mod:`htmqc.audit` counts duplicates from it;
- with ``journal``: every handled id, one per line, and a line ``C`` after
  every commit (:meth:`Meter.committed`), handed to the OS line by line (it
  survives SIGKILL): which ids were in the transaction open at the kill;
- with ``kill_at``: the process sends itself SIGKILL right after the
  ``kill_at``-th handler call finished (its effect written, nothing after it
  committed): the fixed crash point of the duplicate measurement.

Stdlib only, so any contender's process (even another virtualenv) can import it;
:func:`parse_id` repeats :func:`htmqc.produce.parse_id` for that reason.
"""

from __future__ import annotations

import math
import os
import resource
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

ID_WIDTH = 12  # htmqc.produce.ID_WIDTH
LATENCY_MODES = ("handler", "commit")
EFFECTS_TABLE = "effects"
#: The effect table every SQLite store uses (the columns :mod:`htmqc.audit.load` reads).
CREATE_EFFECTS = (
    f'CREATE TABLE IF NOT EXISTS {EFFECTS_TABLE} (id INTEGER NOT NULL, "key" TEXT, '
    '"partition" INTEGER, "offset" INTEGER)'
)
INSERT_EFFECT = (
    f'INSERT INTO {EFFECTS_TABLE} (id, "key", "partition", "offset") VALUES (?, ?, ?, ?)'
)


def latency_point(mode: str) -> str:
    """Where latency ends for ``mode``: ``"commit"`` if exactly-once, else ``"handler"``."""
    return "commit" if mode.startswith("exactly-once") else "handler"


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


def open_store(path: str) -> sqlite3.Connection:
    """An autocommit connection to the SQLite effect store at ``path`` (table created).

    WAL with ``synchronous=OFF``: a committed row is in the OS once the
    statement returns, so it survives the process's SIGKILL (not a power cut,
    which this benchmark does not simulate).
    """
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute(CREATE_EFFECTS)
    return conn


def _text(key: bytes | str | None) -> str | None:
    if key is None or isinstance(key, str):
        return key
    return key.decode(errors="replace")


@dataclass
class Meter:
    """Counts handled messages and times the first to the ``count``-th.

    Thread-safe: a contender may call :meth:`handle` and :meth:`committed`
    from different threads.
    """

    count: int
    latency: str | None = None  # None, "handler" or "commit"
    store: str | None = None
    kill_at: int | None = None
    journal: str | None = None
    seen: int = 0
    total: int = 0
    first_at: float = 0.0
    last_at: float = 0.0
    first_cpu: float = 0.0
    last_cpu: float = 0.0
    first_wall_ms: float = 0.0
    commits: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    _pending_ms: list[float] = field(default_factory=list)
    _conn: sqlite3.Connection | None = None
    _journal: IO[str] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.latency not in (None, *LATENCY_MODES):
            raise ValueError(f"latency must be None or one of {LATENCY_MODES}, "
                             f"got {self.latency!r}")

    @property
    def done(self) -> bool:
        """Whether ``count`` messages were handled."""
        return self.seen >= self.count

    def handle(
        self,
        value: bytes | None,
        timestamp_ms: float | None = None,
        key: bytes | str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        """The trivial handler plus bookkeeping: parse the id, add it to the sum.

        With ``store`` the effect row is written (and committed) first; with
        ``kill_at`` the process dies right after the ``kill_at``-th call.
        """
        with self._lock:
            if self.seen == 0:
                self.first_at = time.perf_counter()
                self.first_cpu = cpu_seconds()
                self.first_wall_ms = time.time() * 1000.0
            ident = parse_id(value or b"0")
            if self.store is not None:
                if self._conn is None:
                    self._conn = open_store(self.store)
                self._conn.execute(INSERT_EFFECT, (ident, _text(key), partition, offset))
            if self.journal is not None:
                self._journal_line(f"{ident}\n")
            self.total += ident
            self.seen += 1
            if (self.latency is not None and timestamp_ms is not None
                    and timestamp_ms >= self.first_wall_ms):
                if self.latency == "handler":
                    self.latencies_ms.append(time.time() * 1000.0 - timestamp_ms)
                else:
                    self._pending_ms.append(timestamp_ms)
            if self.seen == self.count:
                self.last_at = time.perf_counter()
                self.last_cpu = cpu_seconds()
            if self.kill_at is not None and self.seen >= self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    def committed(self) -> None:
        """The transaction holding every message handled so far has committed.

        With ``latency="commit"`` each pending message's latency is now minus
        its produce timestamp.
        """
        now_ms = time.time() * 1000.0
        with self._lock:
            self.commits += 1
            if self.journal is not None:
                self._journal_line("C\n")
            self.latencies_ms.extend(now_ms - ts for ts in self._pending_ms)
            self._pending_ms.clear()

    def _journal_line(self, line: str) -> None:
        if self._journal is None:
            self._journal = open(self.journal or "", "a", buffering=1)  # noqa: SIM115
        self._journal.write(line)

    def close(self) -> None:
        """Close the effect store and the journal, if any."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._journal is not None:
            self._journal.close()
            self._journal = None

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
        if self.latency is not None:
            out["latency_at"] = self.latency
            out["latency_ms"] = latency_summary(self.latencies_ms)
            step = max(1, len(self.latencies_ms) // 2000)  # at most ~2,000 kept for the CDF
            out["latency_samples_ms"] = [round(x, 2) for x in sorted(self.latencies_ms)[::step]]
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
