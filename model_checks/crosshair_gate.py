"""CrossHair gate: symbolic execution of every icontract contract in the core.

``python -m model_checks.crosshair_gate [--per-condition-timeout S] [TARGET ...]``
runs ``crosshair check --analysis_kind=icontract`` over each module of
``src/htmqc/core`` (or the given files), one child process per module, and fails
(exit 1) if CrossHair reports any counterexample or unexpected exception. A JSON
report goes to ``build/crosshair/report.json``.

What it proves, and what it does not: CrossHair explores paths of each
contracted function with symbolic inputs (objects built through their
constructors) until the per-condition timeout; a clean run means no
counterexample was found in that budget, not a proof. The proofs of
inductiveness are Z3's (``proofs/``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "src" / "htmqc" / "core"
_FINDING = re.compile(r"^(?P<path>[^:\n]+\.py):(?P<line>\d+): error: (?P<message>.*)$")


@dataclass(frozen=True)
class Finding:
    """One counterexample or exception reported by CrossHair."""

    path: str
    line: int
    message: str


@dataclass(frozen=True)
class ModuleResult:
    """CrossHair's verdict on one file."""

    target: str
    seconds: float
    exit_code: int
    findings: list[Finding]


def check(target: Path, per_condition_timeout: float) -> ModuleResult:
    """Run CrossHair over one file and parse what it reports."""
    started = time.monotonic()
    env = {**os.environ, "HTMQC_CONTRACTS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "crosshair",
            "check",
            "--analysis_kind=icontract",
            f"--per_condition_timeout={per_condition_timeout}",
            str(target),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    findings = [
        Finding(m["path"], int(m["line"]), m["message"])
        for m in map(_FINDING.match, proc.stdout.splitlines())
        if m
    ]
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not findings):
        # CrossHair itself failed: surface it as a finding rather than a pass.
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        findings.append(Finding(str(target), 0, f"crosshair exited {proc.returncode}: {tail[0]}"))
    return ModuleResult(str(target), time.monotonic() - started, proc.returncode, findings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", type=Path, help="files (default: the core)")
    parser.add_argument("--per-condition-timeout", type=float, default=4.0)
    parser.add_argument("--report", type=Path, default=ROOT / "build" / "crosshair" / "report.json")
    args = parser.parse_args(argv)
    targets = args.targets or sorted(p for p in CORE.glob("*.py") if p.name != "__init__.py")
    results = []
    for target in targets:
        result = check(target, args.per_condition_timeout)
        verdict = "ok" if not result.findings else f"{len(result.findings)} finding(s)"
        print(f"crosshair {target.name:<16} {result.seconds:6.1f}s  {verdict}", flush=True)
        for f in result.findings:
            print(f"  {f.path}:{f.line}: {f.message}")
        results.append(result)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    failed = sum(len(r.findings) for r in results)
    print(f"crosshair: {len(results)} module(s), {failed} finding(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
