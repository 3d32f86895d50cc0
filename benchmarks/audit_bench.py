"""Audit cost: the single-process checker vs. the Spark job on ``local[2]``.

Writes a run of ``--rows`` messages (default 10,000,000) as JSON lines - produced
ids (12-digit, ``--keys`` keys over 8 partitions) and effects in storage order
with one generation per partition - doctored with a handful of anomalies (one
lost id, one duplicate, one order violation), then audits the same files with
each engine in a child process and reports wall time and peak RSS (the Spark
figure is the driver's plus the JVM's, which is a child of the driver).

``python -m benchmarks.audit_bench --rows 1000000`` prints one JSON line per
engine and appends them to ``benchmarks/results/audit.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "audit.json"
PARTITIONS = 8


def write_run(folder: Path, rows: int, keys: int) -> dict[str, Path]:
    """Produced and effects files for ``rows`` messages with three anomalies."""
    produced, effects = folder / "produced.jsonl", folder / "effects.jsonl"
    lost, duplicated, swapped = rows // 3, rows // 2, (rows // 4) - (rows // 4) % (keys * 2)
    with produced.open("w") as p_out, effects.open("w") as e_out:
        pending: str | None = None
        for i in range(rows):
            key = i % keys
            line = (
                f'{{"id": "{i:012d}", "key": "k{key}", "partition": {key % PARTITIONS}, '
                f'"offset": {i // PARTITIONS}'
            )
            p_out.write(line + "}\n")
            effect = line + ', "generation": 1}\n'
            if i == lost:
                continue
            if i == swapped:  # stored after the next id of the same key
                pending = effect
                continue
            e_out.write(effect)
            if pending is not None and i == swapped + keys:
                e_out.write(pending)
                pending = None
            if i == duplicated:
                e_out.write(effect)
    return {"produced": produced, "effects": effects}


def run_engine(engine: str, produced: str, effects: str, master: str) -> dict[str, object]:
    """Audit in this process (called in a child); return time and counts."""
    start = time.perf_counter()
    if engine == "python":
        from htmqc.audit import audit, load

        report = audit(load.produced_from_jsonl(produced), load.effects_from_jsonl(effects))
        startup = 0.0
    else:
        from htmqc.spark.audit_job import audit_files
        from htmqc.spark.session import spark_session

        with spark_session(master, app="htmqc-audit-bench") as spark:
            startup = time.perf_counter() - start
            report = audit_files(spark, produced=produced, effects=effects, validate=False)
    seconds = time.perf_counter() - start
    return {
        "engine": engine,
        "seconds": round(seconds, 2),
        "startup_seconds": round(startup, 2),
        "counts": {k: v for k, v in report.counts.items() if v},
        "effects": report.totals["effects"],
    }


def _tree_rss_kb(root: int) -> int:
    """Resident memory of ``root`` and all its descendants, from /proc."""
    parent: dict[int, int] = {}
    rss: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        parent[pid] = int(fields[1])
        rss[pid] = int(fields[21]) * resource.getpagesize() // 1024
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        kids = [c for c, p in parent.items() if p == pid and c not in tree]
        tree.update(kids)
        frontier.extend(kids)
    return sum(rss.get(pid, 0) for pid in tree)


def measure(cmd: list[str]) -> tuple[str, int]:
    """Run ``cmd``; return its stdout and the peak RSS (MB) of its process tree,
    sampled every 0.2 s (the JVM of a Spark driver is a child of the driver)."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, text=True)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss_kb(proc.pid))
            time.sleep(0.2)
        if proc.returncode:
            raise SystemExit(f"{cmd} failed with exit code {proc.returncode}")
        out.seek(0)
        return out.read(), peak // 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--engines", default="python,spark")
    parser.add_argument("--child", nargs=3, metavar=("ENGINE", "PRODUCED", "EFFECTS"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_engine(*args.child, args.master)))
        return
    with tempfile.TemporaryDirectory(prefix="htmqc-audit-bench-") as tmp:
        start = time.perf_counter()
        paths = write_run(Path(tmp), args.rows, args.keys)
        print(f"wrote {args.rows} rows in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        for engine in args.engines.split(","):
            out, peak_mb = measure(
                [sys.executable, "-m", "benchmarks.audit_bench", "--master", args.master,
                 "--child", engine, str(paths["produced"]), str(paths["effects"])]
            )  # fmt: skip
            result = {
                **json.loads(out.strip().splitlines()[-1]),
                "peak_rss_mb": peak_mb,
                "rows": args.rows,
                "machine": platform.node(),
            }
            print(json.dumps(result))
            RESULTS.parent.mkdir(exist_ok=True)
            with RESULTS.open("a") as f:
                f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
