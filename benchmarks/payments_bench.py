"""The payments workload: exactly-once into PostgreSQL, htmqc against a hand-written loop.

JSON payment events (``{"id", "account", "amount"}``) keyed by ``--accounts``
accounts (10,000) on an 8-partition topic. Per message: an insert into
``payments`` (unique id), an upsert of ``balances`` and an append to ``ledger``
(:mod:`examples.payments`). Contenders, each over the whole topic with its own
group, in this process, ``--rounds`` times interleaved:

* ``hand_loop``: what a team writes by hand: ``consume`` a batch of up to
  ``--batch-size`` messages, one PostgreSQL transaction with ``executemany`` for
  the three statements plus an upsert of the partitions' positions, commit.
  Exactly-once as far as the effects go (the positions are in the same
  transaction), but no fence, no retries, no dead letters, no rebalance handling.
* ``htmqc_message``: htmqc exactly-once with :func:`examples.payments.handle`
  (one handler call, three statements per message).
* ``htmqc_batch``: htmqc exactly-once with :func:`examples.payments.handle_batch`
  (``batch=True``: three ``executemany`` per piece of up to 250 messages).

Each run is checked before it counts: every payment stored once, the balances
sum to the events' amounts, one ledger line per event. Reported per contender
(medians over the rounds): msg/s from the first message to the last, the p99
latency of a commit (the loop: each transaction's ``COMMIT``; htmqc: commit
request to acknowledgement, ``htmqc_commit_latency_seconds``), given as the
histogram bucket it falls in for both so they compare, and process CPU seconds
per million messages (every thread of this process: consumer, handlers,
librdkafka, psycopg). Goals (issue 18): the batch handler at >= 0.8x the
hand-written loop and >= 10x the per-message handler.

Run with contracts off::

    HTMQC_CONTRACTS=0 python -m benchmarks.payments_bench --broker kafka

Results go to ``benchmarks/results/payments.json`` (``payments-kafka.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.brokers import BROKERS, describe, running, suffix
from htmqc.broker import create_topic
from htmqc.core import CONTRACTS_ENABLED
from htmqc.observe.metrics import LATENCY_BUCKETS

RESULTS = Path(__file__).resolve().parent / "results" / "payments.json"
PARTITIONS = 8
CONTENDERS = ("hand_loop", "htmqc_message", "htmqc_batch")
DEFAULT_SINK = "postgresql://127.0.0.1:5432/htmqc_bench_payments"
_POSITIONS = (
    "CREATE TABLE IF NOT EXISTS bench_positions (grp TEXT NOT NULL, topic TEXT NOT NULL, "
    '"partition" INTEGER NOT NULL, next_offset BIGINT NOT NULL, '
    'PRIMARY KEY (grp, topic, "partition"))'
)
_UPSERT_POSITION = (
    'INSERT INTO bench_positions (grp, topic, "partition", next_offset) VALUES (%s, %s, %s, %s) '
    'ON CONFLICT (grp, topic, "partition") DO UPDATE SET next_offset = excluded.next_offset'
)


def events(count: int, accounts: int, seed: int = 7) -> Iterator[tuple[bytes, bytes, int]]:
    """``(key, value, amount)`` of ``count`` payment events over ``accounts`` accounts."""
    rng = random.Random(seed)
    for i in range(count):
        account = f"acct-{rng.randrange(accounts)}"
        amount = rng.randrange(1, 100_000)
        value = json.dumps({"id": f"p-{i}", "account": account, "amount": amount})
        yield account.encode(), value.encode(), amount


def produce_events(bootstrap: str, topic: str, count: int, accounts: int) -> int:
    """Create the topic and write the events, keyed by account; the amounts' sum."""
    from confluent_kafka import Producer

    from htmqc.kafka_defaults import producer_config

    create_topic(bootstrap, topic, PARTITIONS)
    producer = Producer(producer_config(bootstrap, {"linger.ms": 20}))
    total = 0
    for key, value, amount in events(count, accounts):
        total += amount
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(60):
        raise RuntimeError("the events were not all delivered within 60 s")
    return total


