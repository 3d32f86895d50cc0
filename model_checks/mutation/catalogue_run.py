"""``python -m model_checks.mutation catalogue``: which layer catches which named bug.

Every bug of :data:`~model_checks.mutation.catalogue.CATALOGUE` is applied alone
to a scratch copy of the tree; every layer of
:data:`~model_checks.mutation.config.LAYERS` runs against it separately, with a
time limit each. First each layer runs once on the unmutated tree: a layer that
fails there is *broken* and its verdicts are not counted. A layer that does not
read the code (TLC: it checks ``tla/`` only) is run once, unmutated, and its
verdict recorded for every bug: it cannot see a code change. The run exits 1
if a bug is caught by no layer.

Every verdict is appended to ``spec/catalogue-results.jsonl``
(:data:`~model_checks.mutation.report.CATALOGUE_LEDGER`) as it comes; with
``--resume`` a run measures only what the ledger lacks (:func:`verdict_key`), so
the catalogue, about five hours of one worker here (measured 2026-12-07), can be
measured in parts (``--only``, ``--layers``, or an interrupted run) and still make
one table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import queue
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TypeVar

from htmqc.errors import UsageError
from model_checks.mutation import report
from model_checks.mutation.catalogue import CATALOGUE, Bug
from model_checks.mutation.config import LAYERS, ROOT, Command
from model_checks.mutation.execute import run_command
from model_checks.mutation.kill import chain_digest
from model_checks.mutation.mutants import function_spans
from model_checks.mutation.shadow import Shadow

DEFAULT_TIMEOUT = 900.0


class _Named(Protocol):
    @property
    def name(self) -> str: ...


_T = TypeVar("_T", bound=_Named)


def apply_bug(text: str, bug: Bug) -> str:
    """``text`` with ``bug.old`` replaced by ``bug.new`` on the one line of
    ``bug.function`` that holds exactly ``bug.old`` (stripped).

    :raises UsageError: the function is not in ``text``, ``old`` is not found on
        exactly one of its lines, or the result does not compile.
    """
    lines = text.splitlines(keepends=True)
    if bug.function == "<module>":
        first, last = 1, len(lines)
    else:
        spans = [(s, e) for s, e, name in function_spans(text) if name == bug.function]
        if not spans:
            raise UsageError(f"{bug.name}: no function {bug.function} in {bug.file}",
                             "fix the bug's function name in catalogue.py")
        first, last = spans[0]
    hits = [n for n in range(first - 1, last) if lines[n].strip() == bug.old.strip()]
    if len(hits) != 1:
        raise UsageError(
            f"{bug.name}: `{bug.old}` is on {len(hits)} lines of {bug.function} in {bug.file}",
            "make the bug's old text match exactly one whole line",
        )
    n = hits[0]
    indent = lines[n][: len(lines[n]) - len(lines[n].lstrip())]
    ending = "\n" if lines[n].endswith("\n") else ""
    lines[n] = f"{indent}{bug.new.strip()}{ending}"
    mutated = "".join(lines)
    try:
        compile(mutated, bug.file, "exec")
    except SyntaxError as exc:
        raise UsageError(f"{bug.name}: the new line does not compile ({exc.msg})",
                         "fix the bug's new text in catalogue.py") from None
    return mutated


def _applies(layer: Command, bug: Bug) -> bool:
    return layer.scope is None or bug.file.startswith(layer.scope)


def catalogue_sources() -> str:
    """The fingerprint of what a catalogue report depends on."""
    here = Path(__file__).resolve().parent
    files = {ROOT / bug.file for bug in CATALOGUE}
    return report.digest([*files, here / "catalogue.py", here / "config.py"])


def _named(items: Sequence[_T], names: Sequence[str] | None, what: str) -> list[_T]:
    """The ``items`` whose ``name`` is in ``names`` (all of them if none are named).

    :raises UsageError: a name that no item has (``what`` says what kind).
    """
    if not names:
        return list(items)
    known = [item.name for item in items]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise UsageError(f"no {what} {', '.join(unknown)}",
                         f"choose from: {', '.join(sorted(known))}")
    return [item for item in items if item.name in names]


def select(only: Sequence[str] | None, layer_names: Sequence[str] | None
           ) -> tuple[list[Bug], list[Command]]:
    """The bugs and layers named (all by default).

    :raises UsageError: an unknown bug or layer name.
    """
    return _named(CATALOGUE, only, "catalogue entry"), _named(LAYERS, layer_names, "layer")


def verdict_key(layer: Command, bug: Bug, mutated: str) -> str:
    """What a layer's verdict on ``bug`` depends on, as a fingerprint: the layer's
    command (:func:`~model_checks.mutation.kill.chain_digest`) and the mutated
    file, or, for a layer that reads no code, the ``tla/`` files it reads. A row of
    the ledger is reused only under the same key, so a change to the bug's file
    or to the layer's command measures it again (a change to a test file does
    not: as for ``make mutate``, run without ``--resume`` after one)."""
    h = hashlib.sha256(chain_digest([layer]).encode())
    if layer.reads_code:
        h.update(bug.file.encode() + b"\0" + mutated.encode())
    else:
        h.update(report.digest(p for p in (ROOT / "tla").rglob("*") if p.is_file()).encode())
    return h.hexdigest()[:16]


def load_verdicts(path: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The ledger's rows keyed by ``(bug, layer, key)`` (a later row wins)."""
    if not path.exists():
        return {}
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {(r["bug"], r["layer"], r["key"]): r for r in rows}


