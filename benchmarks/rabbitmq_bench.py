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
import time
from pathlib import Path
from typing import Any

from benchmarks import source_bench
from benchmarks.source_bench import TOPIC, Producing, Variant, measure, print_ratios
from htmqc.sources.rabbitmq import RabbitStreamClient, connect, endpoint_of, produce, stream_name
from htmqc.sources.rabbitmq_server import start_rabbitmq


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


def _run(work: Path, args: argparse.Namespace, runs: dict[str, list[float]]) -> dict[str, Any]:
    """Start the node, measure every variant, stop it; its start-up seconds."""
    with start_rabbitmq() as server:
        url = server.url
        raw: dict[str, Variant] = {
            "raw_loop": lambda r: raw_loop(url, TOPIC, args.partitions, args.count)
        }
        measure(
            "rabbitmq-stream", url, Producing(RabbitStreamClient(url), produce), raw, work,
            args, runs,
        )  # fmt: skip
        return {"node_start_s": round(server.started_seconds, 2)}


def _report(results: dict[str, Any], medians: dict[str, float]) -> None:
    print_ratios(medians, "raw_loop")
    print(f"node started in {results['node_start_s']} s")


def main(argv: list[str] | None = None) -> int:
    """Run every variant ``--rounds`` times, interleaved; print and store the medians."""
    from importlib.metadata import version

    return source_bench.main(
        argv, doc=__doc__ or "", name="rabbitmq", count=100_000, rounds=1, run=_run,
        report=_report, versions=lambda: {"rstream": version("rstream")},
    )  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
