"""The ``htmqc`` command.

Subcommands live in modules of this package named ``<name>_cmd.py``; each
exposes ``register(subparsers) -> None``, which adds its parser and sets
``func=callable(args) -> int`` as a default. They are found at start-up, so a
new subcommand is a new module and nothing else.

Errors: a :class:`~htmqc.errors.HtmqcError` becomes one line on stderr and its
exit code (2 usage, 1 runtime); any other exception is reported in one line
too, with exit code 1. ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from htmqc import __version__, secrets
from htmqc.errors import HtmqcError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse prints usage plus the message; keep it to one line with a fix.
        self.exit(2, f"htmqc: error: {message}; see '{self.prog} --help'\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser with every ``*_cmd`` module's subcommand registered."""
    parser = _Parser(prog="htmqc", description="Exactly-once Kafka consumer runtime.")
    parser.add_argument("--version", action="version", version=f"htmqc {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks instead of one-line errors"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.endswith("_cmd"):
            module = importlib.import_module(f"{__name__}.{info.name}")
            module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except HtmqcError as exc:
        if args.debug:
            raise
        print(f"htmqc: error: {secrets.scrub(exc.line())}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if args.debug:
            raise
        print(
            f"htmqc: error: {type(exc).__name__}: {secrets.scrub(str(exc))}; "
            "run again with --debug for details",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
