"""A Hypothesis state machine run against a copy of ``src/`` with one mutant of
:mod:`tests.core.mutants.table` applied (the worktree is never touched).

:func:`run_on_copy` copies ``src/htmqc`` to a temporary directory, applies the
mutant there and runs ``python -m tests.core.mutants.on_copy MODULE:CLASS`` in a
child process whose ``PYTHONPATH`` puts the copy first (the tests and the
reference models still come from this tree), with contracts off
(``HTMQC_CONTRACTS=0``): only the machine's comparisons and invariants can
catch the bug. The child runs the machine with
:data:`~tests.core.mutants.stateful.MUTANT_SETTINGS` cut to ``examples``
examples (the same budget for the unmutated copy and the mutants) and exits 0
when it passes, 1 when an assertion of the machine fails, 2 on anything else.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.core.mutants.table import Mutant

ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Outcome:
    """What the child reported: ``"passed"``, ``"caught"`` or ``"error"``, the
    first line of the failure, and where the child imported ``htmqc.core`` from."""

    verdict: str
    detail: str
    core: str


def run_on_copy(
    mutant: Mutant | None, machine: str, tmp: Path, examples: int = 200, timeout: float = 600
) -> Outcome:
    """Run ``machine`` (``module:Class``) against a copy of ``src/`` with ``mutant``
    applied (``None``: the unmutated copy)."""
    src = tmp / "src"
    shutil.copytree(
        ROOT / "src" / "htmqc", src / "htmqc", ignore=shutil.ignore_patterns("__pycache__")
    )
    if mutant is not None:
        mutant.apply(src)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.core.mutants.on_copy", machine, str(examples)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)]),
             "HTMQC_CONTRACTS": "0"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = proc.stdout.splitlines()
    core = lines[0] if lines else ""
    detail = lines[1] if len(lines) > 1 else (proc.stderr.strip().splitlines() or [""])[-1]
    verdict = {0: "passed", 1: "caught"}.get(proc.returncode, "error")
    return Outcome(verdict, detail[:300], core)


def main(target: str, examples: int) -> int:
    """The child: run the machine once; see module docs for the exit status."""
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from tests.core.mutants.stateful import MUTANT_SETTINGS

    module, _, name = target.partition(":")
    try:
        import htmqc.core

        print(Path(htmqc.core.__file__).parent, flush=True)
        machine = getattr(importlib.import_module(module), name)
    except Exception as exc:  # a mutant that breaks the import is not caught by the machine
        print(f"\nimport failed: {type(exc).__name__}: {exc}", flush=True)
        return 2
    try:
        run_state_machine_as_test(
            machine, settings=settings(MUTANT_SETTINGS, max_examples=examples)
        )
    except AssertionError as exc:
        print(f"{type(exc).__name__}: {str(exc).strip().splitlines()[:1]}", flush=True)
        return 1
    except Exception as exc:
        print(f"the machine raised {type(exc).__name__}: {exc}", flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
