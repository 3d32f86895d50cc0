"""Apache Pulsar throughput: a raw pulsar-client reader loop against htmqc over Pulsar.

One private standalone broker (:mod:`htmqc.sources.pulsar_server`), one partitioned
topic of ``--partitions`` partitions holding ``--count`` x 100-byte messages
(:func:`htmqc.sources.pulsar.produce`, batched, 1,000 keys). Each variant reads the
whole topic, in this process, timed from its first message to its last (connections
and readers' creation left out):

* ``raw_loop``: pulsar-client alone, one non-durable reader per partition from the
  earliest message, each read by its own thread with ``read_next`` (key and
  properties read, as the adapter does), no offset mapping, no position stored: the
  ceiling of this client;
* ``at_least_once``: ``htmqc`` at-least-once (``--source pulsar``), the handler
  counts; commits go to the commit topic;
* ``exactly_once_sqlite``: ``htmqc`` exactly-once into SQLite with the exactly-once
  benchmark's handler (``examples.effects.record``: one INSERT per message).

Every variant runs ``--rounds`` times (default once), interleaved; the medians and
their ratios to ``raw_loop`` are printed and written to
``benchmarks/results/pulsar.json``.

Run with contracts off: ``HTMQC_CONTRACTS=0 python -m benchmarks.pulsar_bench``.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.nats_bench import (
    Producing,
    htmqc_rate,
    produce_topic,
    run_rounds,
    summarize,
    write_results,
)
from htmqc.core import CONTRACTS_ENABLED
from htmqc.sources.pulsar import PulsarClient, partition_topic, produce
from htmqc.sources.pulsar_server import start_pulsar

RESULTS = Path(__file__).resolve().parent / "results" / "pulsar.json"
SOURCE = "pulsar"


def raw_loop(url: str, topic: str, partitions: int, count: int) -> float:
    """msg/s of plain pulsar-client readers: one per partition and thread, from the
    earliest message, reading key, properties and value of each."""
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    readers = [
        client.create_reader(partition_topic(topic, p), pulsar.MessageId.earliest)
        for p in range(partitions)
    ]
    lock = threading.Lock()
    seen = [0]
    first = [0.0]
    done = threading.Event()

    def read(reader: Any) -> None:
        while not done.is_set():
            try:
                msg = reader.read_next(200)
            except pulsar.Timeout:
                continue
            msg.partition_key(), msg.properties(), msg.data(), msg.message_id()
            with lock:
                if not seen[0]:
                    first[0] = time.perf_counter()
                seen[0] += 1
                if seen[0] >= count:
                    done.set()

    threads = [threading.Thread(target=read, args=(r,)) for r in readers]
    try:
        for t in threads:
            t.start()
        done.wait(600)
        rate = count / (time.perf_counter() - first[0])
    finally:
        done.set()
        for t in threads:
            t.join()
        client.close()
    return rate


def _run_variants(
    work: Path,
    args: argparse.Namespace,
    runs: dict[str, list[float]],
    count_only: Callable[[Any], None],
    record: Callable[[Any, Any], None],
) -> None:
    """Start the broker, produce the topic, run every variant ``args.rounds`` times
    (interleaved) into ``runs``; stop the broker."""
    with start_pulsar() as server:
        url, topic = server.bootstrap, "bench"
        produce_topic(Producing(PulsarClient(url), produce), url, topic, args)
        parts = args.partitions
        variants: dict[str, Callable[[int], float]] = {
            "raw_loop": lambda r: raw_loop(server.url, topic, parts, args.count),
            "at_least_once": lambda r: htmqc_rate(
                url, topic, args.count, count_only, source=SOURCE, group=f"bench-alo-{r}"
            ),
            "exactly_once_sqlite": lambda r: htmqc_rate(
                url, topic, args.count, record, source=SOURCE, group=f"bench-eo-{r}",
                mode="exactly-once", sink=f"sqlite:///{work / f'eo-{r}.db'}",
            ),
        }
        run_rounds(variants, args.rounds, runs)


def main(argv: list[str] | None = None) -> int:
    """Run every variant ``--rounds`` times, interleaved; print and store the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    from importlib.metadata import version

    from examples.effects import record

    def count_only(msg: Any) -> None:
        pass

    work = Path(tempfile.mkdtemp(prefix="htmqc-pulsar-bench-"))
    results: dict[str, Any] = {
        "count": args.count,
        "partitions": args.partitions,
        "size": 100,
        "rounds": args.rounds,
        "contracts": CONTRACTS_ENABLED,
        "pulsar_client": version("pulsar-client"),
        "python": platform.python_version(),
        "runs": {},
    }
    runs: dict[str, list[float]] = results["runs"]
    try:
        _run_variants(work, args, runs, count_only, record)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    medians = summarize(results, runs)
    raw = medians["raw_loop"]
    print()
    for name, rate in medians.items():
        print(f"{name:<22} {rate:>10,.0f} msg/s  {rate / raw:5.2f}x raw_loop")
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
