"""``make mutate``: run every mutant against the kill chain, at most two at a time.

A mutant runs the chain of :mod:`model_checks.mutation.config` (its module's
focused unit tests, then :data:`~model_checks.mutation.config.KILL_CHECKS`) and
stops at the first check that fails. Before any mutant, the whole chain runs
once on the unmutated tree under ``coverage``: every check must pass there
(else the run stops with the failing check named), its time sets that check's
limit (``TIMEOUT_FACTOR`` times the baseline, plus ``TIMEOUT_SLACK``), and the
lines it executes select the mutants it runs for. A check that never executes
any line a mutant changed behaves the same on the mutant (the run up to that
line is the same, and it never gets there, since the checks are
deterministic), so it is not run for that mutant (``uncovered``); by the same
argument a pytest check runs only the test files that executed one of the
mutant's lines (:mod:`model_checks.mutation.contexts`; all of them if one ran at
import). A check over its limit marks the mutant ``timeout``, which counts as
detected.

Results are appended to ``spec/mutation-results.jsonl`` (tracked: a new machine
resumes from it) as they come, so ``--resume`` skips mutants already run with the
same diff and chain.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import queue
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from coverage import CoverageData

from htmqc.errors import RuntimeFailure
from model_checks.mutation.config import KILL_CHECKS, PYTEST, ROOT, Command, focused_tests
from model_checks.mutation.execute import Outcome, run_command
from model_checks.mutation.mutants import Mutant
from model_checks.mutation.shadow import Shadow

#: Modules whose mutants run first (the offset logic), so a run cut short
#: has measured what matters most; the rest follow in file order.
FIRST = ("partition.py", "consumer.py")
TIMEOUT_FACTOR = 4.0
TIMEOUT_SLACK = 30.0

Status = Literal["killed", "timeout", "survived", "equivalent"]


@dataclass(frozen=True, slots=True)
class Result:
    """What became of one mutant."""

    id: str
    key: str
    file: str
    line: int
    function: str
    operator: str
    diff: str
    status: Status
    killed_by: str | None
    seconds: float
    checks: list[dict[str, Any]]
    chain: str
    reason: str | None = None


def chain_for(mutant_file: Path) -> list[Command]:
    """The checks a mutant of ``mutant_file`` runs, in order."""
    focused = focused_tests(mutant_file)
    return [*([focused] if focused else []), *KILL_CHECKS]


def chain_digest(chain: Iterable[Command], root: Path = ROOT) -> str:
    """A fingerprint of the checks (names and arguments, paths relative to
    ``root``, so a checkout elsewhere, a worktree, reuses the results): results
    of another chain are not reused by ``--resume``."""
    prefix = str(root) + os.sep
    text = json.dumps([[c.name, *(a.replace(prefix, "") for a in c.argv)] for c in chain])
    return hashlib.sha1(text.encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class Baseline:
    """Each check's time and executed lines on the unmutated tree, keyed by
    :func:`argv_key`; ``lines[key][file]`` are line numbers of ``file`` (a path
    relative to the repository root)."""

    seconds: dict[str, float]
    lines: dict[str, dict[str, frozenset[int]]]
    #: pytest checks only: ``files[key][file][line]``, the test files (relative to
    #: the repository root) that executed that line, ``""`` for no test (imports).
    files: dict[str, dict[str, dict[int, frozenset[str]]]] = field(default_factory=dict)

    def limit(self, command: Command) -> float:
        """The time limit of ``command``."""
        return TIMEOUT_FACTOR * self.seconds.get(argv_key(command), 60.0) + TIMEOUT_SLACK

    def covers(self, command: Command, mutant: Mutant) -> bool:
        """Whether ``command`` executes a line of the node ``mutant`` changed (True if
        not measured). The node's lines, not only the changed ones: the first line
        of a multi-line condition (``if (``) holds no bytecode of its own. A node
        with no bytecode on any of its lines (a parameter list's ``*,`` line: it
        takes effect when its ``def`` runs) cannot be seen by coverage, so every
        check runs for it."""
        measured = self.lines.get(argv_key(command))
        if measured is None:
            return True
        first = min(mutant.line, mutant.node_lines[0])
        last = max(mutant.last_line, mutant.node_lines[1])
        if not bytecode_lines(ROOT / mutant.file) & set(range(first, last + 1)):
            return True
        executed = measured.get(mutant.file, frozenset())
        return any(n in executed for n in range(first, last + 1))


    def narrowed(self, command: Command, mutant: Mutant) -> Command:
        """``command`` limited to the test files that executed a line of the node
        ``mutant`` changed (:mod:`model_checks.mutation.contexts`); ``command``
        itself if it is not a pytest check, or if a line ran outside any test
        (at import: every test depends on it). A file that never reaches the
        mutated code behaves the same on the mutant, as in :meth:`covers`."""
        by_line = self.files.get(argv_key(command), {}).get(mutant.file)
        if by_line is None:
            return command
        first = min(mutant.line, mutant.node_lines[0])
        last = max(mutant.last_line, mutant.node_lines[1])
        chosen: set[str] = set()
        for n in range(first, last + 1):
            chosen.update(by_line.get(n, ()))
        if not chosen or "" in chosen:
            return command
        return replace(command, argv=(*_options(command.argv),
                                      *(str(ROOT / f) for f in sorted(chosen))))


@functools.cache
def bytecode_lines(path: Path) -> frozenset[int]:
    """The lines of ``path`` that some bytecode is attributed to (what coverage
    can report as executed), from its compiled code objects; none if it does
    not compile."""
    try:
        code = compile(path.read_text(), str(path), "exec")
    except (OSError, SyntaxError):
        return frozenset()
    lines: set[int] = set()
    todo = [code]
    while todo:
        current = todo.pop()
        lines.update(line for _, _, line in current.co_lines() if line is not None)
        todo.extend(c for c in current.co_consts if isinstance(c, type(code)))
    return frozenset(lines)


def argv_key(command: Command) -> str:
    return " ".join(command.argv)


def baseline(mutated: Iterable[str], shadow: Shadow) -> Baseline:
    """Run every chain on the unmutated tree, under ``coverage``.

    :raises RuntimeFailure: a check fails without any mutant.
    """
    seconds: dict[str, float] = {}
    lines: dict[str, dict[str, frozenset[int]]] = {}
    files: dict[str, dict[str, dict[int, frozenset[str]]]] = {}
    for rel in sorted(set(mutated)):
        for command in chain_for(Path(rel)):
            key = argv_key(command)
            if key in seconds:
                continue
            data = shadow.work / f"coverage-{len(seconds)}"
            argv = command.argv
            if _is_pytest(command):  # each test file's lines apart
                argv = (*argv[:2], "-p", "model_checks.mutation.contexts", *argv[2:])
            measured = replace(command, argv=(
                "-m", "coverage", "run", f"--data-file={data}",
                f"--include={shadow.src}/*", *argv))
            outcome = run_command(measured, shadow, shadow.path_of(rel), timeout=3600)
            if outcome.verdict in ("fail", "timeout"):
                raise RuntimeFailure(
                    f"check {command.name} fails on the unmutated tree: {outcome.tail[-200:]}",
                    "make it pass before measuring mutants",
                )
            seconds[key] = outcome.seconds
            if outcome.verdict == "pass":
                lines[key] = _executed(data, shadow)
                if _is_pytest(command):
                    files[key] = _by_test_file(data, shadow)
            print(f"baseline {command.name:<12} {outcome.verdict:<8} {outcome.seconds:6.1f}s",
                  flush=True)
    return Baseline(seconds, lines, files)


#: pytest options whose value follows them (kept with it when the paths are replaced).
_VALUED = frozenset({"-m", "-k", "-p", "-o", "--ignore", "--deselect", "--rootdir"})


def _options(argv: tuple[str, ...]) -> tuple[str, ...]:
    """A pytest command line without its test paths (its options kept)."""
    out: list[str] = []
    rest = iter(argv)
    for arg in rest:
        if arg in _VALUED:
            out += [arg, next(rest)]
        elif arg.startswith(str(ROOT)):
            continue  # a test path
        else:
            out.append(arg)
    return tuple(out)


def _is_pytest(command: Command) -> bool:
    return command.argv[: len(PYTEST)] == PYTEST


def _by_test_file(data: Path, shadow: Shadow) -> dict[str, dict[int, frozenset[str]]]:
    covered = CoverageData(basename=str(data))
    covered.read()
    out = {}
    for name in covered.measured_files():
        rel = Path("src") / Path(name).relative_to(shadow.src)
        out[str(rel)] = {
            line: frozenset(contexts) for line, contexts in covered.contexts_by_lineno(name).items()
        }
    return out


def _executed(data: Path, shadow: Shadow) -> dict[str, frozenset[int]]:
    covered = CoverageData(basename=str(data))
    covered.read()
    out = {}
    for name in covered.measured_files():
        rel = Path("src") / Path(name).relative_to(shadow.src)
        out[str(rel)] = frozenset(covered.lines(name) or ())
    return out


def decide(
    outcomes: Sequence[Outcome], compiles: bool, reason: str | None
) -> tuple[Status, str | None]:
    """A mutant's status and the check that detected it, from what its checks said.

    A mutant that does not compile is killed by ``syntax``; the first check that
    fails kills it (``timeout`` if it ran out of time); a survivor whose key is
    in the equivalence file (``reason`` not ``None``) is ``equivalent``."""
    if not compiles:
        return "killed", "syntax"
    for outcome in outcomes:
        if outcome.detects:
            return ("timeout" if outcome.verdict == "timeout" else "killed"), outcome.name
    return ("equivalent" if reason is not None else "survived"), None


def problems(results: Iterable[Result], listed: Mapping[str, str]) -> list[str]:
    """One line per reason to fail: a survivor not listed as equivalent, or a
    mutant listed as equivalent that a check detected."""
    out = []
    for r in results:
        if r.status == "survived":
            out.append(f"SURVIVED {r.key}")
        elif r.status in ("killed", "timeout") and r.key in listed:
            out.append(f"LISTED AS EQUIVALENT BUT {r.status.upper()} by {r.killed_by}: {r.key}; "
                       "remove it from equivalent.toml")
    return out


def stale_listings(
    listed: Mapping[str, str], generated: Iterable[str], modules: Iterable[str]
) -> list[str]:
    """One line per entry of the equivalence file that names a module in scope
    (``modules``: file names) but no mutant generated from it now (its line
    changed or went): a stale reason, which would otherwise outlive its code."""
    keys, names = set(generated), set(modules)
    return [f"LISTED AS EQUIVALENT BUT NO SUCH MUTANT: {key}; remove it from equivalent.toml"
            for key in listed if key.split("::", 1)[0] in names and key not in keys]


def try_mutant(
    mutant: Mutant, shadow: Shadow, base: Baseline, equivalent: dict[str, str]
) -> Result:
    """Run ``mutant`` through its chain until a check detects it."""
    chain = chain_for(Path(mutant.file))
    started = time.monotonic()
    outcomes: list[Outcome] = []
    if mutant.compiles:
        with shadow.mutated(mutant.file, mutant.source) as path:
            for command in chain:
                if not base.covers(command, mutant):
                    outcomes.append(Outcome(command.name, "uncovered", 0.0))
                    continue
                outcome = run_command(base.narrowed(command, mutant), shadow, path,
                                      base.limit(command))
                outcomes.append(outcome)
                if outcome.detects:
                    break
    reason = equivalent.get(mutant.key)
    status, killer = decide(outcomes, mutant.compiles, reason)
    return Result(
        id=mutant.id,
        key=mutant.key,
        file=mutant.file,
        line=mutant.line,
        function=mutant.function,
        operator=mutant.operator,
        diff=mutant.diff,
        status=status,
        killed_by=killer,
        seconds=round(time.monotonic() - started, 2),
        checks=[
            {"name": o.name, "verdict": o.verdict, "seconds": round(o.seconds, 2)}
            for o in outcomes
        ],
        chain=chain_digest(chain),
        reason=reason if status == "equivalent" else None,
    )


def diff_body(diff: str) -> str:
    """``diff`` without its hunk headers (``@@ -131,3 +131,3 @@``): the mutant's
    changed line and its context, wherever they are in the file. A mutant whose
    text and surroundings are unchanged keeps its earlier result when lines are
    added above it (as ``--resume`` already keeps it when other files change)."""
    return "\n".join(line for line in diff.splitlines() if not line.startswith("@@"))


def load_previous(path: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Earlier results keyed by ``(key, diff_body(diff), chain)``."""
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out[(row["key"], diff_body(row["diff"]), row["chain"])] = row
    return out


def run_all(
    mutants: list[Mutant],
    equivalent: dict[str, str],
    results_path: Path,
    workers: int = 2,
    resume: bool = False,
    echo: Callable[[str], None] = print,
    cached_only: bool = False,
) -> tuple[list[Result], dict[str, float]]:
    """Every mutant, on ``workers`` shadow trees; returns the results in
    ``mutants`` order and the baseline times. ``cached_only``: run nothing,
    return only the mutants an earlier run measured."""
    previous = load_previous(results_path) if resume else {}
    results_path.parent.mkdir(parents=True, exist_ok=True)
    if not resume:
        results_path.write_text("")
    with tempfile.TemporaryDirectory(prefix="htmqc-mutate-") as tmp:
        shadows: queue.Queue[Shadow] = queue.Queue()
        for n in range(workers):
            shadows.put(Shadow(Path(tmp) / f"w{n}"))
        done: dict[str, Result] = {}
        todo = []
        for m in mutants:
            row = previous.get((m.key, diff_body(m.diff), chain_digest(chain_for(Path(m.file)))))
            if row is not None and row["status"] in ("survived", "equivalent") and not any(
                c["verdict"] in ("pass", "fail", "timeout") for c in row["checks"]
            ):
                row = None  # no check ran: coverage is decided again (the rule may have changed)
            if row is None:
                todo.append(m)
                continue
            # the equivalence list may have changed since
            reason = equivalent.get(m.key)
            status, killer = decide([Outcome(**c) for c in row["checks"]], True, reason)
            if row["killed_by"] == "syntax":
                status, killer = "killed", "syntax"
            done[m.id] = Result(**{**row, "id": m.id, "line": m.line, "diff": m.diff,
                                   "status": status, "killed_by": killer,
                                   "reason": reason if status == "equivalent" else None})
        if cached_only:
            todo = []
        todo.sort(key=lambda m: FIRST.index(Path(m.file).name)
                  if Path(m.file).name in FIRST else len(FIRST))
        echo(f"mutate: {len(mutants)} mutants, {len(done)} from an earlier run, "
             f"{len(todo)} to run on {workers} worker(s)")
        base = Baseline({}, {})
        if todo:
            first = shadows.get()
            base = baseline((m.file for m in todo), first)
            shadows.put(first)

        def work(m: Mutant) -> Result:
            shadow = shadows.get()
            try:
                return try_mutant(m, shadow, base, equivalent)
            finally:
                shadows.put(shadow)

        with ThreadPoolExecutor(max_workers=workers) as pool, results_path.open("a") as log:
            for n, result in enumerate(pool.map(work, todo), start=1):
                done[result.id] = result
                log.write(json.dumps(asdict(result)) + "\n")
                log.flush()
                echo(f"[{n}/{len(todo)}] {result.status:<10} {result.killed_by or '-':<12} "
                     f"{result.seconds:6.1f}s {result.key}")
    return [done[m.id] for m in mutants if m.id in done], base.seconds