def ensure_database(dsn: str) -> None:
    """Create the benchmark's own database if missing (its tables are dropped between
    runs, so it must not be one that tests or users share)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = conninfo_to_dict(dsn).get("dbname")
    if not name:
        raise SystemExit(f"payments_bench: --sink {dsn!r} names no database; add /DBNAME")
    server = make_conninfo(dsn, dbname="postgres")
    with psycopg.connect(server, autocommit=True) as db:
        if db.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            db.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]


def reset_tables(dsn: str) -> None:
    """Empty tables for the next contender (dropped and created again)."""
    import psycopg
    from examples.payments import SCHEMA

    with psycopg.connect(dsn, autocommit=True) as db:
        for table in ("payments", "balances", "ledger"):
            db.execute(f"DROP TABLE IF EXISTS {table}")  # type: ignore[arg-type]
        for statement in (*SCHEMA, _POSITIONS):
            db.execute(statement)  # type: ignore[arg-type]


def check_effects(dsn: str, count: int, total: int) -> None:
    """Every event stored once: ``count`` payments and ledger lines, balances summing
    to ``total``; raises ``AssertionError`` naming what is off."""
    import psycopg

    with psycopg.connect(dsn) as db:
        got = tuple(
            int(db.execute(query).fetchone()[0])  # type: ignore[index]
            for query in ("SELECT count(*) FROM payments",
                          "SELECT count(DISTINCT id) FROM payments",
                          "SELECT count(*) FROM ledger",
                          "SELECT coalesce(sum(balance), 0) FROM balances")
        )
    assert got == (count, count, count, total), f"effects {got} != {(count, count, count, total)}"


def bucket_p99(latencies: list[float]) -> float:
    """The upper bound of the histogram bucket (:data:`LATENCY_BUCKETS`) holding the
    99th percentile of ``latencies``, as Prometheus' ``histogram_quantile`` would place it."""
    if not latencies:
        return float("nan")
    ordered = sorted(latencies)
    p99 = ordered[math.ceil(0.99 * len(ordered)) - 1]  # nearest rank, as the histogram's
    index = bisect_left(LATENCY_BUCKETS, p99)
    return LATENCY_BUCKETS[index] if index < len(LATENCY_BUCKETS) else float("inf")


def histogram_p99(cumulative: list[int], count: int) -> float:
    """The bucket upper bound of the 99th percentile of a cumulative histogram."""
    if not count:
        return float("nan")
    rank = 0.99 * count
    for bound, below in zip(LATENCY_BUCKETS, cumulative, strict=True):
        if below >= rank:
            return bound
    return float("inf")


@contextmanager
def cpu_clock() -> Iterator[Callable[[], float]]:
    """Process CPU seconds (all threads) since the block began."""
    start = time.process_time()
    yield lambda: time.process_time() - start


def hand_loop(bootstrap: str, topic: str, count: int, dsn: str, group: str,
              batch_size: int) -> dict[str, float]:
    """The hand-written loop (module docs); its rate, commit p99 and CPU."""
    import psycopg
    from confluent_kafka import Consumer
    from examples.payments import SQL, parse

    from htmqc.kafka_defaults import consumer_config

    insert, upsert, append = SQL["%s"]
    consumer = Consumer(consumer_config(bootstrap, group, {"enable.auto.commit": False}))
    consumer.subscribe([topic])
    commits: list[float] = []
    seen = 0
    first = 0.0
    with cpu_clock() as cpu, psycopg.connect(dsn) as db:
        try:
            while seen < count:
                msgs = consumer.consume(batch_size, 0.1)
                if not msgs:
                    continue
                if not first:
                    first = time.perf_counter()
                rows = [(*parse(m.value()), m.partition(), m.offset()) for m in msgs]
                positions = {m.partition(): m.offset() + 1 for m in msgs}
                with db.cursor() as cur:
                    cur.executemany(insert, [r[:3] for r in rows])
                    cur.executemany(upsert, [(r[1], r[2]) for r in rows])
                    cur.executemany(append, rows)
                    cur.executemany(_UPSERT_POSITION,
                                    [(group, topic, p, o) for p, o in positions.items()])
                began = time.perf_counter()
                db.commit()
                commits.append(time.perf_counter() - began)
                seen += len(msgs)
            elapsed = time.perf_counter() - first
            used = cpu()
        finally:
            consumer.close()
    return {"msg_per_s": count / elapsed, "commit_p99_s": bucket_p99(commits),
            "cpu_s_per_million": used / count * 1e6}


