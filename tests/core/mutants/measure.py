"""How often a test catches each mutant of :mod:`tests.core.mutants.table`.

``python -m tests.core.mutants.measure [--seeds 0 1 2 3 4] [--test PATH] [NAME ...]``
copies ``src/``, ``tests/``, ``model_checks/`` and ``pyproject.toml`` to a
temporary directory, applies one mutant there (the worktree is never touched),
runs ``pytest PATH --hypothesis-seed=N`` once per seed and prints how many
seeds failed the test, with the first line of each failure. The unmutated copy
is run first and must pass every seed. ``HYPOTHESIS_PROFILE`` passes through
(default ``ci``); :mod:`tests.core.mutants.no_shrink` drops shrinking and the
example database from it, which changes run times, not catches.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.core.mutants.table import BY_NAME, MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[3]
_COPIED = ("src", "tests", "model_checks", "pyproject.toml")


def _copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", ".pytest_cache")
    for name in _COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=ignore)
        else:
            shutil.copy2(source, dest / name)


def _run(
    tree: Path, test: str, seed: int, timeout: float, contracts: str
) -> tuple[str, float, str]:
    """``"pass"``, ``"caught"`` or ``"error"`` for one seed, the seconds it took,
    and the first error line pytest printed."""
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
             "-p", "tests.core.mutants.no_shrink",
             f"--hypothesis-seed={seed}", test],
            cwd=tree,
            env={
                **os.environ,
                "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'src'}",
                "HTMQC_CONTRACTS": contracts,
            },
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "error", time.monotonic() - started, f"timed out after {timeout}s"
    verdict = {0: "pass", 1: "caught"}.get(proc.returncode, "error")
    errors = [line for line in proc.stdout.splitlines() if line.startswith("E ")]
    return verdict, time.monotonic() - started, (errors[:1] or [""])[0][:150]


def measure(
    mutant: Mutant | None, test: str, seeds: list[int], timeout: float, contracts: str
) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="htmqc-mutant-") as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        if mutant is not None:
            mutant.apply(tree / "src")
        verdicts = []
        for seed in seeds:
            verdict, seconds, why = _run(tree, test, seed, timeout, contracts)
            name = mutant.name if mutant else "(none)"
            print(f"  {name:<30} seed {seed}: {verdict:<6} {seconds:6.1f}s {why}", flush=True)
            verdicts.append(verdict)
        return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"mutants (default: all): {', '.join(BY_NAME)}")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--test", default="tests/core/test_stateful.py")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument(
        "--contracts",
        choices=["1", "0"],
        default="1",
        help="HTMQC_CONTRACTS for the runs (0: the model comparison alone)",
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown mutant {unknown[0]!r}; choose from {', '.join(BY_NAME)}")
    chosen = [BY_NAME[n] for n in args.names] or list(MUTANTS)
    clean = measure(None, args.test, args.seeds, args.timeout, args.contracts)
    if set(clean) != {"pass"}:
        print(f"the unmutated code does not pass {args.test}: {clean}", file=sys.stderr)
        return 1
    rows = [(m, measure(m, args.test, args.seeds, args.timeout, args.contracts)) for m in chosen]
    print(
        f"\n{'mutant':<30} caught  errors  (of {len(args.seeds)} seeds, {args.test}, "
        f"HTMQC_CONTRACTS={args.contracts})"
    )
    for m, verdicts in rows:
        print(f"{m.name:<30} {verdicts.count('caught'):>6}  {verdicts.count('error'):>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
