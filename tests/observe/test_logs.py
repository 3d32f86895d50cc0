"""``--log-format``: JSON lines with partition and offset, secrets masked in both formats."""

from __future__ import annotations

import io
import json
import logging

import pytest

from htmqc import secrets
from htmqc.errors import UsageError
from htmqc.logs import setup


@pytest.fixture(autouse=True)
def _restore_logging() -> object:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    secrets.forget_all()


def test_json_lines_carry_partition_and_offset_and_hide_secrets() -> None:
    out = io.StringIO()
    setup("INFO", "json", out)
    secrets.remember("hunter2-pw")
    log = logging.getLogger("htmqc.runtime")
    log.warning("failed on %s with hunter2-pw", "orders/3", extra={"topic": "orders",
                                                                    "partition": 3, "offset": 120})
    log.debug("not shown")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert doc["level"] == "WARNING" and doc["logger"] == "htmqc.runtime"
    assert (doc["topic"], doc["partition"], doc["offset"]) == ("orders", 3, 120)
    assert "hunter2-pw" not in lines[0] and "***" in doc["msg"]


def test_text_lines_say_where_and_hide_secrets() -> None:
    out = io.StringIO()
    setup("DEBUG", "text", out)
    secrets.remember("hunter2-pw")
    logging.getLogger("x").info("pw hunter2-pw", extra={"topic": "t", "partition": 0,
                                                        "offset": 7})
    line = out.getvalue().strip()
    assert line.endswith("pw *** [t/0@7]")


@pytest.mark.parametrize(("level", "fmt"), [("LOUD", "text"), ("INFO", "xml")])
def test_bad_level_or_format(level: str, fmt: str) -> None:
    with pytest.raises(UsageError):
        setup(level, fmt, io.StringIO())


@pytest.mark.parametrize("client", ["pika", "rstream"])
def test_a_client_librarys_own_errors_show_only_at_debug(client: str) -> None:
    """pika and rstream log a lost connection as an ERROR with a traceback;
    htmqc says the same in one line, so theirs show only at DEBUG."""
    out = io.StringIO()
    try:
        setup("INFO", stream=out)
        logging.getLogger(f"{client}.connection").error("lost", exc_info=ValueError("x"))
        assert out.getvalue() == ""
        setup("DEBUG", stream=out)
        logging.getLogger(f"{client}.connection").error("lost")
        assert "lost" in out.getvalue()
    finally:
        logging.getLogger(client).setLevel(logging.NOTSET)
        setup("WARNING")


def test_py4j_chatter_shows_only_at_debug_and_its_warnings_always() -> None:
    """py4j logs each connection it closes at INFO, also from a client collected
    long after a command ended (CI printed "Logging error" tracebacks: the stream of
    an earlier in-process command was closed); its warnings still show."""
    out = io.StringIO()
    try:
        setup("INFO", stream=out)
        logging.getLogger("py4j.clientserver").info("Closing down clientserver connection")
        assert out.getvalue() == ""
        logging.getLogger("py4j.clientserver").warning("answer lost")
        assert "answer lost" in out.getvalue()
        setup("DEBUG", stream=out)
        logging.getLogger("py4j.clientserver").info("Closing down clientserver connection")
        assert "Closing down" in out.getvalue()
    finally:
        logging.getLogger("py4j").setLevel(logging.NOTSET)
        setup("WARNING")
