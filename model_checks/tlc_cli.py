"""The TLC gate: run every model of one size from ``tla/manifest.json``.

``python -m model_checks.tlc_cli --config small`` runs each model of that size
in its own child JVM (see :mod:`model_checks.tlc`), compares the outcome with
the manifest and prints a table. A model *matches* when

* it is expected to ``pass`` and TLC found no error, with the distinct-state
  count recorded in the manifest (a different count means the model changed:
  re-run with ``--update`` and review the new figures); or
* it is expected to violate a property and TLC stopped with exactly that
  property violated (expected failures are part of the gate: they show that
  the properties can fail).

Coverage. Every run passes TLC ``-coverage 1``. A passing model must fire
every action of the spec except those its manifest entry lists under
``idle`` (actions its constants switch off, e.g. ``SessionExpired`` with
``MaxExpiries = 0``); an idle action that fires is a mismatch too, so the
list stays true. When a whole size runs, every action must fire in at least
one of its passing models. A passing model that leaves an action unexplored
would prove nothing about it.

Exit status: 0 all match, 1 any mismatch, 2 bad usage. ``--model NAME`` runs
one model; ``--show-trace`` prints counterexamples; ``--update`` writes the
measured counts and times back into the manifest. The JSON report goes to
``build/tlc/<size>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from htmqc.errors import HtmqcError, UsageError
from model_checks.tlc import TLA_DIR, TlcResult, format_counterexample, run_model, write_report

MANIFEST = TLA_DIR / "manifest.json"


@dataclass(frozen=True)
class Verdict:
    """A run compared with its manifest entry."""

    entry: dict[str, Any]
    result: TlcResult
    matches: bool
    reason: str


def load_manifest(path: Path = MANIFEST) -> dict[str, Any]:
    """The manifest as data.

    :raises UsageError: missing or not valid JSON.
    """
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"manifest {path} not found", "run from the repository root") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"manifest {path} is not valid JSON ({exc})", "fix the file") from None
    if not isinstance(data.get("models"), list):
        raise UsageError(f"manifest {path} has no 'models' list", "see tla/README.md")
    return data


def coverage_problem(entry: dict[str, Any], coverage: dict[str, int]) -> str | None:
    """Why a passing model's action coverage does not match its entry, or None."""
    if not coverage:
        return "TLC reported no action coverage"
    idle = set(entry.get("idle", []))
    unknown = sorted(idle - set(coverage))
    if unknown:
        return f"manifest lists unknown idle actions {', '.join(unknown)}"
    silent = sorted(a for a, n in coverage.items() if n == 0 and a not in idle)
    if silent:
        return f"actions never fire: {', '.join(silent)}"
    busy = sorted(a for a in idle if coverage[a] > 0)
    if busy:
        return f"actions listed idle fire: {', '.join(busy)} (fix 'idle' in the manifest)"
    return None


def judge(entry: dict[str, Any], result: TlcResult) -> Verdict:
    """Compare one result with what the manifest expects."""
    expected = entry["expected"]
    if result.violated == "timeout":
        return Verdict(entry, result, False, f"timed out after {result.seconds:.0f} s")
    if result.errors and result.exit_code not in (0, 12, 13):
        return Verdict(entry, result, False, f"TLC error: {result.errors[0][:120]}")
    if expected == "pass":
        if not result.passed:
            return Verdict(entry, result, False, f"expected pass, {result.violated} violated")
        recorded = entry.get("distinct_states")
        if recorded is not None and recorded != result.distinct_states:
            return Verdict(
                entry, result, False,
                f"distinct states {result.distinct_states} != manifest {recorded}",
            )
        problem = coverage_problem(entry, result.coverage)
        if problem is not None:
            return Verdict(entry, result, False, problem)
        fired = sum(1 for n in result.coverage.values() if n > 0)
        return Verdict(entry, result, True, f"pass, {fired}/{len(result.coverage)} actions fire")
    if result.passed:
        return Verdict(entry, result, False, f"expected {expected} violated, TLC passed")
    if result.violated != expected:
        return Verdict(entry, result, False, f"expected {expected} violated, got {result.violated}")
    return Verdict(entry, result, True, f"{expected} violated, as expected")


