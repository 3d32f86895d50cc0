"""Replay conformance vectors through :class:`htmqc.core.ConsumerCore`.

This is the Python port's side of the contract in ``spec/conformance/README.md``;
a port in another language writes the same loop over its own API.

``python -m spec.conformance.replay [PATH ...]`` replays every vector of
``vectors/`` (or the files and folders given), prints one line per vector and
exits 1 at the first vector that differs (``--keep-going``: replay them all
first). It imports :mod:`htmqc.core` by name, so a copy of the core placed
first on ``PYTHONPATH`` is the one replayed (this is how mutation testing and
``tests/spec/test_readings.py`` use it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Protocol

from htmqc.core import (
    Commit,
    ConsumerCore,
    CoreError,
    DeadLetter,
    FailureKind,
    HandOff,
    RetryAt,
    RetryPolicy,
)

VECTORS = Path(__file__).resolve().parent / "vectors"
FORMAT = 2
#: Lifecycle events the core takes one offset at a time, and in batches (``_many``).
SINGLE = ("started", "succeeded", "retry_due", "dead_lettered", "handed_off")
BATCH = ("started_many", "succeeded_many", "dead_lettered_many")


def load(path: Path) -> dict[str, Any]:
    """One vector file (JSON integers are read exactly, whatever their size)."""
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def vector_files(folder: Path = VECTORS) -> list[Path]:
    """Every vector file, sorted by name."""
    return sorted(folder.glob("*.json"))


def parse_tp(name: str) -> tuple[str, int]:
    """``"topic/partition"`` to ``(topic, partition)``; the topic may contain ``/``."""
    topic, _, partition = name.rpartition("/")
    return topic, int(partition)


def answer(value: Any) -> Any:
    """The core's answer in the vectors' vocabulary: a decision becomes an object
    with its ``type`` and every field; a batch of offsets becomes a list."""
    if isinstance(value, (Commit, RetryAt, HandOff, DeadLetter)):
        data = {f.name: getattr(value, f.name) for f in fields(value)}
        if isinstance(value, DeadLetter):
            data["kind"] = value.kind.value
        data["tp"] = f"{value.tp[0]}/{value.tp[1]}"
        if isinstance(value, Commit):
            data["finished_above"] = list(value.finished_above)
        return {"type": type(value).__name__, **data}
    if isinstance(value, (list, tuple, range)):
        return list(value)
    return value


def call(core: ConsumerCore, op: str, args: dict[str, Any]) -> Any:
    """Perform one step on ``core``; return its answer in vector vocabulary."""
    if op == "crashed":
        return core.crashed()
    tp = parse_tp(args["tp"])
    if op in SINGLE:
        return getattr(core, op)(tp, args["epoch"], args["offset"])
    if op in BATCH:
        return getattr(core, op)(tp, args["epoch"], args["offsets"])
    actions: dict[str, Callable[[], Any]] = {
        "assign": lambda: core.assign(tp, args["committed"], args["finished_above"]),
        "restored": lambda: core.restored(tp, args["committed"], args["finished_above"]),
        "fetched": lambda: core.fetched(tp, args["epoch"], args["offsets"], args["end"]),
        "failed": lambda: core.failed(
            tp,
            args["epoch"],
            args["offset"],
            FailureKind(args["kind"]),
            args["now"],
            args["jitter"],
        ),
        "commit_requested": lambda: core.commit_requested(tp),
        "commit_acked": lambda: core.commit_acked(tp, args["epoch"], args["offset"]),
        "commit_failed": lambda: core.commit_failed(tp, args["epoch"], args["offset"]),
        "revoking": lambda: core.revoking(tp),
        "revoked": lambda: core.revoked(tp),
    }
    return actions[op]()


def mismatches(vector: dict[str, Any]) -> Iterator[str]:
    """Every difference between the core and the vector, step by step (none: conforms).
    Stops after the first step whose state differs: later steps would only echo it."""
    if vector.get("format") != FORMAT:
        yield f"{vector.get('name')}: format {vector.get('format')!r}; this replay reads {FORMAT}"
        return
    if vector.get("kind") is not None:
        # they import this module's vocabulary
        from spec.conformance import breaker, failures, gate

        kinds = {m.KIND: m.mismatches for m in (gate, failures, breaker)}
        if vector["kind"] not in kinds:
            yield (f"{vector.get('name')}: kind {vector['kind']!r}; this replay reads core, "
                   f"{', '.join(kinds)}")
            return
        yield from kinds[vector["kind"]](vector)
        return
    core = ConsumerCore(RetryPolicy(**vector["retry"]))
    yield from step_mismatches(
        vector, lambda op, args: answer(call(core, op, args)), core.snapshot, (CoreError,)
    )


class OffsetMap(Protocol):
    """How a log adapter carries offsets (:func:`mapped_mismatches`): each offset a
    step names goes to the log's native position and back through the adapter's
    code. ``tp`` is the vector's partition name; values below 0 never get here."""

    def message(self, tp: str, offset: int) -> int:
        """The offset of the stored message at ``offset``, as the adapter reads it."""

    def batch(self, tp: str, offsets: list[int]) -> list[int]:
        """The offsets of a fetched batch, delivered in this order."""

    def position(self, tp: str, offset: int) -> int:
        """A position (one past the last message below it), stored and read back."""


