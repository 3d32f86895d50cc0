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
from htmqc.runtime.options import OPTIONS, PROFILES, REQUIRED_VALUE, SINK_DEFAULTS, RunOptions

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
    assert names == {f.name for f in fields(RunOptions)} - {"kafka_config", "message_types"}
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


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_profile_sets_the_defaults_of_the_options_not_given(profile: str) -> None:
    tuned = PROFILES[profile]
    assert set(tuned) <= {o.name for o in OPTIONS}
    options = resolved([*BASE, "--profile", profile])
    for o in OPTIONS:
        if o.default is not REQUIRED_VALUE and o.name != "profile":
            assert getattr(options, o.name) == tuned.get(o.name, o.default), o.name


def test_low_latency_is_shorter_waits_and_transactions() -> None:
    """What the profile is for: idle polls and transactions bounded by a few ms."""
    options = resolved([*BASE, "--profile", "low-latency"])
    assert options.poll_wait_ms <= 2 and options.txn_ms <= 5
    assert options.batch_size < resolved(BASE).batch_size


def test_an_option_given_anywhere_wins_over_the_profile() -> None:
    argv = [*BASE, "--profile", "low-latency"]
    assert resolved([*argv, "--txn-ms", "50"]).txn_ms == 50
    args = {"bootstrap": "b:1", "topic": "t", "group": "g", "profile": "low-latency"}
    from_env = config.resolve(args, {}, environ={"HTMQC_POLL_WAIT_MS": "7"})
    assert from_env.poll_wait_ms == 7 and from_env.txn_ms == PROFILES["low-latency"]["txn_ms"]
    by_env = config.resolve(
        {k: v for k, v in args.items() if k != "profile"}, {},
        environ={"HTMQC_PROFILE": "low-latency", "HTMQC_BATCH_SIZE": "9"},
    )
    assert by_env.batch_size == 9 and by_env.poll_wait_ms == PROFILES["low-latency"]["poll_wait_ms"]


SINK_URLS = {"kafka": "kafka:out", "sqlite": "sqlite:///s.db", "postgresql": "postgresql://h/db"}


@pytest.mark.parametrize("kind", sorted(SINK_URLS))
def test_the_sink_sets_the_defaults_of_the_options_not_given(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below the profile, above the schema: a Kafka transaction is dearer than a
    database's, so it holds more messages by default."""
    tuned = SINK_DEFAULTS.get(kind, {})
    assert set(tuned) <= {o.name for o in OPTIONS}
    sink = [*BASE, "--mode", "exactly-once", "--sink", SINK_URLS[kind]]
    options = resolved(sink)
    for o in OPTIONS:
        if o.default is not REQUIRED_VALUE and o.name not in ("mode", "sink"):
            assert getattr(options, o.name) == tuned.get(o.name, o.default), o.name
    for name in tuned:  # given anywhere, or set by the profile, the option wins
        flag = next(o.flag for o in OPTIONS if o.name == name)
        assert getattr(resolved([*sink, flag, "7"]), name) == 7
        monkeypatch.setitem(PROFILES, "low-latency", {**PROFILES["low-latency"], name: 3})
        assert getattr(resolved([*sink, "--profile", "low-latency"]), name) == 3


def test_a_kafka_sink_commits_more_messages_per_transaction() -> None:
    kafka = resolved([*BASE, "--mode", "exactly-once", "--sink", "kafka:out"])
    assert kafka.txn_messages > resolved(BASE).txn_messages
    assert kafka.txn_ms == resolved(BASE).txn_ms  # the age still bounds it


def test_an_unknown_profile_is_a_one_line_error() -> None:
    with pytest.raises(UsageError, match="--profile") as caught:
        config.resolve(
            {"bootstrap": "b:1", "topic": "t", "group": "g"}, {},
            environ={"HTMQC_PROFILE": "fastest"},
        )
    assert "\n" not in str(caught.value)
