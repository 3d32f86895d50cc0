"""``python -m model_checks.mutation run|catalogue|readme`` (see the package docs)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path

from htmqc.errors import HtmqcError, UsageError
from model_checks.mutation import catalogue_run, equivalent, report
from model_checks.mutation.config import KILL_CHECKS, ROOT
from model_checks.mutation.kill import problems, run_all, stale_listings
from model_checks.mutation.mutants import core_files, generate


def mutation_sources() -> str:
    """The fingerprint of what a mutation report depends on."""
    config = Path(__file__).resolve().parent
    return report.digest([*core_files(), equivalent.EQUIVALENT, config / "config.py"])


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    files = core_files()
    if args.only_file:
        files = [f for f in files if f.name in args.only_file]
        if not files:
            raise UsageError(f"no core module named {', '.join(args.only_file)}",
                             "name a file of src/htmqc/core, e.g. partition.py")
    listed = equivalent.load()
    generated = generate(files, report.BUILD / "session.sqlite")
    mutants = generated.mutants[: args.limit] if args.limit else generated.mutants
    results, times = run_all(
        mutants, listed, report.LEDGER, workers=args.workers,
        resume=args.resume or args.cached_only, cached_only=args.cached_only,
    )
    rows = [asdict(r) for r in results]
    data = {
        "tool": f"Cosmic Ray {version('cosmic-ray')}",
        "sources": mutation_sources(),
        "partial": bool(args.only_file or args.limit or len(results) < len(mutants)),
        "not_run": len(mutants) - len(results),
        "modules": [f.name for f in files],
        "workers": args.workers,
        "wall_seconds": round(time.monotonic() - started, 1),
        "baseline_seconds": {k: round(v, 2) for k, v in times.items()},
        "skipped_checks": [c.name for c in KILL_CHECKS if c.pending()],
        "left_out": generated.left_out,
        "summary": report.summary(rows),
        "mutants": rows,
    }
    report.write_json(report.REPORT, data)
    report.SURVIVORS.write_text(report.render_survivors(data))
    report.refresh_readme(report.MUTATION_BLOCK, data)
    s = data["summary"]
    print(f"mutate: {s['mutants']} mutants: {s['killed']} killed, {s['timeout']} timeout, "
          f"{s['equivalent']} equivalent, {s['survived']} survived; score {s['score']:.1%}; "
          f"{data['wall_seconds']:.0f}s; report: {report.REPORT.relative_to(ROOT)}")
    bad = problems(results, listed) + stale_listings(
        listed, (m.key for m in generated.mutants), (f.name for f in files))
    for line in bad:
        print(line)
    return 1 if bad else 0


def readme(args: argparse.Namespace) -> int:
    sources = {
        report.MUTATION_BLOCK: mutation_sources(),
        report.CATALOGUE_BLOCK: catalogue_run.catalogue_sources(),
    }
    if args.check:
        problems = report.stale_sections(sources)
        for line in problems:
            print(line, file=sys.stderr)
        if not problems:
            print("spec/README.md mutation sections are current")
        return 1 if problems else 0
    for name, (path, _, made_by) in report.SECTIONS.items():
        report.refresh_readme(name, report.read_json(path, made_by))
    print("refreshed the mutation sections of spec/README.md")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_checks.mutation")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="mutation testing of src/htmqc/core (make mutate)")
    p.add_argument("--workers", type=int, default=2, choices=(1, 2))
    p.add_argument("--only-file", action="append", help="mutate this core module only")
    p.add_argument("--limit", type=int, help="run the first N mutants only")
    p.add_argument("--resume", action="store_true",
                   help="reuse the results in spec/mutation-results.jsonl")
    p.add_argument("--cached-only", action="store_true",
                   help="run nothing: report what spec/mutation-results.jsonl holds")
    p.set_defaults(func=run)
    catalogue_run.add_parser(sub)
    p = sub.add_parser("readme", help="refresh the generated sections of spec/README.md")
    p.add_argument("--check", action="store_true", help="fail if a section is stale")
    p.set_defaults(func=readme)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except HtmqcError as exc:
        print(exc.line(), file=sys.stderr)
        return exc.exit_code
    return code


if __name__ == "__main__":
    sys.exit(main())
