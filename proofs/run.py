"""Discharge every obligation, run the differential check, print one line each,
write the JSON report."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from proofs import arith, differential, epochs, tracker
from proofs.obligation import Obligation, Outcome, discharge

REPORT = Path("build/proofs/report.json")

#: The differential check :func:`main` runs (the whole default domain).
DIFFERENTIAL: Callable[[], differential.Report] = differential.check


def all_obligations() -> Iterator[Obligation]:
    """Every lemma and every mutant, in report order."""
    yield from tracker.obligations()
    yield from epochs.obligations()
    yield from arith.obligations()


def run(obligations: Iterable[Obligation], echo: bool = True) -> list[Outcome]:
    """Discharge ``obligations`` in order, printing each verdict if ``echo``."""
    outcomes = []
    for ob in obligations:
        outcome = discharge(ob)
        if echo:
            print(outcome.line(), flush=True)
        outcomes.append(outcome)
    return outcomes


def report(
    outcomes: list[Outcome],
    compared: differential.Report,
    seconds: float,
    path: Path = REPORT,
) -> dict[str, object]:
    """Write and return the JSON report."""
    data: dict[str, object] = {
        "ok": all(o.ok for o in outcomes) and compared.ok,
        "seconds": round(seconds, 3),
        "proved": sum(o.verdict == "PROVED" and o.ok for o in outcomes),
        "mutants_caught": sum(o.expect == "COUNTEREXAMPLE" and o.ok for o in outcomes),
        "failures": [o.name for o in outcomes if not o.ok]
        + ([] if compared.ok else ["differential"]),
        "differential": {
            "states": compared.states,
            "events": compared.transitions,
            "seconds": round(compared.seconds, 3),
            "disagreement": compared.disagreement,
        },
        "obligations": [
            {
                "name": o.name,
                "expect": o.expect,
                "verdict": o.verdict,
                "seconds": o.seconds,
                "counterexample": o.model,
                "doc": o.doc,
            }
            for o in outcomes
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return data


def main() -> int:
    """Entry point of ``python -m proofs``: 0 iff every verdict is the expected one
    and the code agrees with the model."""
    began = time.perf_counter()
    outcomes = run(all_obligations())
    compared = DIFFERENTIAL()
    print(compared.line(), flush=True)
    data = report(outcomes, compared, time.perf_counter() - began)
    print(
        f"{data['proved']} proved, {data['mutants_caught']} mutants caught, "
        f"{len(outcomes)} obligations, differential over {compared.states} states; "
        f"{data['seconds']}s; report: {REPORT}"
    )
    failures = data["failures"]
    assert isinstance(failures, list)
    if failures:
        print(f"FAILED: {', '.join(failures)}")
        return 1
    return 0
