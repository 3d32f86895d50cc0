"""The mutants of ``make mutate``: Cosmic Ray's operators over ``src/htmqc/core``.

Cosmic Ray (``cosmic-ray`` on PyPI) enumerates the mutation sites of each module
into its session database (``build/mutation/session.sqlite``, readable with
``cr-report``) and applies one mutation to a source text. From its work items
this module keeps what is worth running:

* sites inside a contract decorator (``@icontract.*``, ``@capture_old``,
  ``@_keeps_invariant``) or a contract predicate (:data:`CONTRACT_PREDICATES`)
  are not mutated: the contracts are the specification the code is checked
  against, not the code (and weakening a check that a correct implementation
  never fails changes nothing: such mutants are equivalent);
* sites inside annotations are not mutated: ``from __future__ import
  annotations`` means they are never evaluated, so every such mutant would be
  equivalent;
* two operators that yield the same mutated text count once.

Every mutant gets a stable *key*, ``file::function::old => new`` (the module's
name, the qualified name of the enclosing function, the changed source line
before and after, stripped), which survives unrelated edits that move lines;
the equivalence file is keyed by it. A second identical change inside one
function gets ``#2``, and so on.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import cosmic_ray.plugins  # type: ignore[import-untyped]
from cosmic_ray.commands.init import init  # type: ignore[import-untyped]
from cosmic_ray.mutating import mutate_code  # type: ignore[import-untyped]
from cosmic_ray.work_db import WorkDB, use_db  # type: ignore[import-untyped]

from model_checks.mutation.config import ROOT

#: What ``make mutate`` mutates.
TARGET = ROOT / "src" / "htmqc" / "core"
#: Decorators whose arguments are contracts (not mutated).
CONTRACT_DECORATORS = ("icontract.", "capture_old", "_keeps_invariant")
#: Functions that only contracts call: the invariant the postconditions check.
CONTRACT_PREDICATES = frozenset({"tracker_invariant", "_invariant_after"})

Span = tuple[tuple[int, int], tuple[int, int]]


@dataclass(frozen=True, slots=True)
class Mutant:
    """One mutated module (see module docs for ``key``)."""

    id: str
    file: str
    line: int
    last_line: int
    node_lines: tuple[int, int]
    function: str
    operator: str
    old: str
    new: str
    diff: str
    key: str
    compiles: bool
    source: str = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class Generated:
    """The mutants, and how many sites were left out and why."""

    mutants: list[Mutant]
    left_out: dict[str, int]


def core_files() -> list[Path]:
    """The modules ``make mutate`` mutates, sorted."""
    return sorted(TARGET.glob("*.py"))


def generate(files: Iterable[Path], session: Path, root: Path = ROOT) -> Generated:
    """Every mutant of ``files`` worth running (see module docs); Cosmic Ray's
    work items are (re)written to ``session``. Paths are reported relative to ``root``."""
    files = list(files)
    session.parent.mkdir(parents=True, exist_ok=True)
    session.unlink(missing_ok=True)
    with use_db(str(session), WorkDB.Mode.create) as db:
        init(files, db, {})
        items = sorted(
            db.work_items,
            key=lambda w: (str(w.mutations[0].module_path), w.mutations[0].start_pos,
                           w.mutations[0].operator_name, w.mutations[0].occurrence),
        )
    left_out: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    keys: Counter[str] = Counter()
    out = []
    texts = {p: p.read_text() for p in files}
    shapes = {p: _Shape(texts[p]) for p in files}
    for item in items:
        spec = item.mutations[0]
        path = Path(spec.module_path)
        shape = shapes[path]
        if shape.in_contract(spec.start_pos):
            left_out["contracts"] += 1
            continue
        if shape.in_annotation(spec.start_pos):
            left_out["annotations"] += 1
            continue
        operator = cosmic_ray.plugins.get_operator(spec.operator_name)(**spec.operator_args)
        mutated = mutate_code(texts[path], operator, spec.occurrence)
        if mutated is None or mutated == texts[path]:
            left_out["no change"] += 1
            continue
        rel = str(path.resolve().relative_to(root))
        if (rel, mutated) in seen:
            left_out["duplicates of another operator's mutant"] += 1
            continue
        seen.add((rel, mutated))
        mutant = _mutant(rel, texts[path], mutated, spec.operator_name, shape, keys)
        out.append(replace(mutant, node_lines=(spec.start_pos[0], spec.end_pos[0])))
    return Generated(out, dict(sorted(left_out.items())))


def _mutant(
    rel: str, original: str, mutated: str, operator: str, shape: _Shape, keys: Counter[str]
) -> Mutant:
    before, after = original.splitlines(), mutated.splitlines()
    diff = "\n".join(
        difflib.unified_diff(before, after, f"a/{rel}", f"b/{rel}", n=1, lineterm="")
    )
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    first = next(op for op in matcher.get_opcodes() if op[0] != "equal")
    _, i1, i2, j1, j2 = first
    old = " ⏎ ".join(s.strip() for s in before[i1:i2] if s.strip())
    new = " ⏎ ".join(s.strip() for s in after[j1:j2] if s.strip())
    # difflib may take blank lines next to a removed one into the change
    while i1 < i2 - 1 and not before[i1].strip():
        i1 += 1
    line = i1 + 1
    last_line = max(i2, line)
    function = shape.function_at(line)
    base = f"{Path(rel).name}::{function}::{old} => {new}"
    keys[base] += 1
    key = base if keys[base] == 1 else f"{base} #{keys[base]}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)  # `x is 1`: compiles, and runs
            compile(mutated, rel, "exec")
        compiles = True
    except SyntaxError:
        compiles = False
    digest = hashlib.sha1(key.encode()).hexdigest()[:8]
    return Mutant(
        id=f"{Path(rel).stem}-{digest}",
        file=rel,
        line=line,
        last_line=last_line,
        node_lines=(line, last_line),
        function=function,
        operator=operator.rsplit("/", 1)[-1],
        old=old,
        new=new,
        diff=diff,
        key=key,
        compiles=compiles,
        source=mutated,
    )


def function_spans(text: str) -> list[tuple[int, int, str]]:
    """``(first line, last line, qualified name)`` of every function and class
    of a module's ``text`` (decorators included)."""
    return _Shape(text).functions


