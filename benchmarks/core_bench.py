"""Core throughput: fetched -> started -> succeeded -> commit, in batches.

The pattern the runtime produces: batches of ``--batch`` offsets (500), spread
over ``--workers`` (8) lanes; each lane finishes its messages in order, the lanes
interleave, and completions reach the core in small groups, out of offset
order. One commit request and ack per batch. The completion schedule is drawn
before timing starts, so the figure is the core's cost alone.

``python -m benchmarks.core_bench --contracts off`` (set ``HTMQC_CONTRACTS=0``
in the environment too; the flag only checks that it matches) appends its
result to ``benchmarks/results/core.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path

from htmqc.core import CONTRACTS_ENABLED, ConsumerCore

RESULTS = Path(__file__).parent / "results" / "core.json"


def schedule(batch: int, workers: int, rng: random.Random) -> list[list[int]]:
    """Completion groups for one batch, as offsets relative to the batch start."""
    lanes = [list(range(w, batch, workers)) for w in range(workers)]
    groups: list[list[int]] = []
    while any(lanes):
        lane = rng.choice([lane for lane in lanes if lane])
        take = rng.randint(1, 16)
        groups.append(lane[:take])
        del lane[:take]
    return groups


def run(messages: int, batch: int, workers: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    batches = messages // batch
    # Completion groups with absolute offsets, built before the clock starts.
    plan = [
        [[base + o for o in group] for group in schedule(batch, workers, rng)]
        for base in range(0, batches * batch, batch)
    ]
    core = ConsumerCore()
    tp = ("bench", 0)
    epoch = core.assign(tp, 0)
    started = time.perf_counter()
    base = 0
    for groups in plan:
        offsets = list(range(base, base + batch))
        run_now = core.fetched(tp, epoch, offsets)
        core.started_many(tp, epoch, run_now)
        for group in groups:
            core.succeeded_many(tp, epoch, group)
        commit = core.commit_requested(tp)
        assert commit is not None and commit.offset == base + batch
        core.commit_acked(tp, epoch, commit.offset)
        base += batch
    seconds = time.perf_counter() - started
    assert core.tracker(tp).committed == batches * batch
    return {"messages": batches * batch, "seconds": seconds, "msg_per_s": batches * batch / seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contracts", choices=["on", "off"], required=True)
    parser.add_argument("--messages", type=int, default=0, help="default: 2M off, 100k on")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    want = args.contracts == "on"
    if want != CONTRACTS_ENABLED:
        print(
            f"htmqc: error: contracts are {'on' if CONTRACTS_ENABLED else 'off'} in this process;"
            f" set HTMQC_CONTRACTS={int(want)} for --contracts {args.contracts}",
            file=sys.stderr,
        )
        return 2
    messages = args.messages or (100_000 if want else 2_000_000)
    runs = [run(messages, args.batch, args.workers, args.seed) for _ in range(args.repeat)]
    best = max(runs, key=lambda r: r["msg_per_s"])
    median = sorted(r["msg_per_s"] for r in runs)[len(runs) // 2]
    result = {
        "benchmark": "core fetched/started/succeeded/commit",
        "contracts": args.contracts,
        "batch": args.batch,
        "workers": args.workers,
        "messages": messages,
        "median_msg_per_s": round(median),
        "best_msg_per_s": round(best["msg_per_s"]),
        "runs": runs,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(
        f"core, contracts {args.contracts}: median {median:,.0f} msg/s "
        f"(best {best['msg_per_s']:,.0f}) over {args.repeat} runs of {messages:,} messages"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    history = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    history[args.contracts] = result
    RESULTS.write_text(json.dumps(history, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
