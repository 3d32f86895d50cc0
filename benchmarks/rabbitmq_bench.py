"""RabbitMQ Streams throughput: a raw rstream consumer loop against htmqc over RabbitMQ.

One private RabbitMQ node (:mod:`htmqc.sources.rabbitmq_server`), one topic of
``--partitions`` streams holding ``--count`` x 100-byte messages
(:func:`htmqc.sources.rabbitmq.produce`, 1,000 keys). Each variant reads the whole
topic, in this process, timed from its first message to its last (connections and
subscriptions left out):

* ``raw_loop``: rstream alone, one subscription per partition from the first
  offset, messages decoded as AMQP 1.0 (``amqp_decoder``, as the adapter needs for
  keys and headers), a callback that counts, no position stored: the ceiling of
  this client;
* ``at_least_once``: ``htmqc`` at-least-once (``--source rabbitmq-stream``), the
  handler counts; commits go to offset tracking every 500 ms;
* ``exactly_once_sqlite``: ``htmqc`` exactly-once into SQLite with the exactly-once
  benchmark's handler (``examples.effects.record``: one INSERT per message).

Every variant runs ``--rounds`` times (default once), interleaved; the medians and
their ratios to ``raw_loop`` are printed and written to
``benchmarks/results/rabbitmq.json``.

Run with contracts off: ``HTMQC_CONTRACTS=0 python -m benchmarks.rabbitmq_bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import shutil
import tempfile
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
from htmqc.sources.rabbitmq import RabbitStreamClient, connect, endpoint_of, produce, stream_name
from htmqc.sources.rabbitmq_server import start_rabbitmq

RESULTS = Path(__file__).resolve().parent / "results" / "rabbitmq.json"
SOURCE = "rabbitmq-stream"


def raw_loop(url: str, topic: str, partitions: int, count: int) -> float:
    """msg/s of a plain rstream consumer: one subscription per partition, AMQP
    decoding, a counting callback."""
    from rstream import ConsumerOffsetSpecification, OffsetType, amqp_decoder

    async def run() -> float:
        consumer = await connect(endpoint_of(url), 10)
        seen = [0]
        first = [0.0]
        done = asyncio.Event()

        def on_message(_msg: Any, _ctx: Any) -> None:
            if not seen[0]:
                first[0] = time.perf_counter()
            seen[0] += 1
            if seen[0] >= count:
                done.set()

        spec = ConsumerOffsetSpecification(OffsetType.FIRST, None)
        try:
            for p in range(partitions):
                await consumer.subscribe(
                    stream_name(topic, p), on_message, decoder=amqp_decoder,
                    offset_specification=spec, initial_credit=10,
                )  # fmt: skip
            await asyncio.wait_for(done.wait(), 600)
            return count / (time.perf_counter() - first[0])
        finally:
            await consumer.close()

    return asyncio.run(run())


def _run_variants(
    work: Path,
    args: argparse.Namespace,
    runs: dict[str, list[float]],
    count_only: Callable[[Any], None],
    record: Callable[[Any, Any], None],
) -> float:
    """Start the node, produce the topic, run every variant ``args.rounds`` times
    (interleaved) into ``runs``; stop the node. Returns its start-up seconds."""
    with start_rabbitmq() as server:
        url, topic = server.url, "bench"
        produce_topic(Producing(RabbitStreamClient(url), produce), url, topic, args)
        parts = args.partitions
        variants: dict[str, Callable[[int], float]] = {
            "raw_loop": lambda r: raw_loop(url, topic, parts, args.count),
            "at_least_once": lambda r: htmqc_rate(
                url, topic, args.count, count_only, source=SOURCE, group=f"bench-alo-{r}"
            ),
            "exactly_once_sqlite": lambda r: htmqc_rate(
                url, topic, args.count, record, source=SOURCE, group=f"bench-eo-{r}",
                mode="exactly-once", sink=f"sqlite:///{work / f'eo-{r}.db'}",
            ),
        }
        run_rounds(variants, args.rounds, runs)
        return server.started_seconds


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

    work = Path(tempfile.mkdtemp(prefix="htmqc-rabbitmq-bench-"))
    results: dict[str, Any] = {
        "count": args.count,
        "partitions": args.partitions,
        "size": 100,
        "rounds": args.rounds,
        "contracts": CONTRACTS_ENABLED,
        "rstream": version("rstream"),
        "python": platform.python_version(),
        "runs": {},
    }
    runs: dict[str, list[float]] = results["runs"]
    try:
        results["node_start_s"] = round(_run_variants(work, args, runs, count_only, record), 2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    medians = summarize(results, runs)
    raw = medians["raw_loop"]
    print()
    for name, rate in medians.items():
        print(f"{name:<22} {rate:>10,.0f} msg/s  {rate / raw:5.2f}x raw_loop")
    print(f"node started in {results['node_start_s']} s")
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
