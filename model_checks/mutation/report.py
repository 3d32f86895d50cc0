"""Reports of the mutation run and the catalogue, and their sections of ``spec/README.md``.

``spec/mutation-results.jsonl`` (:data:`LEDGER`) holds every mutant's result,
``spec/catalogue-results.jsonl`` (:data:`CATALOGUE_LEDGER`) every catalogue verdict;
``build/mutation/report.json`` and ``build/mutation/catalogue.json`` are the data;
``spec/README.md`` carries a generated summary of each between
``<!-- BEGIN GENERATED: NAME -->`` and ``<!-- END GENERATED: NAME -->``
(``mutation``, ``mutation-catalogue``). A block that is missing is appended at
the end of the file. :func:`stale_sections` (``python -m model_checks.mutation
readme --check``) says whether the blocks match the reports and whether the
reports were made from the current sources.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from htmqc.errors import UsageError
from model_checks.mutation.config import ROOT

BUILD = ROOT / "build" / "mutation"
#: Every mutant measured so far, one JSON row each, appended as they come. Kept in
#: the repository (not under ``build/``): it is hours of measuring, the evidence
#: behind the generated table, and a new machine resumes from it.
LEDGER = ROOT / "spec" / "mutation-results.jsonl"
REPORT = BUILD / "report.json"
SURVIVORS = BUILD / "survivors.md"
CATALOGUE_REPORT = BUILD / "catalogue.json"
#: Every catalogue verdict (bug, layer) measured so far, kept for the same reason.
CATALOGUE_LEDGER = ROOT / "spec" / "catalogue-results.jsonl"
README = ROOT / "spec" / "README.md"
MUTATION_BLOCK = "mutation"
CATALOGUE_BLOCK = "mutation-catalogue"
DETECTED = ("killed", "timeout")


def digest(paths: Iterable[Path]) -> str:
    """A fingerprint of the files a report was made from."""
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes() if path.exists() else b"")
    return h.hexdigest()[:16]


def summary(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts by status, the score and the checks that killed mutants first."""
    rows = list(rows)
    status = Counter(r["status"] for r in rows)
    counted = len(rows) - status["equivalent"]
    detected = sum(status[s] for s in DETECTED)
    return {
        "mutants": len(rows),
        **{s: status[s] for s in ("killed", "timeout", "survived", "equivalent")},
        "score": round(detected / counted, 4) if counted else 1.0,
        "killed_by": dict(Counter(r["killed_by"] for r in rows if r["killed_by"]).most_common()),
    }


