"""The committed list of equivalent mutants: survivors explained, one line each.

``model_checks/mutation/equivalent.toml`` holds entries ::

    [[equivalent]]
    key = "partition.py::PartitionTracker.fetched::n > 1 => n >= 1"
    reason = "a one-offset batch is strictly increasing either way"

``key`` is a mutant's stable key (:mod:`model_checks.mutation.mutants`); the
reason is one line saying why no check can tell the mutant from the original.
A listed mutant that a check kills is an error: the claim was wrong.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from htmqc.errors import UsageError

EQUIVALENT = Path(__file__).resolve().parent / "equivalent.toml"


def load(path: Path = EQUIVALENT) -> dict[str, str]:
    """``{key: reason}`` from ``path`` (missing file: no entries).

    :raises UsageError: the file is not TOML, or an entry lacks a key or a
        one-line reason, or a key appears twice.
    """
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path.name} is not valid TOML ({exc})", "fix the syntax") from None
    out: dict[str, str] = {}
    for n, entry in enumerate(data.get("equivalent", []), start=1):
        key, reason = entry.get("key"), entry.get("reason")
        if not isinstance(key, str) or not key:
            raise UsageError(f"{path.name}: entry {n} has no key", "copy the key from report.json")
        if not isinstance(reason, str) or not reason.strip() or "\n" in reason.strip():
            raise UsageError(
                f"{path.name}: entry {n} ({key}) needs a one-line reason",
                "say in one line why no check can tell it from the original",
            )
        if key in out:
            raise UsageError(f"{path.name}: {key} is listed twice", "keep one entry")
        out[key] = reason.strip()
    return out
