"""Progress for long commands (produce, replay, dlq redrive, chaos, bench).

:func:`progress` yields ``advance(n)``. On a terminal (stderr is a TTY) it draws
a rich progress bar that disappears when done; otherwise (CI logs, pipes) it
prints a plain line ``LABEL DONE/TOTAL`` at every tenth of the way and at the
end, so logs stay short and greppable. ``enabled=False`` makes it silent.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO


@contextmanager
def progress(
    total: int, label: str, *, enabled: bool = True, stream: IO[str] | None = None
) -> Iterator[Callable[[int], None]]:
    """``advance(n)`` for ``total`` units of work described by ``label``."""
    out = stream if stream is not None else sys.stderr
    if not enabled:
        yield lambda n: None
        return
    if out.isatty():
        from rich.console import Console
        from rich.progress import Progress

        with Progress(transient=True, console=Console(file=out)) as bar:
            task = bar.add_task(label, total=total)
            yield lambda n: bar.advance(task, n)
        return
    state = {"done": 0, "next": max(1, total // 10)}

    def advance(n: int) -> None:
        state["done"] += n
        done = state["done"]
        if done >= state["next"] or done >= total:
            print(f"{label} {done}/{total}", file=out, flush=True)
            state["next"] = done + max(1, total // 10)

    yield advance
