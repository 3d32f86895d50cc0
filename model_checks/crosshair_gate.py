"""CrossHair gate: symbolic execution of every icontract contract in the core.

``python -m model_checks.crosshair_gate [--per-condition-timeout S] [TARGET ...]``
runs ``crosshair check --analysis_kind=icontract`` over each module of
``src/htmqc/core`` (or the given targets: files, or ``FILE:LINE`` for the
function at that line), one child process per target, and fails (exit 1) if
CrossHair reports any counterexample or unexpected exception. It prints each
target's wall and CPU time and findings; a JSON report goes to
``build/crosshair/report.json``.

Reachable states. Left alone, CrossHair builds a ``self`` through the class's
constructor, so every method would only ever be tried on a freshly assigned
partition (``processed == next``, nothing in flight), where most bugs cannot
show. The child process therefore registers creators (:func:`register_states`)
that build :class:`~htmqc.core.partition.PartitionTracker` and
:class:`~htmqc.core.consumer.ConsumerCore` instances by running the real
transitions on symbolic arguments: a start with held offsets, a fetched range
after a gap, a batch of starts and perhaps one more batch of any event, a
commit request, an ack, a drain; a consumer holds one such partition in some
epoch, or none. Illegal choices are discarded (``IgnoreAttempt``). The
transitions run unwrapped (without their own contracts): the contracts under
check are those of the method CrossHair calls on the state. Every state is
thus reachable, so a finding is a real one; which states get tried within the
timeout is CrossHair's choice: of the twelve one-line bugs of
``tests/core/mutants/table.py`` it finds seven within 4 s per condition and two
more within 10-20 s.

What it proves, and what it does not: CrossHair explores paths with symbolic
inputs until the per-condition timeout; a clean run means no counterexample was
found in that budget, not a proof. The proofs of inductiveness are Z3's
(``proofs/``).

The target's source root (the directory above its top package) goes first on
the child's ``PYTHONPATH``, so a mutated copy of ``src/`` is checked against
itself (``tests/core/test_crosshair_gate.py``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "src" / "htmqc" / "core"
_FINDING = re.compile(r"^(?P<path>[^:\n]+\.py):(?P<line>\d+): error: (?P<message>.*)$")
_TP = ("", 0)  # the partition a ConsumerCore built for CrossHair holds
# The child: CrossHair's own command line, after register_states().
_CHILD = "import sys, model_checks.crosshair_gate as g; sys.exit(g.crosshair_main())"


@dataclass(frozen=True)
class Finding:
    """One counterexample or exception reported by CrossHair."""

    path: str
    line: int
    message: str


@dataclass(frozen=True)
class ModuleResult:
    """CrossHair's verdict on one target."""

    target: str
    seconds: float
    cpu_seconds: float
    exit_code: int
    findings: list[Finding]


def source_root(target: Path) -> Path:
    """The directory that holds the target's top-level package."""
    path = target.resolve().parent
    while (path / "__init__.py").exists():
        path = path.parent
    return path