#: Per op: the ``args`` that name stored messages, and those that are positions.
MESSAGE_ARGS = {"finished_above", "offsets", "offset"}
POSITION_ARGS = {"committed", "end"}
#: Ops whose ``offset`` is a position (a commit's watermark), not a message.
POSITION_OPS = {"commit_acked", "commit_failed"}


def offsets_named(vector: dict[str, Any]) -> dict[str, set[int]]:
    """Per partition, every offset ``>= 0`` a core vector names as a stored
    message (in ``args`` and in answers); the rest of the log is holes."""
    out: dict[str, set[int]] = {}

    def add(tp: str, values: Any) -> None:
        values = values if isinstance(values, list) else [values]
        out.setdefault(tp, set()).update(v for v in values if isinstance(v, int) and v >= 0)

    for step in vector["steps"]:
        args, op = step["args"], step["op"]
        for key in ("finished_above", "offsets") + (() if op in POSITION_OPS else ("offset",)):
            if key in args:
                add(args["tp"], args[key])
        result = step.get("result")
        if op == "fetched" and isinstance(result, list):
            add(args["tp"], result)
        elif isinstance(result, dict):
            add(result["tp"], result["finished_above" if result["type"] == "Commit" else "offset"])
    return out


def _through(mapping: OffsetMap, tp: str, value: Any, kind: str) -> Any:
    """``value`` (an offset, a list of them, or ``None``) through ``mapping``."""
    if isinstance(value, list):
        if kind == "batch" and all(isinstance(v, int) and v >= 0 for v in value):
            return mapping.batch(tp, value) if value else []
        return [_through(mapping, tp, v, "message") for v in value]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return value  # not a log position: the core's refusals see it unchanged
    return mapping.position(tp, value) if kind == "position" else mapping.message(tp, value)


def mapped_args(op: str, args: dict[str, Any], mapping: OffsetMap) -> dict[str, Any]:
    """``args`` with every offset through ``mapping`` (a fetched batch as one
    delivery, the other lists one message at a time)."""
    out = dict(args)
    for key, value in args.items():
        if key in POSITION_ARGS or (key == "offset" and op in POSITION_OPS):
            out[key] = _through(mapping, args["tp"], value, "position")
        elif key in MESSAGE_ARGS:
            out[key] = _through(mapping, args["tp"], value, "batch" if op == "fetched" else "list")
    return out


def mapped_answer(answer_: Any, mapping: OffsetMap) -> Any:
    """A core answer (vector vocabulary) whose offsets went through ``mapping`` on
    the way back: a commit's watermark as a stored position, the rest as messages."""
    if isinstance(answer_, dict):
        out = dict(answer_)
        if out["type"] == "Commit":
            out["offset"] = _through(mapping, out["tp"], out["offset"], "position")
            out["finished_above"] = _through(mapping, out["tp"], out["finished_above"], "list")
        else:
            out["offset"] = _through(mapping, out["tp"], out["offset"], "message")
        return out
    return answer_


