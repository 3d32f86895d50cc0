"""The core's value types: which are frozen, slotted and built by keyword only.

Decisions and policies cross from the core to the runtime (and into logs,
metrics and traces): one that could change after the core returned it, or take
a stray attribute, would make the core's answer something else by the time the
runtime acts on it. The table below is the one statement of it; a dataclass
added to the core without a row fails the first test."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import pytest

import htmqc.core as core

#: ``module.Class`` -> (frozen, slots, keyword only).
EXPECTED: dict[str, tuple[bool, bool, bool]] = {
    "breaker.BreakerPolicy": (True, True, True),
    "decisions.Commit": (True, True, True),
    "decisions.RetryAt": (True, True, True),
    "decisions.HandOff": (True, True, True),
    "decisions.DeadLetter": (True, True, True),
    "failures.Failure": (True, True, True),
    "failures.RetryTopic": (True, True, True),
    "failures.Facts": (True, True, True),
    "flow.FlowPolicy": (True, True, False),
    "gate.Drop": (True, True, True),
    "gate.Claim": (True, True, True),
    "gate.Pause": (True, True, True),
    "gate.Seek": (True, True, True),
    "gate.Resume": (True, True, True),
    "gate._Part": (False, True, False),  # the gate's own mutable record, never handed out
    "retry.RetryPolicy": (True, True, False),
}


def core_dataclasses() -> dict[str, type]:
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(core.__path__):
        module = importlib.import_module(f"htmqc.core.{info.name}")
        for name, obj in vars(module).items():
            if (isinstance(obj, type) and dataclasses.is_dataclass(obj)
                    and obj.__module__ == module.__name__):  # fmt: skip
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_core_dataclass_has_a_row() -> None:
    assert sorted(core_dataclasses()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_frozen_slotted_and_keyword_only_as_stated(name: str) -> None:
    cls = core_dataclasses()[name]
    frozen, slots, keyword_only = EXPECTED[name]
    assert cls.__dataclass_params__.frozen is frozen  # type: ignore[attr-defined]
    assert ("__slots__" in vars(cls)) is slots
    assert all(f.kw_only is keyword_only for f in dataclasses.fields(cls))