def never_fired(verdicts: list[Verdict]) -> list[str]:
    """Actions that fire in none of the passing models among ``verdicts``."""
    passing = [v.result.coverage for v in verdicts if v.entry["expected"] == "pass"]
    actions = {a for coverage in passing for a in coverage}
    return sorted(a for a in actions if all(c.get(a, 0) == 0 for c in passing))


def run_entry(entry: dict[str, Any], timeout: float, workers: str = "1") -> Verdict:
    """Run one manifest entry (with action coverage) and judge it."""
    result = run_model(
        entry["name"], entry["module"], entry["config"],
        check_deadlock=bool(entry.get("check_deadlock", False)), timeout=timeout,
        workers=workers, coverage=True,
    )
    return judge(entry, result)


def table(verdicts: list[Verdict]) -> str:
    """A plain-text table of the verdicts."""
    rows = [("model", "expected", "result", "distinct", "depth", "seconds", "verdict")]
    for v in verdicts:
        r = v.result
        rows.append((
            v.entry["name"], str(v.entry["expected"]),
            "pass" if r.passed else f"{r.violated} (exit {r.exit_code})",
            str(r.distinct_states), str(r.depth), f"{r.seconds:.1f}",
            ("ok: " if v.matches else "MISMATCH: ") + v.reason,
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m model_checks.tlc_cli", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument(
        "--config", default="small", help="model size from the manifest (small, medium, unit)"
    )
    parser.add_argument("--model", action="append", default=[], help="run only this model")
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per model")
    parser.add_argument("--show-trace", action="store_true", help="print counterexamples")
    parser.add_argument(
        "--workers", default="1", help="TLC workers per model (1 keeps counts reproducible)"
    )
    parser.add_argument(
        "--update", action="store_true", help="record measured counts in the manifest"
    )
    args = parser.parse_args(argv)
    try:
        manifest = load_manifest(args.manifest)
        entries = [e for e in manifest["models"] if e["size"] == args.config]
        if args.model:
            known = {e["name"] for e in entries}
            unknown = sorted(set(args.model) - known)
            if unknown:
                raise UsageError(
                    f"no {args.config} model named {', '.join(unknown)}",
                    f"choose from {', '.join(sorted(known))}",
                )
            entries = [e for e in entries if e["name"] in args.model]
        if not entries:
            sizes = sorted({e["size"] for e in manifest["models"]})
            raise UsageError(
                f"no models of size {args.config!r}", f"choose from {', '.join(sizes)}"
            )
        verdicts = []
        for entry in entries:
            verdict = run_entry(entry, args.timeout, args.workers)
            verdicts.append(verdict)
            print(f"{entry['name']}: {verdict.reason} ({verdict.result.seconds:.1f} s)", flush=True)
            if args.show_trace and verdict.result.counterexample:
                print(format_counterexample(verdict.result.counterexample))
    except HtmqcError as exc:
        print(f"error: {exc.line()}", file=sys.stderr)
        return exc.exit_code
    report = write_report([v.result for v in verdicts], args.config)
    print(table(verdicts))
    print(f"report: {report}")
    silent = [] if args.model else never_fired(verdicts)
    if silent:
        print(f"MISMATCH: actions that fire in no passing {args.config} model: {', '.join(silent)}")
    if args.update:
        for v in verdicts:
            v.entry["distinct_states"] = v.result.distinct_states
            v.entry["depth"] = v.result.depth
            v.entry["seconds"] = v.result.seconds
        args.manifest.write_text(json.dumps(manifest, indent=2) + "\n")
        print(f"manifest updated: {args.manifest}")
        return 0
    return 0 if all(v.matches for v in verdicts) and not silent else 1


if __name__ == "__main__":
    sys.exit(main())
