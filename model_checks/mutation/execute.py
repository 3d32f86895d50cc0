"""Run one check or layer against a shadow tree, with a time limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from model_checks.mutation.config import Command
from model_checks.mutation.shadow import Shadow

Verdict = Literal["pass", "fail", "timeout", "skipped", "uncovered"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one command said: ``fail`` (non-zero exit) and ``timeout`` detect a
    mutant; ``skipped`` means the command is pending (not merged yet);
    ``uncovered`` that it was not run because it never executes the mutated lines."""

    name: str
    verdict: Verdict
    seconds: float
    tail: str = ""

    @property
    def detects(self) -> bool:
        """True if the command rejected the code under test."""
        return self.verdict in ("fail", "timeout")


def run_command(command: Command, shadow: Shadow, mutated: Path, timeout: float) -> Outcome:
    """Run ``command`` from ``shadow.work``; kill its whole process group after ``timeout``."""
    if command.pending():
        return Outcome(command.name, "skipped", 0.0, f"{command.module}: not merged yet")
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, *command.resolved(mutated)],
        cwd=shadow.work,
        env=shadow.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return Outcome(command.name, "timeout", time.monotonic() - started, f"over {timeout:.0f}s")
    seconds = time.monotonic() - started
    verdict: Verdict = "pass" if proc.returncode == 0 else "fail"
    return Outcome(command.name, verdict, seconds, _tail(out))


def _tail(output: str, lines: int = 3) -> str:
    kept = [line for line in output.strip().splitlines() if line.strip()]
    return "\n".join(kept[-lines:])
