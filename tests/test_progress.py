"""Progress output: plain tenths when not a terminal, a rich bar on one, silence when off."""

from __future__ import annotations

import io

from htmqc.progress import progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_every_tenth_and_at_the_end() -> None:
    out = io.StringIO()
    with progress(1000, "done", stream=out) as advance:
        for _ in range(333):
            advance(3)
        advance(1)
    lines = out.getvalue().splitlines()
    assert 9 <= len(lines) <= 11
    assert lines[-1] == "done 1000/1000"
    counts = [int(line.split()[1].split("/")[0]) for line in lines]
    assert counts == sorted(counts)


def test_a_terminal_gets_a_bar_and_disabled_is_silent() -> None:
    tty = _Tty()
    with progress(10, "work", stream=tty) as advance:
        advance(10)
    assert "work" in tty.getvalue() and "10/10" not in tty.getvalue()
    quiet = io.StringIO()
    with progress(10, "work", enabled=False, stream=quiet) as advance:
        advance(10)
    assert quiet.getvalue() == ""
