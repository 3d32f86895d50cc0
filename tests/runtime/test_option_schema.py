"""One option schema (issue 16, item 8): each option of ``htmqc run`` is declared
once (:data:`htmqc.runtime.options.OPTIONS`); the flags, the config fields,
the limits and the choices all come from it, so they cannot disagree."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from htmqc import config
from htmqc.cli import run_cmd
from htmqc.errors import UsageError
from htmqc.runtime.options import OPTIONS, REQUIRED_VALUE, RunOptions

BASE = ["run", "m:f", "--bootstrap", "b:1", "--topic", "t", "--group", "g"]


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser()
    run_cmd.register(top.add_subparsers())
    return top


def resolved(argv: list[str]) -> RunOptions:
    args = parser().parse_args(argv)
    cli = {k: v for k, v in vars(args).items() if k not in {"kafka_config", "config", "func"}}
    cli.pop("log_level", None)
    cli.pop("handler", None)
    return config.resolve(cli, {}, environ={})


def test_every_field_is_an_option_with_the_dataclass_default() -> None:
    names = {o.name for o in OPTIONS}
    assert names == {f.name for f in fields(RunOptions)} - {"kafka_config"}
    defaults = resolved(BASE)
    for o in OPTIONS:
        if o.default is not REQUIRED_VALUE:
            assert getattr(defaults, o.name) == o.default, o.name
            assert config.FIELDS[o.name] == (o.kind, o.default)
    assert set(config.REQUIRED) == {"bootstrap", "topic", "group"}


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.spec.limits], ids=lambda o: o.name)
def test_each_bound_is_enforced_through_its_flag(option: object) -> None:
    lowest, highest, _inclusive = option.spec.limits  # type: ignore[attr-defined]
    kind = option.kind  # type: ignore[attr-defined]
    flag = option.flag  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match=flag):
        resolved([*BASE, flag, str(kind(highest) * 2 + 1)])
    with pytest.raises(UsageError, match=flag):
        resolved([*BASE, flag, str(kind(lowest) - 1)])


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.spec.choices], ids=lambda o: o.name)
def test_each_choice_is_offered_by_its_flag(option: object) -> None:
    choices = option.spec.choices  # type: ignore[attr-defined]
    flag = option.flag  # type: ignore[attr-defined]
    for choice in choices:
        assert getattr(resolved([*BASE, flag, choice]), option.name) == choice  # type: ignore[attr-defined]
    with pytest.raises(SystemExit):
        parser().parse_args([*BASE, flag, "no-such-choice"])
