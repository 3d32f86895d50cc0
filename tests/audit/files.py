"""Write a :class:`~tests.audit.scenario.Scenario` to the files ``htmqc audit`` reads."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.audit.scenario import Scenario


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_scenario(s: Scenario, folder: Path) -> dict[str, Path]:
    """JSON-lines files for every input; effects also as a SQLite ``effects`` table."""
    paths = {
        "produced": write_jsonl(folder / "produced.jsonl", [p._asdict() for p in s.produced]),
        "effects": write_jsonl(folder / "effects.jsonl", [e._asdict() for e in s.effects]),
        "dlq": write_jsonl(folder / "dlq.jsonl", [d._asdict() for d in s.dlq]),
        "committed": write_jsonl(folder / "committed.jsonl", [c._asdict() for c in s.committed]),
        "aborted": folder / "aborted.txt",
        "sqlite": folder / "effects.db",
    }
    paths["aborted"].write_text("".join(f"{a}\n" for a in s.aborted))
    conn = sqlite3.connect(paths["sqlite"])
    conn.execute(
        'CREATE TABLE effects (id TEXT, key TEXT, "partition" INTEGER, "offset" INTEGER, '
        "fence INTEGER, stored_at TEXT DEFAULT CURRENT_TIMESTAMP)"
    )
    conn.executemany(
        'INSERT INTO effects (id, key, "partition", "offset", fence) VALUES (?, ?, ?, ?, ?)',
        [tuple(e) for e in s.effects],
    )
    conn.commit()
    conn.close()
    return paths