class _Ledger:
    """Appends each verdict to the ledger as it comes (from both workers)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()

    def add(self, row: dict[str, Any]) -> None:
        if self.path is None or row["verdict"] not in MEASURED:
            return
        with self._lock, self.path.open("a") as out:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


#: Verdicts that say something about the bug (kept in the ledger); ``broken`` and
#: ``skipped`` say something about the tree and are decided again each run.
MEASURED = ("pass", "fail", "timeout")


def run_catalogue(
    bugs: Sequence[Bug],
    layers: Sequence[Command],
    timeout: float,
    workers: int = 2,
    ledger: Path | None = None,
    resume: bool = False,
    cached_only: bool = False,
) -> dict[str, Any]:
    """Run ``bugs`` against ``layers``; the report of the whole catalogue as plain data.

    Each verdict is appended to ``ledger`` as it comes; with ``resume`` the
    verdicts it holds under the same :func:`verdict_key` are not measured again.
    The report covers every bug and layer of the catalogue: what this run did
    not measure comes from the ledger (``partial`` while something is missing),
    so a catalogue measured in parts, over several sessions, makes one table.
    ``cached_only``: measure nothing, report what the ledger holds.
    """
    started = time.monotonic()
    mutated = {bug.name: apply_bug((ROOT / bug.file).read_text(), bug) for bug in CATALOGUE}
    keys = {(b.name, c.name): verdict_key(c, b, mutated[b.name])
            for b in CATALOGUE for c in LAYERS}
    known = load_verdicts(ledger) if ledger is not None else {}
    cached = known if resume else {}

    def stored(bug: Bug, layer: Command, rows: dict[tuple[str, str, str], dict[str, Any]]
               ) -> dict[str, Any] | None:
        return rows.get((bug.name, layer.name, keys[bug.name, layer.name]))

    todo = {b.name: [c for c in layers if _applies(c, b) and stored(b, c, cached) is None
                     and not cached_only] for b in bugs}
    out = _Ledger(ledger)
    new: dict[tuple[str, str], dict[str, Any]] = {}
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="htmqc-catalogue-") as tmp:
        shadows: queue.Queue[Shadow] = queue.Queue()
        for n in range(workers):
            shadows.put(Shadow(Path(tmp) / f"w{n}"))
        first = shadows.get()
        base: dict[str, str] = {}
        for layer in layers:
            wanting = [b for b in bugs if layer in todo[b.name]]
            if not wanting:
                continue
            outcome = run_command(layer, first, first.path_of(wanting[0].file), timeout)
            base[layer.name] = outcome.verdict
            print(f"unmutated {layer.name:<13} {outcome.verdict:<8} {outcome.seconds:6.1f}s",
                  flush=True)
            if outcome.detects:
                base[layer.name] = "broken"
                notes.append(f"Layer {layer.name} fails on the unmutated tree: not counted.")
        shadows.put(first)

        def record(bug: Bug, layer: Command, verdict: str, seconds: float) -> None:
            row = {"bug": bug.name, "layer": layer.name, "key": keys[bug.name, layer.name],
                   "verdict": verdict, "seconds": round(seconds, 1),
                   "measured": time.strftime("%Y-%m-%d", time.gmtime())}
            new[bug.name, layer.name] = row
            out.add(row)

        def trial(bug: Bug) -> None:
            if not todo[bug.name]:
                return
            began = time.monotonic()
            shadow = shadows.get()
            try:
                with shadow.mutated(bug.file, mutated[bug.name]) as path:
                    for layer in todo[bug.name]:
                        if base[layer.name] in ("broken", "skipped") or not layer.reads_code:
                            record(bug, layer, base[layer.name], 0.0)
                            continue
                        outcome = run_command(layer, shadow, path, timeout)
                        record(bug, layer, outcome.verdict, outcome.seconds)
            finally:
                shadows.put(shadow)
            verdicts = {c.name: new[bug.name, c.name]["verdict"] for c in todo[bug.name]}
            caught = [name for name, v in verdicts.items() if v in ("fail", "timeout")]
            print(f"{bug.name:<30} {time.monotonic() - began:6.0f}s caught by: "
                  f"{', '.join(caught) or 'none of ' + ', '.join(verdicts)}", flush=True)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(trial, bugs))
    # the rows of this run first, then the ledger's (resumed or not, a bug or
    # layer this run did not select is reported from it)
    entries, missing, layer_seconds, dates = [], 0, 0.0, set()
    for bug in CATALOGUE:
        verdicts: dict[str, str] = {}
        for layer in LAYERS:
            if not _applies(layer, bug):
                verdicts[layer.name] = "not run"
                continue
            row = new.get((bug.name, layer.name)) or stored(bug, layer, known)
            if row is None:
                missing += 1
                continue
            verdicts[layer.name] = row["verdict"]
            layer_seconds += row["seconds"]
            dates.add(row["measured"])
        entries.append({
            **{k: v for k, v in asdict(bug).items() if k != "expected"},
            "expected": list(bug.expected),
            "layers": verdicts,
            "caught_by": [n for n, v in verdicts.items() if v in ("fail", "timeout")],
        })
    notes += [f"Layer {c.name} reads no code under test: run once, unmutated; it cannot "
              "catch a code bug." for c in LAYERS if not c.reads_code]
    return {
        "sources": catalogue_sources(),
        "partial": missing > 0,
        "missing": missing,
        "layers": [layer.name for layer in LAYERS],
        "timeout_seconds": timeout,
        "wall_seconds": round(time.monotonic() - started, 1),
        "layer_seconds": round(layer_seconds, 1),
        "measured": sorted(dates),
        "notes": notes,
        "entries": entries,
    }


def main(args: argparse.Namespace) -> int:
    bugs, layers = select(
        args.only and args.only.split(","), args.layers and args.layers.split(",")
    )
    report.CATALOGUE_LEDGER.parent.mkdir(parents=True, exist_ok=True)
    data = run_catalogue(bugs, layers, args.timeout, args.workers,
                         ledger=report.CATALOGUE_LEDGER, resume=args.resume,
                         cached_only=args.cached_only)
    report.write_json(report.CATALOGUE_REPORT, data)
    report.refresh_readme(report.CATALOGUE_BLOCK, data)
    uncaught = [e["name"] for e in data["entries"]
                if not e["caught_by"] and len(e["layers"]) == len(LAYERS)]
    print(f"catalogue: {len(data['entries'])} bugs, {len(uncaught)} caught by no layer, "
          f"{data['missing']} verdicts not measured yet; {data['wall_seconds']:.0f}s; "
          f"report: {report.CATALOGUE_REPORT.relative_to(ROOT)}")
    for name in uncaught:
        print(f"UNCAUGHT {name}")
    return 1 if uncaught else 0


def add_parser(sub: Any) -> None:
    """The ``catalogue`` subcommand."""
    p = sub.add_parser("catalogue", help="which layer catches which named bug")
    p.add_argument("--only", help="comma-separated entry names")
    p.add_argument("--layers", help=f"comma-separated, from: {', '.join(c.name for c in LAYERS)}")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per layer")
    p.add_argument("--workers", type=int, default=2, choices=(1, 2))
    p.add_argument("--resume", action="store_true",
                   help="reuse the verdicts in spec/catalogue-results.jsonl")
    p.add_argument("--cached-only", action="store_true",
                   help="run nothing: report what spec/catalogue-results.jsonl holds")
    p.set_defaults(func=main)