def mapped_mismatches(vector: dict[str, Any], mapping: OffsetMap) -> Iterator[str]:
    """:func:`mismatches` of a core vector (no ``kind``) whose offsets all go through
    a log adapter's conversions (``mapping``): the event's offsets before the core
    sees them, the answer's on the way back; states are compared as they are."""
    if vector.get("format") != FORMAT or vector.get("kind") is not None:
        yield f"{vector.get('name')}: not a format {FORMAT} core vector"
        return
    core = ConsumerCore(RetryPolicy(**vector["retry"]))

    def perform(op: str, args: dict[str, Any]) -> Any:
        got = answer(call(core, op, mapped_args(op, args, mapping)))
        if op == "fetched" and isinstance(got, list) and got:
            return _through(mapping, args["tp"], got, "list")
        return mapped_answer(got, mapping)

    yield from step_mismatches(vector, perform, core.snapshot, (CoreError,))


def step_mismatches(
    vector: dict[str, Any],
    perform: Callable[[str, dict[str, Any]], Any],
    snapshot: Callable[[], Any] | None,
    refusals: tuple[type[Exception], ...],
) -> Iterator[str]:
    """Every difference between what ``perform`` answers (refusing with one of
    ``refusals``) and ``snapshot`` shows, and the vector's steps; stops after the
    first step whose state differs: later steps would only echo it. ``snapshot``
    is ``None`` for a pure function: its steps carry no ``state``."""
    for i, step in enumerate(vector["steps"]):
        where = f"{vector['name']} step {i} ({step['op']} {step['args']})"
        expected = step.get("error", step.get("result"))
        try:
            got = perform(step["op"], step["args"])
        except refusals as exc:
            if step.get("error") != type(exc).__name__:
                yield f"{where}: raised {type(exc).__name__}: {exc}; expected {expected!r}"
        except Exception as exc:  # a port's bug, reported like any other difference
            yield f"{where}: raised unexpected {type(exc).__name__}: {exc}; expected {expected!r}"
        else:
            if "error" in step:
                yield f"{where}: answered {got!r}; expected {step['error']}"
            elif got != step["result"]:
                yield f"{where}: answered {got!r}; expected {step['result']!r}"
        if snapshot is None:
            if "state" in step:
                yield f"{where}: carries a state; a {vector.get('kind')} step has none"
            continue
        state = snapshot()
        if state != step["state"]:
            yield f"{where}: state {state}; expected {step['state']}"
            return


def _paths(args: Sequence[str]) -> list[Path]:
    """The vector files named by ``args`` (files, or folders of ``*.json``).

    :raises ValueError: a path does not exist or a folder holds no vector.
    """
    if not args:
        return vector_files()
    out: list[Path] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            found = vector_files(path)
            if not found:
                raise ValueError(f"{arg} holds no *.json vector; give a vector file or folder")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise ValueError(f"{arg} does not exist; give a vector file or folder")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Replay vectors through the core: 0 if every one conforms, 1 if one differs,
    2 for bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m spec.conformance.replay",
        description="Replay conformance vectors through htmqc.core.",
    )
    parser.add_argument("paths", nargs="*", help="vector files or folders (default: all)")
    parser.add_argument(
        "--keep-going", action="store_true", help="replay every vector even after a mismatch"
    )
    args = parser.parse_args(argv)
    try:
        paths = _paths(args.paths)
    except ValueError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    failed = 0
    for path in paths:
        try:
            vector = load(path)
        except (OSError, ValueError) as exc:
            print(f"replay: {path} is not a JSON vector ({exc}); regenerate it with "
                  "python -m spec.conformance.generate", file=sys.stderr)
            return 2
        first = next(mismatches(vector), None)
        if first is None:
            print(f"ok    {path.stem} ({len(vector['steps'])} steps)")
            continue
        print(f"FAIL  {path.stem}: {first}")
        failed += 1
        if not args.keep_going:
            return 1
    if failed:
        print(f"{failed} of {len(paths)} vectors differ")
        return 1
    print(f"{len(paths)} vectors conform")
    return 0


if __name__ == "__main__":
    sys.exit(main())
