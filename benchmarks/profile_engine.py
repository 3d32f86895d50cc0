"""Where the at-least-once engine spends its time per message: a py-spy profile.

Runs :mod:`benchmarks.engine_bench`'s workload (pre-built
``confluent_kafka.Message`` batches through a real at-least-once
:class:`~htmqc.runtime.Engine`, no broker, metrics off) under ``py-spy record``
and prints the engine's CPU time per message (the lowest of ``--rounds``), then
the share of the samples by part (consume stand-in, dispatch, core, lanes,
handler, the rest) and the hottest source lines. The broker run this stands for
spends about as much again inside ``consume`` (librdkafka building the
messages), which is the same for every consumer and not shown here.

Run: ``HTMQC_CONTRACTS=0 python -m benchmarks.profile_engine`` (needs ``py-spy``,
in the ``dev`` extra). ``--top N`` lines; ``--raw FILE`` keeps py-spy's samples.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

#: Which part of htmqc a frame belongs to (first match wins).
PARTS = (
    ("core", "htmqc/core/"),
    ("lanes", "htmqc/runtime/lanes.py"),
    ("dispatch", "Intake.dispatch"),
    ("dispatch", "Intake.by_partition"),
    ("handler", "engine_us.<locals>.handler"),
    ("consume stand-in", "FakeConsumer"),
)


def workload(count: int, rounds: int) -> None:
    """The profiled child: ``rounds`` engine runs over ``count`` messages."""
    from benchmarks.engine_bench import batches, engine_us

    best = float("inf")
    for _ in range(rounds):
        prepared = batches(count)
        gc.collect()
        best = min(best, engine_us(prepared, count, None))
    print(f"engine: {best:.3f} µs/msg (lowest of {rounds} runs of {count:,})", flush=True)


#: The outermost frames of the engine's threads: the poll loop and the workers.
ROOTS = ("Engine.run ", "Workers._serve ")


def part_of(frames: list[str]) -> str:
    """The part of the innermost frame (below a :data:`ROOTS` frame) that names one."""
    for frame in reversed(frames):
        if frame.startswith(ROOTS):
            break
        for name, mark in PARTS:
            if mark in frame:
                return name
    return "engine (rest)"


def summarize(raw: Path, top: int) -> str:
    """Self time by part and by line, as shares of the samples inside the engine
    (below ``Engine.run`` or a worker's ``Workers._serve``)."""
    by_part: Counter[str] = Counter()
    by_line: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if not any(f.startswith(ROOTS) for f in frames):
            continue
        samples = int(n)
        total += samples
        leaf = frames[-1]
        by_line[leaf] += samples
        by_part[part_of(frames)] += samples
    if not total:
        return "no samples inside the engine (is py-spy allowed to trace this process?)"
    out = [f"{total:,} samples inside the engine (poll loop and workers)", "", "by part:"]
    out += [f"  {100 * k / total:5.1f}%  {name}" for name, k in by_part.most_common()]
    out += ["", f"hottest {top} lines (self time):"]
    out += [f"  {100 * k / total:5.1f}%  {leaf}" for leaf, k in by_line.most_common(top)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--raw", type=Path, default=None, help="keep py-spy's raw samples here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        workload(args.count, args.rounds)
        return 0
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("error: py-spy is not installed; run `make setup` (it is in the dev extra)",
              file=sys.stderr)
        return 2
    raw = args.raw or Path(tempfile.mkdtemp(prefix="htmqc-profile-")) / "samples.txt"
    cmd = [spy, "record", "--rate", "1000", "--format", "raw", "--output", str(raw), "--",
           sys.executable, "-m", "benchmarks.profile_engine", "--child",
           "--count", str(args.count), "--rounds", str(args.rounds)]
    env = {**os.environ, "HTMQC_CONTRACTS": os.environ.get("HTMQC_CONTRACTS", "0")}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    sys.stdout.write("".join(ln + "\n" for ln in done.stdout.splitlines() if "µs/msg" in ln))
    if done.returncode != 0 or not raw.exists():
        print(f"error: py-spy failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return 1
    print(summarize(raw, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