def render_mutation(report: Mapping[str, Any]) -> str:
    """The ``mutation`` block: per-module counts, first killers, survivors by function."""
    rows = report["mutants"]
    by_file: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by_file[Path(r["file"]).name].append(r)
    total = report["summary"]
    lines = [
        f"`make mutate` ({report['tool']} operators over `src/htmqc/core`, "
        f"{report['workers']} workers, {report['wall_seconds'] / 60:.0f} min wall): "
        f"**{total['score']:.1%}** of {total['mutants'] - total['equivalent']} non-equivalent "
        "mutants detected."
        + (f" Partial run over {', '.join(report['modules'])}: {report['not_run']} generated "
           "mutants not run." if report.get("partial") else ""),
        "",
        "| module | mutants | killed | timeout | equivalent | survived | score |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, group in sorted(by_file.items()):
        s = summary(group)
        lines.append(
            f"| {name} | {s['mutants']} | {s['killed']} | {s['timeout']} | {s['equivalent']} "
            f"| {s['survived']} | {s['score']:.1%} |"
        )
    lines.append(
        f"| **total** | {total['mutants']} | {total['killed']} | {total['timeout']} "
        f"| {total['equivalent']} | {total['survived']} | {total['score']:.1%} |"
    )
    lines += ["", "Detected first by: " + ", ".join(
        f"{name} {n}" for name, n in total["killed_by"].items()) + "."]
    skipped = report.get("skipped_checks") or []
    if skipped:
        lines.append(f"Checks not merged yet (skipped): {', '.join(skipped)}.")
    lines.append("Sites not mutated: " + ", ".join(
        f"{why} {n}" for why, n in report["left_out"].items()) + ".")
    survivors: Counter[str] = Counter(
        f"`{Path(r['file']).name}` `{r['function']}`" for r in rows if r["status"] == "survived"
    )
    if survivors:
        lines += ["", "Survivors by function (diffs in `build/mutation/report.json`):", ""]
        lines += [f"- {where}: {n}" for where, n in sorted(survivors.items())]
    return "\n".join(lines)


def render_survivors(report: Mapping[str, Any]) -> str:
    """Every unexplained survivor's diff, grouped by module and function (Markdown)."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in report["mutants"]:
        if r["status"] == "survived":
            groups[f"{Path(r['file']).name} {r['function']}"].append(r)
    lines = [f"# Surviving mutants ({sum(map(len, groups.values()))})", ""]
    for where, rows in sorted(groups.items()):
        lines += [f"## {where} ({len(rows)})", ""]
        for r in rows:
            lines += ["```diff", *r["diff"].splitlines()[2:], "```", ""]
    return "\n".join(lines)


def render_catalogue(report: Mapping[str, Any]) -> str:
    """The ``mutation-catalogue`` block: one row per named bug, one column per layer;
    a verdict the ledger does not hold yet shows as ``?``."""
    layers: list[str] = report["layers"]
    mark = {"fail": "✓", "timeout": "✓ (timeout)", "pass": "·", "skipped": "pending",
            "broken": "broken", "not run": "", "missing": "?"}
    entries = report["entries"]
    whole = [e for e in entries if all(layer in e["layers"] for layer in layers)]
    measured = sum(len(e["layers"]) for e in entries)
    lines = [
        "`python -m model_checks.mutation catalogue`: each named bug applied alone, each "
        "layer run separately (✓ caught, · not caught, ?: not measured yet, pending: "
        "layer not merged yet, broken: fails unmutated, blank: not run; "
        f"{report['layer_seconds'] / 3600:.1f} h of layer runs, measured "
        f"{', '.join(report['measured'])}).",
    ]
    if report.get("missing"):
        lines.append(
            f"Partial: {report['missing']} of {measured + report['missing']} verdicts not "
            f"measured yet; {len(whole)} of {len(entries)} bugs have every layer's."
        )
    lines += [
        "",
        "| bug | " + " | ".join(layers) + " | expected |",
        "|---|" + "---|" * (len(layers) + 1),
    ]
    for entry in entries:
        cells = [mark[entry["layers"].get(layer, "missing")] for layer in layers]
        lines.append(
            f"| `{entry['name']}` | " + " | ".join(cells) + f" | {', '.join(entry['expected'])} |"
        )
    uncaught = [e["name"] for e in entries if not e["caught_by"] and e in whole]
    unseen = [e["name"] for e in entries if not e["caught_by"] and e not in whole]
    lines += ["", f"Caught by no layer: {', '.join(uncaught) if uncaught else 'none'}"
              + (f" (not caught yet, layers still to measure: {', '.join(unseen)})"
                 if unseen else "") + "."]
    notes = report.get("notes") or []
    lines += [f"{note}" for note in notes]
    return "\n".join(lines)


def _pattern(name: str) -> re.Pattern[str]:
    name = re.escape(name)
    begin, end = f"<!-- BEGIN GENERATED: {name} -->", f"<!-- END GENERATED: {name} -->"
    return re.compile(rf"({begin}\n).*?({end})", re.S)


def with_block(text: str, name: str, body: str) -> str:
    """``text`` with block ``name`` holding ``body`` (appended at the end if absent)."""
    pattern = _pattern(name)
    if pattern.search(text):
        return pattern.sub(lambda m: f"{m.group(1)}{body}\n{m.group(2)}", text)
    block = f"<!-- BEGIN GENERATED: {name} -->\n{body}\n<!-- END GENERATED: {name} -->\n"
    return f"{text.rstrip()}\n\n{block}"


def block_body(text: str, name: str) -> str | None:
    """The body of block ``name`` in ``text``, or ``None`` if there is none."""
    match = _pattern(name).search(text)
    return None if match is None else text[match.end(1) : match.start(2)].rstrip("\n")


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def read_json(path: Path, made_by: str) -> dict[str, Any]:
    """:raises UsageError: the report does not exist or is not JSON."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path.name} does not exist", f"run {made_by}") from None
    except json.JSONDecodeError:
        raise UsageError(f"{path.name} is not JSON", f"run {made_by} again") from None
    return data


#: block name -> (report path, renderer, the command that makes the report)
SECTIONS: dict[str, tuple[Path, Callable[[Mapping[str, Any]], str], str]] = {
    MUTATION_BLOCK: (REPORT, render_mutation, "make mutate"),
    CATALOGUE_BLOCK: (
        CATALOGUE_REPORT, render_catalogue, "python -m model_checks.mutation catalogue"
    ),
}


def refresh_readme(name: str, report: Mapping[str, Any], readme: Path = README) -> None:
    """Write block ``name`` of ``readme`` from ``report``."""
    _, render, _ = SECTIONS[name]
    readme.write_text(with_block(readme.read_text(), name, render(report)))


def stale_sections(
    current_sources: Mapping[str, str],
    readme: Path = README,
    sections: Mapping[str, tuple[Path, Callable[[Mapping[str, Any]], str], str]] = SECTIONS,
) -> list[str]:
    """One line per problem: a block that differs from its report, or a report
    made from other sources than ``current_sources`` (``{block: digest}``).

    :raises UsageError: a report is missing.
    """
    text = readme.read_text()
    problems = []
    for name, (path, render, made_by) in sections.items():
        report = read_json(path, made_by)
        if report.get("sources") != current_sources[name]:
            problems.append(f"{path.name} was made from other sources; run {made_by}")
        body = block_body(text, name)
        if body is None:
            problems.append(f"{readme.name} has no GENERATED: {name} block; run {made_by}")
        elif body != render(report):
            problems.append(f"{readme.name} block {name} differs from {path.name}; run "
                            "python -m model_checks.mutation readme")
    return problems
