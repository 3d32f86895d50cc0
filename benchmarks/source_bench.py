"""What the non-Kafka source benchmarks share (:mod:`benchmarks.nats_bench`,
:mod:`benchmarks.pulsar_bench`, :mod:`benchmarks.rabbitmq_bench`): the command line
(``--count``, ``--partitions``, ``--rounds``, ``--out``), the topic written with the
source's ``produce`` (100-byte messages, 1,000 keys), htmqc's two variants
(``at_least_once``: the handler does nothing; ``exactly_once_sqlite``: the
exactly-once benchmark's handler ``examples.effects.record``, one INSERT per
message), every variant run ``--rounds`` times interleaved, and the medians and
their ratios to ``raw_loop`` printed and written to ``benchmarks/results/NAME.json``.

A source's module supplies its server, its client and ``produce``, its raw client
loops (``raw_loop`` at least) and what it adds to the results.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from htmqc.core import CONTRACTS_ENABLED
from htmqc.runtime import RunOptions, build_engine

RESULTS = Path(__file__).resolve().parent / "results"
#: The benchmarks' topic.
TOPIC = "bench"

#: One variant: round number -> msg/s.
Variant = Callable[[int], float]
#: Start the server, :func:`measure` into ``runs``, stop the server; returns what it
#: adds to the results (work folder, arguments, runs).
Run = Callable[[Path, argparse.Namespace, dict[str, list[float]]], dict[str, Any]]
#: Print the medians (and add to the results what derives from them).
Report = Callable[[dict[str, Any], dict[str, float]], None]


def htmqc_rate(
    url: str, topic: str, count: int, handler: Any, source: str = "nats", **options: Any
) -> float:
    """msg/s of one htmqc engine run (``--source SOURCE``) over the whole topic."""
    opts = RunOptions(
        bootstrap=url, topic=topic, source=source, max_messages=count, **options
    )
    engine = build_engine(handler, opts)
    engine.run(install_signals=False)
    assert engine.finished >= count, engine.finished
    assert engine.first_message_at is not None and engine.stopped_at is not None
    return count / (engine.stopped_at - engine.first_message_at)


class Producing:
    """A source's client whose ``produce(url, topic, count, ...)`` writes through it."""

    def __init__(self, client: Any, produce: Callable[..., int]) -> None:
        self.client, self._produce = client, produce

    def produce(self, url: str, topic: str, count: int, **kw: Any) -> int:
        return self._produce(url, topic, count, client=self.client, **kw)

    def close(self) -> None:
        self.client.close()


def summarize(results: dict[str, Any], runs: dict[str, list[float]]) -> dict[str, float]:
    """Each variant's median rate (``results["msg_per_s"]``) and its ratio to
    ``raw_loop`` (``results["ratio_to_raw"]``); returns the medians."""
    medians = {k: statistics.median(v) for k, v in runs.items()}
    results["msg_per_s"] = medians
    raw = medians["raw_loop"]
    results["ratio_to_raw"] = {k: round(v / raw, 3) for k, v in medians.items()}
    return medians


def write_results(out: Path, results: dict[str, Any]) -> None:
    """``results`` as JSON into ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}")


def run_rounds(variants: dict[str, Variant], rounds: int, runs: dict[str, list[float]]) -> None:
    """Run every variant ``rounds`` times, interleaved, each rate into ``runs``."""
    for r in range(rounds):
        for name, run in variants.items():
            rate = run(r)
            runs.setdefault(name, []).append(rate)
            print(f"round {r + 1} {name:<22} {rate:>10,.0f} msg/s", flush=True)


def produce_topic(client: Any, url: str, topic: str, args: argparse.Namespace) -> None:
    """Write the benchmark's topic (``args.count`` messages, 1,000 keys) with the
    source's ``client``, then close it."""
    try:
        started = time.perf_counter()
        client.produce(url, topic, args.count, partitions=args.partitions, keys=1000)
        print(f"produced {args.count:,} in {time.perf_counter() - started:.1f} s", flush=True)
    finally:
        client.close()


def count_only(msg: Any) -> None:
    """The at-least-once variant's handler: nothing (the engine counts)."""


def measure(
    source: str,
    url: str,
    producing: Producing,
    raw: dict[str, Variant],
    work: Path,
    args: argparse.Namespace,
    runs: dict[str, list[float]],
) -> None:
    """Write :data:`TOPIC` through ``producing`` (closed then), then run the ``raw``
    variants and htmqc's (``--source SOURCE`` at ``url``; SQLite files in ``work``)
    ``args.rounds`` times, interleaved, into ``runs``."""
    from examples.effects import record

    produce_topic(producing, url, TOPIC, args)
    variants: dict[str, Variant] = {
        **raw,
        "at_least_once": lambda r: htmqc_rate(
            url, TOPIC, args.count, count_only, source=source, group=f"bench-alo-{r}"
        ),
        "exactly_once_sqlite": lambda r: htmqc_rate(
            url, TOPIC, args.count, record, source=source, group=f"bench-eo-{r}",
            mode="exactly-once", sink=f"sqlite:///{work / f'eo-{r}.db'}",
        ),
    }  # fmt: skip
    run_rounds(variants, args.rounds, runs)


def print_ratios(medians: dict[str, float], *to: str) -> None:
    """A line a variant: its median and its ratio to each of ``to``."""
    for name, rate in medians.items():
        ratios = "  ".join(f"{rate / medians[other]:5.2f}x {other}" for other in to)
        print(f"{name:<22} {rate:>10,.0f} msg/s  {ratios}")


def main(
    argv: list[str] | None,
    *,
    doc: str,
    name: str,
    count: int,
    rounds: int,
    versions: Callable[[], dict[str, str]],
    run: Run,
    report: Report | None = None,
) -> int:
    """A source benchmark's command (``doc``: its module's docstring; ``name``: its
    results file and temporary folder; ``count`` and ``rounds``: the defaults;
    ``versions``: the client's and server's versions for the results): run every
    variant ``--rounds`` times, interleaved; print and store the medians (``report``:
    instead of the ratios to ``raw_loop``)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--count", type=int, default=count)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--out", type=Path, default=RESULTS / f"{name}.json")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix=f"htmqc-{name}-bench-"))
    results: dict[str, Any] = {
        "count": args.count,
        "partitions": args.partitions,
        "size": 100,
        "rounds": args.rounds,
        "contracts": CONTRACTS_ENABLED,
        **versions(),
        "python": platform.python_version(),
        "runs": {},
    }
    runs: dict[str, list[float]] = results["runs"]
    try:
        results.update(run(work, args, runs))
    finally:
        shutil.rmtree(work, ignore_errors=True)  # a server's store and the databases
    medians = summarize(results, runs)
    print()
    if report is None:
        print_ratios(medians, "raw_loop")
    else:
        report(results, medians)
    write_results(args.out, results)
    return 0
