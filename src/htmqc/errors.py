"""Errors that reach the user: one line naming the problem and the fix.

The command line turns these into a single line on stderr and an exit code
(2 for usage, 1 for runtime), with no traceback unless ``--debug`` is given.
Messages must never contain secrets: build them from names, not from config
values (see :func:`htmqc.errors.redact`).
"""

from __future__ import annotations


class HtmqcError(Exception):
    """A failure reported to the user. ``fix`` says what to do about it."""

    exit_code = 1

    def __init__(self, problem: str, fix: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix

    def line(self) -> str:
        """The one line shown to the user."""
        return f"{self.problem}; {self.fix}" if self.fix else self.problem


class UsageError(HtmqcError):
    """Bad input: an option, a file, a module name. Exit code 2."""

    exit_code = 2


class RuntimeFailure(HtmqcError):
    """Something went wrong while running (broker unreachable, sink failed). Exit code 1."""

    exit_code = 1
