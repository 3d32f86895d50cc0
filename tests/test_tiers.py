"""The fast tier starts no process (issue 16, item 9): while a test that is not
marked ``slow`` (nor ``formal``) runs, tests/conftest.py refuses every way of
starting one, so a test that needs a subprocess, a browser or a broker must be
marked ``slow`` and ``make test-fast`` stays quick."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

REFUSED = "a fast-tier test starts no process"


def test_a_fast_test_cannot_start_a_process() -> None:
    starts: list[Callable[[], object]] = [
        lambda: subprocess.run(["true"], check=False),
        lambda: subprocess.Popen(["true"]),
        lambda: os.system("true"),
        lambda: os.posix_spawn("/bin/true", ["true"], {}),
    ]
    refusals = []
    for start in starts:
        with pytest.raises(RuntimeError, match=REFUSED) as caught:
            start()
        refusals.append(caught)
    guard = sys.modules[refusals[0].type.__module__]
    assert len(guard._attempts) == len(starts), guard._attempts
    guard._attempts.clear()  # refused on purpose: this test does not fail for them


@pytest.mark.slow
def test_a_slow_test_starts_what_it_likes() -> None:
    assert subprocess.run(["true"], check=False).returncode == 0
