"""Run one contender in this process and write its figures as JSON.

``python -m benchmarks.peers.worker CONTENDER --mode M --bootstrap B --topic T
--count N --group G --out FILE [--latency] [--ids FILE] [--timeout S]``

The runner starts one worker process per contender run, so peak RSS and CPU
are the contender's own. CONTENDER is a module name in this package
(``raw``, ``aio``, ``quix``, ``faust_peer``, ``htmqc_peer``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

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
    parser.add_argument("--ids", default=None)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    module = importlib.import_module(f"benchmarks.peers.{args.contender}")
    result = module.run(
        args.bootstrap, args.topic, args.count, group=args.group, mode=args.mode,
        latency=args.latency, ids_path=args.ids, timeout=args.timeout,
    )
    args.out.write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
