"""A scratch copy of ``src/htmqc`` that a mutant is written into.

The copy is put first on ``PYTHONPATH`` of every check, so ``import htmqc.core``
finds the mutated module while the real tree is never touched. Only the
packages that can be mutated (:data:`COPIED`) are copied; everything else in
``htmqc`` is a symlink to the real tree. Bytecode is never written
(``PYTHONDONTWRITEBYTECODE``): two mutants of one file can have the same size
and the same modification second, and a stale ``.pyc`` would then run the
previous mutant.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from model_checks.mutation.config import ROOT, SRC

#: Packages of ``htmqc`` copied (and so mutable) in a shadow tree.
COPIED = ("core", "sinks")


class Shadow:
    """One worker's scratch tree: ``base/src/htmqc`` (the copy) and ``base/work``
    (the checks' working directory, where they may write reports)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.src = base / "src"
        self.work = base / "work"
        package = self.src / "htmqc"
        if self.src.exists():
            shutil.rmtree(self.src)
        package.mkdir(parents=True)
        self.work.mkdir(parents=True, exist_ok=True)
        for entry in sorted((SRC / "htmqc").iterdir()):
            if entry.name == "__pycache__":
                continue
            if entry.name in COPIED:
                shutil.copytree(entry, package / entry.name, ignore=_no_bytecode)
            else:
                (package / entry.name).symlink_to(entry)

    def path_of(self, rel: str) -> Path:
        """The copy of ``rel`` (a path relative to the repository root, under ``src/``)."""
        relative = Path(rel).relative_to("src")
        if relative.parts[1] not in COPIED:
            raise ValueError(f"{rel} is not in a mutable package ({', '.join(COPIED)})")
        return self.src / relative

    @contextmanager
    def mutated(self, rel: str, text: str) -> Iterator[Path]:
        """Write ``text`` over the copy of ``rel`` for the duration of the block."""
        target = self.path_of(rel)
        original = (ROOT / rel).read_text()
        target.write_text(text)
        try:
            yield target
        finally:
            target.write_text(original)

    def env(self) -> dict[str, str]:
        """The environment of a check: the copy first on ``PYTHONPATH``, contracts
        on, no bytecode, a fresh Hypothesis example database."""
        hypothesis_dir = self.work / ".hypothesis"
        if hypothesis_dir.exists():
            shutil.rmtree(hypothesis_dir)
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(self.src), str(ROOT), str(SRC)]),
            "HTMQC_CONTRACTS": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "HYPOTHESIS_STORAGE_DIRECTORY": str(hypothesis_dir),
        }


def _no_bytecode(_directory: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__"]