def htmqc_run(bootstrap: str, topic: str, count: int, dsn: str, group: str,
              batch: bool) -> dict[str, float]:
    """One htmqc exactly-once run (per-message or batch handler) over the topic."""
    from examples.payments import handle, handle_batch

    from htmqc.observe import Metrics
    from htmqc.runtime import RunOptions, build_engine

    metrics = Metrics()
    options = RunOptions(bootstrap=bootstrap, topic=topic, group=group, mode="exactly-once",
                         sink=dsn, max_messages=count, batch=batch)
    with cpu_clock() as cpu:
        engine = build_engine(handle_batch if batch else handle, options, metrics=metrics)
        engine.run(install_signals=False)
        used = cpu()
    assert engine.finished >= count, engine.finished
    assert engine.first_message_at is not None and engine.stopped_at is not None
    cumulative, n, _ = metrics.commit_latency.snapshot()
    return {"msg_per_s": count / (engine.stopped_at - engine.first_message_at),
            "commit_p99_s": histogram_p99(cumulative, n),
            "cpu_s_per_million": used / count * 1e6}


def main(argv: list[str] | None = None) -> int:
    """Run the contenders ``--rounds`` times, interleaved; print and store the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--accounts", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1000,
                        help="the hand loop's consume() batch (htmqc's default is 1000 too)")
    parser.add_argument("--broker", choices=BROKERS, default="tansu")
    parser.add_argument("--sink", default=os.environ.get("HTMQC_BENCH_PG", DEFAULT_SINK),
                        help="a PostgreSQL database of its own (created if missing; its "
                             "payments, balances and ledger tables are dropped between runs)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    chosen = [c for c in args.contenders.split(",") if c]
    unknown = sorted(set(chosen) - set(CONTENDERS))
    if unknown:
        parser.error(f"unknown contender {unknown[0]!r}; choose from {', '.join(CONTENDERS)}")
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in chosen}
    tag = f"{os.getpid()}-{int(time.time())}"
    ensure_database(args.sink)
    with running(args.broker) as bootstrap:
        topic = f"payments-bench-{tag}"
        total = produce_events(bootstrap, topic, args.count, args.accounts)
        for round_ in range(args.rounds):
            for name in chosen:
                reset_tables(args.sink)
                group = f"{name}-{round_}-{tag}"
                if name == "hand_loop":
                    run = hand_loop(bootstrap, topic, args.count, args.sink, group, args.batch_size)
                else:
                    run = htmqc_run(bootstrap, topic, args.count, args.sink, group,
                                    batch=name == "htmqc_batch")
                check_effects(args.sink, args.count, total)
                runs[name].append(run)
                print(f"round {round_ + 1} {name:<14} {run['msg_per_s']:>10,.0f} msg/s  "
                      f"commit p99 <= {run['commit_p99_s'] * 1000:g} ms  "
                      f"CPU {run['cpu_s_per_million']:,.0f} s/M", flush=True)
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
               for name, rs in runs.items()}
    rates = {name: m["msg_per_s"] for name, m in medians.items()}
    ratios: dict[str, float] = {}
    if "htmqc_batch" in rates and "hand_loop" in rates:
        ratios["batch_vs_hand_loop"] = rates["htmqc_batch"] / rates["hand_loop"]
    if "htmqc_batch" in rates and "htmqc_message" in rates:
        ratios["batch_vs_per_message"] = rates["htmqc_batch"] / rates["htmqc_message"]
    results = {
        "count": args.count, "accounts": args.accounts, "partitions": PARTITIONS,
        "rounds": args.rounds, "broker": describe(args.broker), "sink": "PostgreSQL",
        "contracts": CONTRACTS_ENABLED, "python": sys.version.split()[0],
        "command": "HTMQC_CONTRACTS=0 python -m benchmarks.payments_bench "
                   + " ".join(argv if argv is not None else sys.argv[1:]),
        "runs": runs, "medians": medians, "ratios": ratios,
        "goals": {"batch_vs_hand_loop": 0.8, "batch_vs_per_message": 10.0},
    }
    out = args.out or RESULTS.with_name(f"payments{suffix(args.broker)}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    for name, m in medians.items():
        print(f"median {name:<14} {m['msg_per_s']:>10,.0f} msg/s  "
              f"commit p99 <= {m['commit_p99_s'] * 1000:g} ms  "
              f"CPU {m['cpu_s_per_million']:,.0f} s/M")
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}x (goal {results['goals'][name]}x)")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