def check(target: Path | str, per_condition_timeout: float) -> ModuleResult:
    """Run CrossHair over one file (or ``FILE:LINE``) and parse what it reports."""
    file = Path(re.sub(r":\d+$", "", str(target)))
    started = time.monotonic()
    cpu_before = _children_cpu()
    pythonpath = os.pathsep.join(
        [str(source_root(file)), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env = {**os.environ, "HTMQC_CONTRACTS": "1", "PYTHONPATH": pythonpath}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            "check",
            "--analysis_kind=icontract",
            f"--per_condition_timeout={per_condition_timeout}",
            str(target),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    findings = [
        Finding(m["path"], int(m["line"]), m["message"])
        for m in map(_FINDING.match, proc.stdout.splitlines())
        if m
    ]
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not findings):
        # CrossHair itself failed: surface it as a finding rather than a pass.
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        findings.append(Finding(str(file), 0, f"crosshair exited {proc.returncode}: {tail[0]}"))
    return ModuleResult(
        str(target),
        time.monotonic() - started,
        _children_cpu() - cpu_before,
        proc.returncode,
        findings,
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# -- reachable states (run inside the CrossHair child) ------------------------------------


def register_states() -> None:
    """Register CrossHair creators that build trackers and consumers through the
    real transitions (see module docs)."""
    from crosshair import IgnoreAttempt, ResumedTracing, SymbolicFactory, register_type

    from htmqc.core.consumer import ConsumerCore
    from htmqc.core.errors import CoreError
    from htmqc.core.lifecycle import EDGES, Event
    from htmqc.core.partition import PartitionTracker

    def bare(method: Callable[..., Any]) -> Callable[..., Any]:
        return inspect.unwrap(method)  # the body, without its icontract wrappers

    init, fetched, apply_many = map(
        bare, (PartitionTracker.__init__, PartitionTracker.fetched, PartitionTracker.apply_many)
    )
    request, ack, drain = map(
        bare,
        (
            PartitionTracker.commit_requested,
            PartitionTracker.commit_acked,
            PartitionTracker.begin_drain,
        ),
    )

    def tracker(factory: SymbolicFactory) -> PartitionTracker:
        steps: list[tuple[str, Any]] = []
        t: PartitionTracker = object.__new__(PartitionTracker)
        start, held = factory(int), factory(list[int])
        steps.append(("start", (start, held)))
        with ResumedTracing():
            try:
                init(t, start, held)
                if factory(bool):
                    # consecutive offsets after a leading gap; the range may end beyond them
                    lead, width, beyond = factory(int), factory(int), factory(int)
                    if not (lead >= 0 and 0 <= width <= 3 and beyond >= 0):
                        raise IgnoreAttempt
                    first = start + lead
                    arrived, end = list(range(first, first + width)), first + width + beyond
                    steps.append(("fetched", (arrived, end)))
                    fetched(t, arrived, end)
                    # some of them start; then perhaps one more batch, of any event
                    picks = [o for o in t.in_flight() if factory(bool)]
                    steps.append(("started", picks))
                    apply_many(t, Event.START, picks)
                    if factory(bool):
                        event = factory(Event)
                        source = EDGES[event][0]
                        live = t.in_flight().items()
                        picks = [o for o, s in live if s is source and factory(bool)]
                        steps.append((event.value, picks))
                        apply_many(t, event, picks)
                if factory(bool):
                    steps.append(("commit_requested", ()))
                    request(t)
                if factory(bool):
                    acked = factory(int)
                    steps.append(("commit_acked", acked))
                    ack(t, acked)
                if factory(bool):
                    steps.append(("begin_drain", ()))
                    drain(t)
            except CoreError:
                raise IgnoreAttempt from None
        _describe(t, "PartitionTracker", steps)
        return t

    def consumer(factory: SymbolicFactory) -> ConsumerCore:
        core = ConsumerCore()
        epoch = factory(int)
        with ResumedTracing():
            if epoch < 1:
                raise IgnoreAttempt
        if factory(bool):  # one held partition, in its `epoch`-th assignment
            # Keys are hashed, so CrossHair makes them concrete: give the partition
            # the values it picks first for an unconstrained (str, int), so that a
            # symbolic `tp` argument can name it.
            core._parts[_TP] = factory(PartitionTracker)
            core._epochs[_TP] = epoch
        core._last_epoch = epoch
        _describe(core, "ConsumerCore", [("epoch", epoch), ("holds", dict(core._epochs))])
        return core

    register_type(PartitionTracker, tracker)
    register_type(ConsumerCore, consumer)


def _describe(obj: object, name: str, steps: list[tuple[str, Any]]) -> None:
    """Let a counterexample show how ``obj`` was built, e.g.
    ``PartitionTracker[start (0, []); fetched ([0], 1); started []]`` (through
    CrossHair's internal repr table, as it does for objects it constructs)."""
    from crosshair import NoTracing
    from crosshair.core import LazyCreationRepr
    from crosshair.statespace import context_statespace

    reprer = context_statespace().extra(LazyCreationRepr)

    def text(_: object) -> str:
        with NoTracing():
            realized = reprer.deep_realize(steps)
        return f"{name}[" + "; ".join(f"{step} {args!r}" for step, args in realized) + "]"

    reprer.reprs[obj] = text


def crosshair_main() -> int:
    """CrossHair's command line with the reachable-state creators registered."""
    from crosshair.main import main as crosshair

    register_states()
    return crosshair() or 0


# -- command line ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help="files or FILE:LINE (default: the core)")
    parser.add_argument("--per-condition-timeout", type=float, default=4.0)
    parser.add_argument(
        "--jobs", type=int, default=min(2, os.cpu_count() or 1),
        help="modules checked at once (default: 2, or 1 on a one-core machine)",
    )
    parser.add_argument("--report", type=Path, default=ROOT / "build" / "crosshair" / "report.json")
    args = parser.parse_args(argv)
    targets = args.targets or sorted(
        str(p) for p in CORE.glob("*.py") if p.name != "__init__.py"
    )
    missing = [t for t in targets if not Path(re.sub(r":\d+$", "", t)).is_file()]
    if missing:
        parser.error(f"no such file: {missing[0]} (give a .py file or FILE:LINE)")
    results = []
    started = time.monotonic()
    # Modules are independent child processes: run ``--jobs`` at once, the largest
    # first so that the long ones do not start last. CrossHair's per-condition
    # timeout is the process's CPU time (``time.process_time``), so a target explores
    # as much beside others, or under load, as when run alone; only wall time grows.
    order = sorted(targets, key=lambda t: -Path(re.sub(r":\d+$", "", t)).stat().st_size)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        done = pool.map(lambda t: check(t, args.per_condition_timeout), order)
        by_target = dict(zip(order, done, strict=True))
    for target in targets:
        result = by_target[target]
        verdict = "ok" if not result.findings else f"{len(result.findings)} finding(s)"
        print(
            f"crosshair {Path(target).name:<20} {result.seconds:6.1f}s wall "
            f"{result.cpu_seconds:6.1f}s cpu  {verdict}",
            flush=True,
        )
        for f in result.findings:
            print(f"  {f.path}:{f.line}: {f.message}")
        results.append(result)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    failed = sum(len(r.findings) for r in results)
    print(
        f"crosshair: {len(results)} target(s), {failed} finding(s), "
        f"{time.monotonic() - started:.1f}s wall, {sum(r.cpu_seconds for r in results):.1f}s cpu"
        f" (per-condition timeout {args.per_condition_timeout}s); report {args.report}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
