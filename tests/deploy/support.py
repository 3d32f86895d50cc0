"""What the deployment tests read from the project itself, so that a change to the
code (a renamed flag, a new default, a moved route) breaks the deployment files'
tests instead of the deployments: the real ``htmqc`` parser and option
resolution, the schema's defaults, ``[project.scripts]``, the observability
server's routes.
"""

from __future__ import annotations

import argparse
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

from htmqc.cli import build_parser
from htmqc.cli.run_cmd import options_of
from htmqc.observe.server import ObserveServer
from htmqc.runtime.options import OPTIONS, RunOptions

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def option_default(name: str) -> Any:
    """The schema's default of ``htmqc run`` option ``name`` (``shutdown_seconds``)."""
    return next(o.default for o in OPTIONS if o.name == name)


def console_scripts() -> dict[str, str]:
    """``[project.scripts]`` of pyproject.toml: command name -> ``module:function``."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        return dict(tomllib.load(f)["project"]["scripts"])


def parse_command(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` (what follows ``htmqc``) parsed by the real ``htmqc`` parser.

    :raises AssertionError: the parser refused it (with its one-line message).
    """
    err = StringIO()
    try:
        with redirect_stderr(err):
            return build_parser().parse_args(list(argv))
    except SystemExit as exc:
        refused = err.getvalue().strip()
        raise AssertionError(f"htmqc {' '.join(argv)} is refused: {refused}") from exc


def run_options(argv: Sequence[str], environ: Mapping[str, str]) -> RunOptions:
    """The options ``htmqc ARGV`` (a ``run`` command) would run with, given the
    environment ``environ`` (and the ``--config`` file ``argv`` names)."""
    args = parse_command(argv)
    assert args.command == "run", f"not a run command: {argv}"
    return options_of(args, environ)


def seconds(text: str) -> float:
    """A systemd or Kubernetes duration (``45``, ``45s``, ``2min``, ``1min 30s``)."""
    units = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
    total = 0.0
    for part in text.split():
        number = part.rstrip("abcdefghijklmnopqrstuvwxyz")
        total += float(number) * units[part[len(number) :] or "s"]
    return total


@dataclass
class StubHealth:
    """A :class:`~htmqc.observe.server.Health` whose answers the test sets."""

    alive: bool = True
    is_ready: bool = True

    def live(self) -> tuple[bool, str]:
        """``(alive, reason)``."""
        return self.alive, "poll loop stuck (test)"

    def ready(self) -> tuple[bool, str]:
        """``(is_ready, reason)``."""
        return self.is_ready, "no partitions assigned (test)"


class _EmptyState:
    """A state source with nothing to show."""

    def state(self) -> dict[str, Any]:
        return {}


@contextmanager
def observe_server(health: StubHealth) -> Iterator[ObserveServer]:
    """htmqc's real observability server on a free loopback port, answering
    ``/healthz`` and ``/readyz`` from ``health``."""
    server = ObserveServer(source=_EmptyState(), health=health)
    server.start(0)
    try:
        yield server
    finally:
        server.stop()


def status_of(url: str) -> int:
    """The HTTP status of a GET of ``url``."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
