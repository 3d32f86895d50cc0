"""Run one contender in this process and write its figures as JSON.

``python -m benchmarks.peers.worker CONTENDER --mode M --bootstrap B --topic T
--count N --group G --out FILE [--latency] [--store DB] [--kill-at K]
[--journal FILE] [--out-topic T] [--idle-exit S] [--timeout S] [--htmqc-src DIR]``

The runner starts one worker process per contender run, so peak RSS and CPU
are the contender's own. CONTENDER is a module name in this package
(``raw``, ``aio``, ``quix``, ``faust_peer``, ``htmqc_peer``). ``--latency``
records end-to-end latency, ending at the handler for at-least-once modes and
at the transaction commit for exactly-once ones
(:func:`~benchmarks.peers.common.latency_point`); ``--store`` writes one
effect row per message into that SQLite file; ``--kill-at K`` makes the
process SIGKILL itself after the K-th handler call (see
:class:`~benchmarks.peers.common.Meter`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from benchmarks.peers.common import latency_point

CONTENDER_MODULES = ("raw", "aio", "quix", "faust_peer", "htmqc_peer")


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the contender, write ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers.worker")
    parser.add_argument("contender", choices=CONTENDER_MODULES)
    parser.add_argument("--mode", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--latency", action="store_true")
    parser.add_argument("--store", default=None)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--journal", default=None)
    parser.add_argument("--out-topic", default=None)
    parser.add_argument("--idle-exit", type=float, default=None)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--htmqc-src", default=None,
                        help="import htmqc from this src folder (the baseline slots)")
    args = parser.parse_args(argv)
    if args.htmqc_src:
        sys.path.insert(0, args.htmqc_src)  # before anything imports htmqc
    module = importlib.import_module(f"benchmarks.peers.{args.contender}")
    result = module.run(
        args.bootstrap, args.topic, args.count, group=args.group, mode=args.mode,
        latency=latency_point(args.mode) if args.latency else None, store=args.store,
        kill_at=args.kill_at, journal=args.journal, out_topic=args.out_topic,
        idle_exit=args.idle_exit, timeout=args.timeout,
    )
    args.out.write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