class _Shape:
    """Where a module's functions, contract decorators and annotations are."""

    def __init__(self, text: str) -> None:
        tree = ast.parse(text)
        self.functions: list[tuple[int, int, str]] = []
        self.contracts: list[Span] = []
        self.annotations: list[Span] = []
        self._walk(tree, "")

    def _walk(self, node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                self.functions.append((start, child.end_lineno or child.lineno, name))
                if child.name in CONTRACT_PREDICATES:
                    self.contracts.append(((child.lineno, 0), (child.end_lineno or 0, 10**6)))
                for decorator in child.decorator_list:
                    if ast.unparse(decorator).startswith(CONTRACT_DECORATORS):
                        (line, col), end = _span(decorator)
                        self.contracts.append(((line, col - 1), end))  # from the "@"
                if not isinstance(child, ast.ClassDef):
                    self._annotations_of(child)
                self._walk(child, f"{name}.")
            else:
                if isinstance(child, ast.AnnAssign):
                    self.annotations.append(_span(child.annotation))
                self._walk(child, prefix)

    def _annotations_of(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        a = fn.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
            if arg is not None and arg.annotation is not None:
                self.annotations.append(_span(arg.annotation))
        if fn.returns is not None:
            self.annotations.append(_span(fn.returns))

    def function_at(self, line: int) -> str:
        """The innermost function (or class) whose lines contain ``line``."""
        inside = [(s, name) for s, e, name in self.functions if s <= line <= e]
        return max(inside)[1] if inside else "<module>"

    def in_contract(self, pos: tuple[int, int]) -> bool:
        return any(_within(pos, span) for span in self.contracts)

    def in_annotation(self, pos: tuple[int, int]) -> bool:
        return any(_within(pos, span) for span in self.annotations)


def _span(node: ast.expr) -> Span:
    end = (node.end_lineno or node.lineno, node.end_col_offset or 0)
    return (node.lineno, node.col_offset), end


def _within(pos: tuple[int, int], span: Span) -> bool:
    return span[0] <= pos < span[1]
