"""pulsar-client's C++ lines reach the Python logger ``pulsar`` (at ``--log-level
DEBUG``) through a file the C++ logger appends to and a thread that follows it
(:class:`htmqc.sources.pulsar._ClientLog`): each line at its level, a line cut in
two by a read joined again, the rest passed on at exit and the file removed. That a
run's lines are JSON with ``--log-format json`` is in test_pulsar_run.py."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from htmqc.sources.pulsar import CLIENT_LOGGER, _ClientLog
from tests.services import require_module


def test_each_line_is_logged_at_its_level_and_the_rest_at_close(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "client.log"
    path.write_bytes(b"")
    log = _ClientLog(os.open(path, os.O_RDONLY))  # not started: pass_on by hand
    caplog.set_level(logging.DEBUG, logger=CLIENT_LOGGER)
    with path.open("ab") as cpp:
        cpp.write(b"2026-11-27 20:21:53.123 INFO  [140254733069184] ClientConnection:410 | "
                  b"Connected to broker\n2026-11-27 20:21:53.124 WARN  [1] ConsumerImpl:9")
        cpp.flush()
        assert log.pass_on()
        cpp.write(b"9 | Negative ack\n2026-11-27 20:21:53.125 DEBUG [1] X:1 | d\nno format\n")
        cpp.flush()
        assert log.pass_on()
        assert not log.pass_on(), "nothing new"
        cpp.write(b"2026-11-27 20:21:53.126 ERROR [1] ClientImpl:7 | Lookup failed\n")
    log.close(str(path))
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        (CLIENT_LOGGER, logging.INFO, "ClientConnection:410 | Connected to broker"),
        (CLIENT_LOGGER, logging.WARNING, "ConsumerImpl:99 | Negative ack"),
        (CLIENT_LOGGER, logging.DEBUG, "X:1 | d"),
        (CLIENT_LOGGER, logging.INFO, "no format"),
        (CLIENT_LOGGER, logging.ERROR, "ClientImpl:7 | Lookup failed"),
    ]
    assert not path.exists()


def test_which_logger_a_client_gets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below DEBUG (``htmqc.logs.setup`` quieted ``pulsar``) and for the quiet lease
    client: nothing; at DEBUG without a temporary file: the console; never a Python
    logger (it may abort the process at exit)."""
    pulsar: Any = require_module("pulsar")
    from htmqc.sources import pulsar as adapter

    def no_file(*args: object, **kwargs: object) -> tuple[int, str]:
        raise OSError("read-only")

    logger = logging.getLogger(CLIENT_LOGGER)
    was = logger.level
    try:
        logger.setLevel(logging.CRITICAL)
        assert adapter.client_logger().log_file == os.devnull
        logger.setLevel(logging.DEBUG)
        assert adapter.client_logger(quiet=True).log_file == os.devnull
        monkeypatch.setattr(_ClientLog, "_path", None)
        monkeypatch.setattr(adapter.tempfile, "mkstemp", no_file)
        assert isinstance(adapter.client_logger(), pulsar.ConsoleLogger)
    finally:
        logger.setLevel(was)
