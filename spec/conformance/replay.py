"""Replay conformance vectors through :class:`htmqc.core.ConsumerCore`.

This is the Python port's side of the contract described in
``spec/conformance/README.md``; a port in another language writes the same
loop over its own API.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from htmqc.core import ConsumerCore, CoreError, DeadLetter, FailureKind, RetryAt, RetryPolicy

VECTORS = Path(__file__).resolve().parent / "vectors"
_SINGLE = {"started", "succeeded", "retry_due", "dead_lettered"}


def load(path: Path) -> dict[str, Any]:
    """One vector file."""
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def vector_files(folder: Path = VECTORS) -> list[Path]:
    """Every vector file, sorted by name."""
    return sorted(folder.glob("*.json"))


def parse_tp(name: str) -> tuple[str, int]:
    """``"topic/partition"`` to ``(topic, partition)``; the topic may contain ``/``."""
    topic, _, partition = name.rpartition("/")
    return topic, int(partition)


def _answer(value: Any) -> Any:
    """The core's answer in the vectors' vocabulary."""
    if isinstance(value, RetryAt):
        return "retry"
    if isinstance(value, DeadLetter):
        return "dead_letter"
    if hasattr(value, "offset") and hasattr(value, "finished_above"):  # a Commit
        return value.offset
    if isinstance(value, (list, tuple, range)):
        return list(value)
    return value


def call(core: ConsumerCore, op: str, args: dict[str, Any]) -> Any:
    """Perform one step on ``core``; return its answer in vector vocabulary."""
    if op == "crashed":
        core.crashed()
        return None
    tp = parse_tp(args["tp"])
    actions: dict[str, Callable[[], Any]] = {
        "assign": lambda: core.assign(tp, args["committed"], args["finished_above"]),
        "restored": lambda: core.restored(tp, args["committed"], args["finished_above"]),
        "fetched": lambda: core.fetched(tp, args["epoch"], args["offsets"], args["end"]),
        "failed": lambda: core.failed(
            tp,
            args["epoch"],
            args["offset"],
            FailureKind.PERMANENT if args["permanent"] else FailureKind.RETRYABLE,
            now=0.0,
            jitter=0.5,
        ),
        "commit_requested": lambda: core.commit_requested(tp),
        "commit_acked": lambda: core.commit_acked(tp, args["epoch"], args["offset"]),
        "commit_failed": lambda: core.commit_failed(tp, args["epoch"], args["offset"]),
        "revoking": lambda: core.revoking(tp),
        "revoked": lambda: core.revoked(tp),
    }
    if op in _SINGLE:
        if "offsets" in args:
            method = getattr(core, f"{op}_many")
            return _answer(method(tp, args["epoch"], args["offsets"]))
        return _answer(getattr(core, op)(tp, args["epoch"], args["offset"]))
    return _answer(actions[op]())


def mismatches(vector: dict[str, Any]) -> Iterator[str]:
    """Every difference between the core and the vector, step by step (none: conforms)."""
    core = ConsumerCore(RetryPolicy(max_retries=vector["max_retries"]))
    for i, step in enumerate(vector["steps"]):
        where = f"{vector['name']} step {i} ({step['op']} {step['args']})"
        try:
            answer = call(core, step["op"], step["args"])
        except CoreError as exc:
            if step.get("error") != type(exc).__name__:
                expected = step.get("error", step.get("result"))
                yield f"{where}: raised {type(exc).__name__}: {exc}; expected {expected!r}"
        else:
            if "error" in step:
                yield f"{where}: answered {answer!r}; expected {step['error']}"
            elif answer != step["result"]:
                yield f"{where}: answered {answer!r}; expected {step['result']!r}"
        state = core.snapshot()
        if state != step["state"]:
            yield f"{where}: state {state}; expected {step['state']}"
            return
