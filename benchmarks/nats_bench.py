"""NATS JetStream throughput: raw nats-py pull loops against htmqc over NATS.

One private ``nats-server -js`` (:mod:`htmqc.sources.nats_server`, file storage
in a temporary directory), one topic of ``--partitions`` streams holding
``--count`` x 100-byte messages (:func:`htmqc.sources.nats.produce`, 1,000
keys). Each variant reads the whole topic, in this process, timed from its first
message to its last (connection and consumer creation left out):

* ``raw_loop``: nats-py alone, one ephemeral pull consumer per partition
  (``AckPolicy.NONE``), ``fetch(1000)`` (nats-py's documented pull API) on every
  partition concurrently, a Python call per message, no position stored;
* ``raw_pull``: nats-py's core API driving the pull protocol by hand (a
  subscription callback that counts, ``CONSUMER.MSG.NEXT`` requests of 1,000),
  the way the adapter fetches, with nothing else: the ceiling of this client;
* ``raw_sqlite``: ``raw_pull`` calling the exactly-once benchmark's handler
  (``examples.effects.record``: one INSERT per message) on a plain SQLite
  cursor, one SQLite commit per pull request: the limit for exactly-once into
  SQLite, without its guarantees;
* ``at_least_once``: ``htmqc`` at-least-once (``--source nats``), the handler
  counts; commits go to the KV bucket every 500 ms;
* ``exactly_once_sqlite``: ``htmqc`` exactly-once into SQLite with the same
  handler as ``raw_sqlite``.

Every variant runs ``--rounds`` times, interleaved; results (every run, medians,
each median's ratio to ``raw_loop`` and to ``raw_pull``, exactly-once to the raw
SQLite loop) are printed and written to ``benchmarks/results/nats.json``.

Run with contracts off: ``HTMQC_CONTRACTS=0 python -m benchmarks.nats_bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import source_bench
from benchmarks.source_bench import TOPIC, Producing, Variant, measure, print_ratios
from htmqc.sources.nats import NatsClient, convert, produce, stream_name, subject
from htmqc.sources.nats_server import start_nats


def raw_loop(
    url: str,
    topic: str,
    partitions: int,
    count: int,
    handler: Callable[[Any], Any] | None = None,
    after_batch: Callable[[], Any] | None = None,
) -> float:
    """msg/s of plain nats-py pull consumers: ``handler`` per message (default: a
    counter; messages converted as the adapter does when a handler is given),
    ``after_batch`` after each fetched batch."""
    import nats
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    async def run() -> float:
        nc = await nats.connect(url)
        js = nc.jetstream()
        subs = [
            await js.pull_subscribe(
                subject(topic, p),
                stream=stream_name(topic, p),
                config=ConsumerConfig(
                    ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL
                ),
            )
            for p in range(partitions)
        ]
        seen = 0
        first = 0.0
        total = [0]

        async def one(p: int, sub: Any) -> int:
            try:
                msgs = await sub.fetch(1000, timeout=1)
            except (TimeoutError, NatsTimeout):
                return 0
            if handler is None:
                for _m in msgs:
                    total[0] += 1
            else:
                for m in msgs:
                    handler(convert(topic, p, m))
            if after_batch is not None:
                after_batch()
            return len(msgs)

        try:
            while seen < count:
                got = await asyncio.gather(*(one(p, s) for p, s in enumerate(subs)))
                if not first and sum(got):
                    first = time.perf_counter()
                seen += sum(got)
            return count / (time.perf_counter() - first)
        finally:
            for sub in subs:
                await sub.unsubscribe()
            await nc.close()

    return asyncio.run(run())


def raw_pull(
    url: str,
    topic: str,
    partitions: int,
    count: int,
    handler: Callable[[Any], Any] | None = None,
    after_batch: Callable[[], Any] | None = None,
) -> float:
    """msg/s of nats-py's core API driving the JetStream pull protocol by hand, as
    the adapter does: per partition an ephemeral ``AckPolicy.NONE`` consumer, a
    subscription with a callback, and ``CONSUMER.MSG.NEXT`` requests of 1,000
    messages one after another; no buffer, no thread. The callback counts (or,
    with ``handler``, calls it on the converted message); ``after_batch`` runs
    after each request."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    async def run() -> float:
        nc = await nats.connect(url)
        js = nc.jetstream()
        total = [0]
        first = [0.0]
        done = asyncio.Event()

        async def partition(p: int) -> None:
            stream = stream_name(topic, p)
            info = await js.add_consumer(
                stream,
                config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
            )
            got = [0]
            ended = asyncio.Event()

            async def on_msg(msg: Any) -> None:
                if not msg.reply:  # a status: the request is over
                    ended.set()
                    return
                if not first[0]:
                    first[0] = time.perf_counter()
                if handler is not None:
                    handler(convert(topic, p, msg))
                got[0] += 1
                total[0] += 1
                if got[0] >= 1000:
                    ended.set()
                if total[0] >= count:
                    done.set()

            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox, cb=on_msg)
            try:
                while not done.is_set():
                    got[0] = 0
                    ended.clear()
                    await nc.publish(
                        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{info.name}",
                        json.dumps({"batch": 1000, "expires": 1_000_000_000}).encode(),
                        reply=inbox,
                    )
                    waiter = asyncio.ensure_future(ended.wait())
                    stop = asyncio.ensure_future(done.wait())
                    await asyncio.wait({waiter, stop}, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    stop.cancel()
                    if after_batch is not None:
                        after_batch()
            finally:
                await sub.unsubscribe()
                await js.delete_consumer(stream, info.name)

        try:
            await asyncio.gather(*(partition(p) for p in range(partitions)))
            return count / (time.perf_counter() - first[0])
        finally:
            await nc.close()

    return asyncio.run(run())


def raw_sqlite_loop(url: str, topic: str, partitions: int, count: int, db: Path) -> float:
    """:func:`raw_pull` with ``examples.effects.record`` on a plain SQLite cursor and
    a SQLite commit per pull request (WAL, ``synchronous=FULL``, as the sink)."""
    from examples.effects import record

    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL").fetchall()
    conn.execute("PRAGMA synchronous = FULL")
    cur = conn.cursor()
    cur.execute("BEGIN")

    def commit() -> None:
        cur.execute("COMMIT")
        cur.execute("BEGIN")

    try:
        return raw_pull(url, topic, partitions, count, lambda m: record(m, cur), commit)
    finally:
        cur.execute("COMMIT")
        conn.close()


def _server_version() -> str:
    from htmqc.sources.nats_server import nats_server_binary

    exe = nats_server_binary()
    if exe is None:
        return "?"
    done = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or done.stderr.strip()


def _run(work: Path, args: argparse.Namespace, runs: dict[str, list[float]]) -> dict[str, Any]:
    """Start the server (its store in ``work``), measure every variant, stop it."""
    with start_nats(store=work / "js") as server:
        url, parts, n = server.url, args.partitions, args.count
        raw: dict[str, Variant] = {
            "raw_loop": lambda r: raw_loop(url, TOPIC, parts, n),
            "raw_pull": lambda r: raw_pull(url, TOPIC, parts, n),
            "raw_sqlite": lambda r: raw_sqlite_loop(url, TOPIC, parts, n, work / f"raw-{r}.db"),
        }
        measure("nats", url, Producing(NatsClient(url), produce), raw, work, args, runs)
    return {}


def _report(results: dict[str, Any], medians: dict[str, float]) -> None:
    """The ratios to ``raw_loop`` and to ``raw_pull``, exactly-once to ``raw_sqlite``."""
    pull = medians["raw_pull"]
    results["ratio_to_raw_pull"] = {k: round(v / pull, 3) for k, v in medians.items()}
    results["exactly_once_sqlite_to_raw_sqlite"] = round(
        medians["exactly_once_sqlite"] / medians["raw_sqlite"], 3
    )
    print_ratios(medians, "raw_loop", "raw_pull")
    print(f"exactly_once_sqlite / raw_sqlite: {results['exactly_once_sqlite_to_raw_sqlite']:.2f}")


def main(argv: list[str] | None = None) -> int:
    """Run every variant ``--rounds`` times, interleaved; print and store the medians."""
    from importlib.metadata import version

    return source_bench.main(
        argv, doc=__doc__ or "", name="nats", count=200_000, rounds=3, run=_run, report=_report,
        versions=lambda: {"nats_server": _server_version(), "nats_py": version("nats-py")},
    )  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
