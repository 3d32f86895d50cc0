"""``python -m model_checks.mutation catalogue``: which layer catches which named bug.

Every bug of :data:`~model_checks.mutation.catalogue.CATALOGUE` is applied alone
to a scratch copy of the tree; every layer of
:data:`~model_checks.mutation.config.LAYERS` runs against it separately, with a
time limit each. First each layer runs once on the unmutated tree: a layer that
fails there is *broken* and its verdicts are not counted. A layer that does not
read the code (TLC: it checks ``tla/`` only) is run once, unmutated, and its
verdict recorded for every bug: it cannot see a code change. The run exits 1
if a bug is caught by no layer.
"""

from __future__ import annotations

import argparse
import queue
import tempfile
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


def run_catalogue(
    bugs: Sequence[Bug], layers: Sequence[Command], timeout: float, workers: int = 2
) -> dict[str, Any]:
    """Run ``bugs`` against ``layers``; the report as plain data."""
    started = time.monotonic()
    mutated = {bug.name: apply_bug((ROOT / bug.file).read_text(), bug) for bug in bugs}
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="htmqc-catalogue-") as tmp:
        shadows: queue.Queue[Shadow] = queue.Queue()
        for n in range(workers):
            shadows.put(Shadow(Path(tmp) / f"w{n}"))
        first = shadows.get()
        base: dict[str, str] = {}
        for layer in layers:
            in_scope = [b for b in bugs if _applies(layer, b)]
            if not in_scope:
                base[layer.name] = "not run"
                continue
            outcome = run_command(layer, first, first.path_of(in_scope[0].file), timeout)
            base[layer.name] = outcome.verdict
            print(f"unmutated {layer.name:<13} {outcome.verdict:<8} {outcome.seconds:6.1f}s",
                  flush=True)
            if outcome.detects:
                base[layer.name] = "broken"
                notes.append(f"Layer {layer.name} fails on the unmutated tree: not counted.")
            elif not layer.reads_code:
                notes.append(f"Layer {layer.name} reads no code under test: run once, "
                             "unmutated; it cannot catch a code bug.")
        shadows.put(first)

        def trial(bug: Bug) -> dict[str, Any]:
            shadow = shadows.get()
            began = time.monotonic()
            verdicts: dict[str, str] = {}
            try:
                with shadow.mutated(bug.file, mutated[bug.name]) as path:
                    for layer in layers:
                        if not _applies(layer, bug):
                            verdicts[layer.name] = "not run"
                            continue
                        if base[layer.name] in ("broken", "skipped") or not layer.reads_code:
                            verdicts[layer.name] = base[layer.name]
                            continue
                        verdicts[layer.name] = run_command(layer, shadow, path, timeout).verdict
            finally:
                shadows.put(shadow)
            caught = [name for name, v in verdicts.items() if v in ("fail", "timeout")]
            print(f"{bug.name:<30} caught by: {', '.join(caught) or 'NOTHING'}", flush=True)
            return {
                **{k: v for k, v in asdict(bug).items() if k != "expected"},
                "expected": list(bug.expected),
                "layers": verdicts,
                "caught_by": caught,
                "seconds": round(time.monotonic() - began, 1),
            }

        with ThreadPoolExecutor(max_workers=workers) as pool:
            entries = list(pool.map(trial, bugs))
    return {
        "sources": catalogue_sources(),
        "partial": len(bugs) != len(CATALOGUE) or len(layers) != len(LAYERS),
        "layers": [layer.name for layer in layers],
        "timeout_seconds": timeout,
        "wall_seconds": round(time.monotonic() - started, 1),
        "notes": notes,
        "entries": entries,
    }


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` with the verdicts of ``new`` laid over it (same sources): for
    running one layer, or some bugs, again without running everything."""
    if old.get("sources") != new["sources"]:
        return new
    entries = {e["name"]: e for e in old["entries"]}
    for entry in new["entries"]:
        kept = entries.get(entry["name"], {"layers": {}})
        layers = {**kept["layers"], **entry["layers"]}
        entries[entry["name"]] = {
            **entry,
            "layers": layers,
            "caught_by": [n for n, v in layers.items() if v in ("fail", "timeout")],
        }
    names = set(old["layers"]) | set(new["layers"])
    ordered = [e for b in CATALOGUE if (e := entries.get(b.name)) is not None]
    return {
        **new,
        "partial": len(ordered) != len(CATALOGUE) or len(names) != len(LAYERS),
        "layers": [c.name for c in LAYERS if c.name in names],
        "wall_seconds": round(old["wall_seconds"] + new["wall_seconds"], 1),
        # a note names its layer second ("Layer NAME ..."); the new run's notes win
        "notes": [n for n in old["notes"] if n.split()[1] not in new["layers"]] + new["notes"],
        "entries": ordered,
    }


def main(args: argparse.Namespace) -> int:
    bugs, layers = select(
        args.only and args.only.split(","), args.layers and args.layers.split(",")
    )
    data = run_catalogue(bugs, layers, args.timeout, args.workers)
    if args.merge and report.CATALOGUE_REPORT.exists():
        data = merge(report.read_json(report.CATALOGUE_REPORT, "catalogue"), data)
    report.write_json(report.CATALOGUE_REPORT, data)
    if not data["partial"]:
        report.refresh_readme(report.CATALOGUE_BLOCK, data)
    uncaught = [e["name"] for e in data["entries"] if not e["caught_by"]]
    print(f"catalogue: {len(data['entries'])} bugs, {len(uncaught)} caught by no layer; "
          f"{data['wall_seconds']:.0f}s; report: {report.CATALOGUE_REPORT.relative_to(ROOT)}")
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
    p.add_argument("--merge", action="store_true",
                   help="lay these verdicts over build/mutation/catalogue.json (same sources)")
    p.set_defaults(func=main)
