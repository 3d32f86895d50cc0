"""The one place that says which commands may kill a mutant, and in what order.

Two lists, built from the same commands:

* :data:`KILL_CHECKS`: the fast deterministic checks of ``make mutate``, cheapest
  first. A mutant runs them in this order and is killed by the first that fails
  (the focused unit tests of its own module run before all of them, see
  :func:`focused_tests`).
* :data:`LAYERS`: every verification layer of ``make verify`` (and the sink
  tests), run one by one against each bug of the catalogue.

Each command is a child ``python`` process that imports ``htmqc`` normally, with
the mutated copy first on ``PYTHONPATH`` (:mod:`model_checks.mutation.shadow`).
Pytest gets ``-o pythonpath=`` because ``pyproject.toml``'s ``pythonpath``
would otherwise put the real ``src`` in front of the mutated copy, and
``--hypothesis-seed=0`` (with a fresh example database per run) so a verdict
does not depend on the draw or on an earlier mutant's saved failures.

:data:`PENDING` lists modules that other branches are adding right now. While
one of them has no entry point in this tree, the checks that run it are skipped
(and reported as skipped). Once they are merged, empty it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

#: Modules not merged into this tree yet; their checks are skipped while absent.
PENDING: frozenset[str] = frozenset()

#: pytest in a child process: derandomized, no cache, the mutated copy not shadowed.
PYTEST: tuple[str, ...] = (
    "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", "pythonpath=",
    "--hypothesis-seed=0", "--no-header",
)

STATEFUL = "tests/core/test_stateful.py"
CROSSHAIR_TESTS = "tests/core/test_crosshair_gate.py"
CROSSHAIR_TIMEOUT = 4


@dataclass(frozen=True, slots=True)
class Command:
    """One check or layer: ``python *argv`` run from a scratch directory.

    ``module``: the module ``argv`` runs with ``-m``; when it is in
    :data:`PENDING` and has no entry point here, the command is skipped.
    ``reads_code``: False for a layer whose verdict cannot depend on the code
    under test (it reads only ``tla/``); the catalogue runs it once, unmutated.
    ``scope``: run only for bugs in files under this path (``None``: all); a
    ``{file}`` in ``argv`` is replaced by the mutated file's path.
    """

    name: str
    argv: tuple[str, ...]
    module: str
    reads_code: bool = True
    scope: str | None = None

    def pending(self) -> bool:
        """True while this command's module is listed in :data:`PENDING` and absent."""
        return self.module in PENDING and not has_entry_point(self.module)

    def resolved(self, mutated_file: Path) -> tuple[str, ...]:
        """``argv`` with ``{file}`` replaced by the mutated file's path."""
        return tuple(a.replace("{file}", str(mutated_file)) for a in self.argv)


def has_entry_point(module: str) -> bool:
    """Whether ``python -m module`` would run something: a package with a
    ``__main__`` or a module with a ``__main__`` guard."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return False
    if spec is None or spec.origin is None:
        return False
    if spec.submodule_search_locations is not None:
        return importlib.util.find_spec(f"{module}.__main__") is not None
    return "__name__ == \"__main__\"" in Path(spec.origin).read_text()


def _tests(*paths: str) -> tuple[str, ...]:
    return tuple(str(ROOT / p) for p in paths)


VECTORS = Command("vectors", ("-m", "spec.conformance.replay"), "spec.conformance.replay")
PROOFS = Command("proofs", ("-m", "proofs"), "proofs")
GRAPH = Command("graph-replay", ("-m", "model_checks.graph_replay"), "model_checks.graph_replay")
STATEFUL_TESTS = Command("stateful", (*PYTEST, *_tests(STATEFUL)), "pytest")

#: The kill chain of ``make mutate``, cheapest first (measured: ``spec`` ~1 s,
#: ``unit`` ~8 s, ``proofs`` ~7 s, ``stateful`` ~18 s on this machine).
KILL_CHECKS: tuple[Command, ...] = (
    VECTORS,
    Command("spec-tests", (*PYTEST, *_tests("tests/spec")), "pytest"),
    Command(
        "unit",
        (*PYTEST, *_tests("tests/core", "tests/proofs"), "--ignore", str(ROOT / STATEFUL),
         # CrossHair's own can-fail tests check the gate on a copy of the real core
         # (not the mutant), under a wall-clock budget: no verdict about the mutant.
         "--ignore", str(ROOT / CROSSHAIR_TESTS)),
        "pytest",
    ),
    PROOFS,
    STATEFUL_TESTS,
    GRAPH,
)

#: The verification layers the catalogue runs separately against each bug.
LAYERS: tuple[Command, ...] = (
    Command(
        "crosshair",
        ("-m", "model_checks.crosshair_gate", "--per-condition-timeout", str(CROSSHAIR_TIMEOUT),
         "--report", "crosshair-report.json", "{file}"),
        "model_checks.crosshair_gate",
    ),
    PROOFS,
    Command(
        "tlc", ("-m", "model_checks.tlc_cli", "--config", "small"), "model_checks.tlc_cli",
        reads_code=False,
    ),
    GRAPH,
    VECTORS,
    Command("spec-tests", (*PYTEST, *_tests("tests/spec")), "pytest"),
    Command(
        "formal",
        (*PYTEST, "-m", "formal", *_tests("tests"), "--deselect",
         "tests/formal/test_tlc.py::test_small_gate_passes_with_expected_failures"),
        "pytest",
    ),
    Command("tests-core", (*PYTEST, *_tests("tests/core")), "pytest"),
    Command(
        "tests-sinks",
        (*PYTEST, *_tests("tests/sinks", "tests/chaos/test_fence_switch.py",
                          "tests/runtime/test_fencing.py")),
        "pytest",
        scope="src/htmqc/sinks/",
    ),
)


def focused_tests(mutated: Path) -> Command | None:
    """The unit tests named after the mutated module (``tests/core/test_*partition*.py``
    for ``partition.py``), run before every other check; ``None`` if there are none.
    CrossHair's own can-fail tests are never among them (``test_crosshair_gate.py``
    matches ``gate.py``): they check a copy of the real core, not the mutant, under a
    wall-clock budget, so they can only cost time or fail for want of it, as in
    :data:`KILL_CHECKS`' ``unit``."""
    package = mutated.parent.name
    found = sorted(p for p in (ROOT / "tests" / package).glob(f"test_*{mutated.stem}*.py")
                   if p != ROOT / CROSSHAIR_TESTS)
    if not found:
        return None
    return Command("focused", (*PYTEST, *(str(p) for p in found)), "pytest")
