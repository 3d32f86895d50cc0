"""The worst gap between two polls, whatever the handler takes.

An engine runs a handler that sleeps ``0 ms``, ``100 ms``, ``2 s`` or ``30 s``
per message against the bundled broker (2 partitions; at-least-once with one
worker, and exactly-once into SQLite) for ``--seconds`` after its first
handler call; a wrapper around the ``confluent_kafka.Consumer`` notes when each
``consume`` starts. Printed and stored (``benchmarks/results/poll_gap.json``)
per variant: the worst gap between two consecutive ``consume`` calls, the
99th percentile, the number of polls, the messages finished, and how long
the engine took to stop (``--shutdown-seconds`` is 1 here). Before issue
16 handlers ran on the poll thread in slices checked only between chunks of 250
messages, so one chunk of 2 s messages kept the poll loop away for minutes and
``max.poll.interval.ms`` (10 s on loopback) expired.

Run: ``HTMQC_CONTRACTS=0 python -m benchmarks.poll_gap``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from itertools import pairwise
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

RESULTS = Path(__file__).resolve().parent / "results" / "poll_gap.json"
SLEEPS = (0.0, 0.1, 2.0, 30.0)


class RecordingConsumer:
    """A ``confluent_kafka.Consumer`` that notes when each ``consume`` starts."""

    def __init__(self, inner: Consumer) -> None:
        self.inner = inner
        self.calls: list[float] = []

    def consume(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(time.monotonic())
        return self.inner.consume(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def poll_gaps(
    bootstrap: str, topic: str, mode: str, seconds: float, run_for: float, tmp: Path
) -> dict[str, Any]:
    """Run an engine whose handler sleeps ``seconds`` for ``run_for`` seconds
    after its first call; return the gaps between its polls and what it finished."""
    from htmqc.kafka_defaults import consumer_config
    from htmqc.runtime import Engine, RunOptions
    from htmqc.sinks import open_sink

    started = threading.Event()

    def slow(msg: Any, tx: Any = None) -> None:
        started.set()
        if seconds:
            time.sleep(seconds)

    group = f"g-gap-{uuid.uuid4().hex[:6]}"
    sink, extra = None, {}
    if mode == "exactly-once":
        url = f"sqlite:///{tmp / f'{group}.db'}"
        sink, extra = open_sink(url), {"sink": url}
        sink.open(group)
    opts = RunOptions(
        bootstrap=bootstrap, topic=topic, group=group, mode=mode, shutdown_seconds=1.0, **extra
    )
    engines: list[Any] = []
    config = consumer_config(bootstrap, group)
    config["on_commit"] = lambda err, parts: engines[0].on_commit(err, parts)
    consumer = RecordingConsumer(Consumer(config))
    handler = slow if mode == "exactly-once" else (lambda msg: slow(msg))
    engine = Engine(handler, opts, consumer, sink=sink)  # type: ignore[arg-type]
    engines.append(engine)
    runner = threading.Thread(target=lambda: engine.run(install_signals=False), daemon=True)
    runner.start()
    if not started.wait(60):
        raise RuntimeError("no handler call within 60 s")
    time.sleep(run_for)
    calls = list(consumer.calls)
    stopping = time.monotonic()
    engine.stop()
    runner.join(30)
    if runner.is_alive():
        raise RuntimeError("the engine did not stop")
    stopped = time.monotonic() - stopping
    gaps = sorted(b - a for a, b in pairwise(calls))
    return {
        "mode": mode,
        "handler_s": seconds,
        "worst_gap_s": round(gaps[-1], 4),
        "p99_gap_s": round(gaps[int(0.99 * (len(gaps) - 1))], 4),
        "median_gap_s": round(statistics.median(gaps), 4),
        "polls": len(calls),
        "finished": engine.finished,
        "stop_s": round(stopped, 3),
    }


def main(argv: list[str] | None = None) -> int:
    """Measure every variant; print and store the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="run time per variant")
    parser.add_argument("--messages", type=int, default=200_000)
    args = parser.parse_args(argv)
    from htmqc.broker import create_topic, start_broker
    from htmqc.produce import produce

    rows = []
    with start_broker() as broker, tempfile.TemporaryDirectory() as tmp:
        topic = f"gap-{uuid.uuid4().hex[:6]}"
        create_topic(broker.bootstrap, topic, 2)
        produce(broker.bootstrap, topic, args.messages, keys=1000)
        for mode in ("at-least-once", "exactly-once"):
            for seconds in SLEEPS:
                row = poll_gaps(broker.bootstrap, topic, mode, seconds, args.seconds, Path(tmp))
                rows.append(row)
                print(json.dumps(row), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"seconds": args.seconds, "runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HTMQC_CONTRACTS", "0")
    sys.exit(main())
