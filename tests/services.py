"""The services and tools tests need, probed, never installed or started.

``make setup`` (``tools/provision.py``) installs and starts them: PostgreSQL on
127.0.0.1:5432 (database ``test``, trust on loopback), Redis on 127.0.0.1:6379,
Prometheus, Chromium, Apache Kafka's jars. A test that finds one missing skips
with the fix on a developer's machine, and **fails** under ``CI=true``: in CI a
missing service means the run proved less than it claims.
"""

from __future__ import annotations

import os
import shutil
import socket
from functools import cache
from typing import NoReturn

import pytest

PG_HOST = "127.0.0.1:5432"
PG_DATABASE = "test"
REDIS = ("127.0.0.1", 6379)
FIX = "run `make setup`"


def in_ci() -> bool:
    """True under ``CI=true`` (or ``1``/``yes``), as CI services set it."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def missing(what: str, fix: str = FIX) -> NoReturn:
    """Skip (developer machine) or fail (CI) because ``what`` is not there."""
    reason = f"{what} ({fix})"
    if in_ci():
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@cache
def _postgres_url() -> str | None:
    import psycopg

    for user in ("root", "postgres"):
        url = f"postgresql://{user}@{PG_HOST}/{PG_DATABASE}"
        try:
            psycopg.connect(url, connect_timeout=3).close()
        except psycopg.Error:
            continue
        return url
    return None


def postgres_url() -> str:
    """A working ``postgresql://`` URL of the test database, or skip/fail."""
    url = _postgres_url()
    if url is None:
        missing(f"PostgreSQL is not reachable at {PG_HOST} (database {PG_DATABASE})")
    return url


def require_redis() -> tuple[str, int]:
    """Redis's (host, port), or skip/fail."""
    if not _answers(*REDIS):
        missing(f"Redis is not on {REDIS[0]}:{REDIS[1]}")
    return REDIS


def require_tool(tool: str, package: str) -> str:
    """The path of the command ``tool`` (Debian package ``package``), or skip/fail."""
    path = shutil.which(tool)
    if path is None:
        missing(f"{tool} is not installed (Debian package {package})")
    return path


def require_module(name: str) -> object:
    """``pytest.importorskip`` that fails under CI: the module is a dev dependency."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        missing(f"Python module {name} is not importable", "run `make setup`: it installs .[dev]")


def require_nats_server() -> str:
    """The ``nats-server`` executable (Debian package ``nats-server``), or skip/fail.
    Tests start their own server with it (:mod:`htmqc.sources.nats_server`)."""
    from htmqc.sources.nats_server import nats_server_binary

    path = nats_server_binary()
    if path is None:
        missing("nats-server is not installed (Debian package nats-server)")
    return path


def require_rabbitmq_server() -> str:
    """The ``rabbitmq-server`` start script (Debian package ``rabbitmq-server``), or
    skip/fail. Tests start their own node with it (:mod:`htmqc.sources.rabbitmq_server`)."""
    from htmqc.sources.rabbitmq_server import rabbitmq_server_binary

    path = rabbitmq_server_binary()
    if path is None:
        missing("rabbitmq-server is not installed (Debian package rabbitmq-server)")
    return path


def require_pulsar() -> None:
    """Java, Apache Pulsar's jars (``make setup``: ``build/pulsar/libs``) and the
    ``pulsar-client`` module, or skip/fail. Tests start their own standalone broker
    (:mod:`htmqc.sources.pulsar_server`)."""
    from htmqc.errors import RuntimeFailure
    from htmqc.sources.pulsar_server import java_binary, pulsar_libs

    try:
        java_binary()
        pulsar_libs()
    except RuntimeFailure as exc:
        missing(exc.problem, exc.fix)
    require_module("pulsar")
