"""A pytest plugin that stops a test process whose memory runs away, naming the test.

Once, in a whole ``make test`` on the CI box, an xdist worker grew to 17.8 GB and
the kernel's OOM killer took it: no test name, no stack, and the run hung. This
plugin turns that into a failure that says what happened. A daemon thread reads
the process's resident size (``/proc/self/statm``) every :data:`PERIOD` seconds;
past the limit it writes one line naming the running test and the size, every
thread's stack (``faulthandler``) to standard error and to
``$TMPDIR/htmqc-memory-guard-<pid>.txt``, and ends the process with exit code
:data:`EXIT_CODE`. Under xdist with ``--max-worker-restart 0`` (the Makefile's
flags) the run then ends with ``worker 'gwN' crashed while running '<test>'``.

The limit is ``HTMQC_TEST_RSS_LIMIT_MB`` (default :data:`DEFAULT_LIMIT_MB`; ``0``
turns the guard off). Child processes (brokers, Spark's JVM) are not counted:
each has its own limits, and the runaway was a test process.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Generator
from pathlib import Path

import pytest

DEFAULT_LIMIT_MB = 6144
PERIOD = 0.5
EXIT_CODE = 70
_PAGE = os.sysconf("SC_PAGE_SIZE")

_running: list[str] = []
#: pytest's capture manager: the report goes to the real standard error, not a test's capture.
_capture: list[object] = []


def limit_mb() -> int:
    """The limit from the environment; a value that is not a whole number is refused."""
    text = os.environ.get("HTMQC_TEST_RSS_LIMIT_MB", str(DEFAULT_LIMIT_MB))
    try:
        value = int(text)
    except ValueError:
        raise pytest.UsageError(
            f"HTMQC_TEST_RSS_LIMIT_MB={text!r} is not a whole number of MiB: "
            f"set e.g. {DEFAULT_LIMIT_MB}, or 0 to turn the memory guard off"
        ) from None
    return value


def resident_mb() -> float:
    """This process's resident set size in MiB."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE / 2**20


def _trip(size: float, limit: int) -> None:
    test = _running[-1] if _running else "no test (collection or a fixture's teardown)"
    line = (f"memory guard: this test process holds {size:,.0f} MiB, over the "
            f"{limit:,} MiB limit, while running {test}; every thread's stack follows")
    report = Path(tempfile.gettempdir()) / f"htmqc-memory-guard-{os.getpid()}.txt"
    with report.open("w") as f:
        print(line, file=f, flush=True)
        faulthandler.dump_traceback(file=f, all_threads=True)
    for capman in _capture:
        capman.suspend_global_capture(in_=True)  # type: ignore[attr-defined]
    print(line, file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    print(f"memory guard: stacks kept in {report}", file=sys.stderr, flush=True)
    os._exit(EXIT_CODE)


def watch(limit: int, wait: Callable[[float], bool], measure: Callable[[], float] = resident_mb,
          trip: Callable[[float, int], None] = _trip) -> None:
    """Measure every :data:`PERIOD` until ``wait`` says stop; call ``trip`` past ``limit``."""
    while not wait(PERIOD):
        size = measure()
        if size > limit:
            trip(size, limit)
            return


def pytest_configure(config: pytest.Config) -> None:
    limit = limit_mb()
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        _capture.append(capman)
    if limit > 0:
        stop = threading.Event()
        config.add_cleanup(stop.set)
        threading.Thread(target=watch, args=(limit, stop.wait), name="htmqc-memory-guard",
                         daemon=True).start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item,
                            nextitem: pytest.Item | None) -> Generator[None, object, object]:
    _running.append(item.nodeid)
    try:
        return (yield)
    finally:
        _running.pop()
