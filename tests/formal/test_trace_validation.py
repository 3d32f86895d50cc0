"""Trace validation: real traces from the engine are accepted by the reference
replay and by TLC; doctored ones are rejected by both, at the doctored line."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from htmqc.runtime import Engine, RunOptions
from htmqc.sinks import open_sink
from model_checks import trace_validation as tv
from tests.runtime.fakes import FakeConsumer, make_logs

TOPIC = "t"
Trace = list[dict[str, Any]]


def engine_trace(path: Path, *, mode: str = "at-least-once", count: int = 6) -> Trace:
    """Run the engine over 2 partitions x ``count`` messages with a fake consumer;
    offset 2 of partition 0 fails twice, then succeeds (retries, out-of-order
    finishing). Returns the trace lines."""
    consumer = FakeConsumer(TOPIC, make_logs(TOPIC, 2, count, keys=2))
    calls = {"n": 0}

    def fail_twice(msg: Any) -> None:
        if msg.partition() == 0 and msg.offset() == 2 and calls["n"] < 2:
            calls["n"] += 1
            raise RuntimeError("transient")

    sink = None
    extra: dict[str, Any] = {}
    handler: Callable[..., None] = fail_twice
    if mode == "exactly-once":
        url = f"sqlite:///{path.with_suffix('.db')}"
        sink = open_sink(url)
        sink.open("g")
        extra = {"sink": url, "txn_messages": 4}

        def handler(msg: Any, txn: Any) -> None:
            fail_twice(msg)

    options = RunOptions(
        bootstrap="fake:1",
        topic=TOPIC,
        group="g",
        mode=mode,
        max_messages=2 * count,
        trace=str(path),
        batch_size=3,
        backoff_ms=1,
        backoff_max_ms=2,
        **extra,
    )
    engine = Engine(handler, options, consumer, sink=sink, seed=1)
    consumer.on_commit = engine.on_commit
    engine.run(install_signals=False)
    return [json.loads(line) for line in path.read_text().splitlines()]


def write(path: Path, lines: Trace) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture(scope="module")
def alo_trace(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    return engine_trace(tmp_path_factory.mktemp("alo") / "trace.jsonl")


@pytest.fixture(scope="module")
def eos_trace(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    return engine_trace(tmp_path_factory.mktemp("eos") / "trace.jsonl", mode="exactly-once")


def index(lines: Trace, p: str, ev: str, off: int | None, nth: int = -1) -> int:
    found = [k for k, x in enumerate(lines) if (x["p"], x["ev"], x["off"]) == (p, ev, off)]
    assert found, f"no {ev} {p}@{off} in the trace"
    return found[nth]


# -- doctored traces: each returns (lines, the 1-based line number that must be blamed) ------


def commit_beyond_watermark(lines: Trace) -> tuple[Trace, int]:
    """An ack of offset 5 while offset 2 of t/0 is still retrying (processed = 2)."""
    out = copy.deepcopy(lines)
    k = index(out, "t/0", "succeeded", 5) + 1
    state = dict(out[k - 1]["state"], committed=5)
    out.insert(k, {"p": "t/0", "ev": "commit_acked", "off": 5, "state": state})
    return out, k + 1


def skipped_offset(lines: Trace) -> tuple[Trace, int]:
    """Offset 2 of t/0 never succeeds, yet the watermark passes it."""
    out = copy.deepcopy(lines)
    k = index(out, "t/0", "succeeded", 2)
    del out[k]
    return out, index(out, "t/0", "succeeded", 4) + 1


def processed_backwards(lines: Trace) -> tuple[Trace, int]:
    """After t/1's first batch succeeded (processed 3), a line records processed 1."""
    out = copy.deepcopy(lines)
    k = index(out, "t/1", "started", 3, nth=0)
    out[k]["state"] = dict(out[k]["state"], processed=1)
    return out, k + 1


def stale_epoch_event(lines: Trace) -> tuple[Trace, int]:
    """t/1 is revoked and assigned again at 6; then a completion of offset 5,
    which belonged to the old epoch, is recorded."""
    out = copy.deepcopy(lines)
    state = {"next": 6, "processed": 6, "committed": 6}
    out += [
        {"p": "t/1", "ev": "revoked", "off": None, "state": {}},
        {"p": "t/1", "ev": "assign", "off": 6, "state": state},
        {"p": "t/1", "ev": "succeeded", "off": 5, "state": state},
    ]
    return out, len(out)


DOCTORED = [commit_beyond_watermark, skipped_offset, processed_backwards, stale_epoch_event]


# -- the reference replay ------------------------------------------------------------------


@pytest.mark.parametrize("which", ["alo", "eos"])
def test_real_trace_accepted_by_reference(
    which: str, alo_trace: Trace, eos_trace: Trace, tmp_path: Path
) -> None:
    lines = alo_trace if which == "alo" else eos_trace
    assert {x["ev"] for x in lines} >= {"assign", "fetched", "retry_due", "commit_acked"}
    report = tv.validate_trace(write(tmp_path / "t.jsonl", lines), tlc=False)
    assert report.ok, report.summary()
    assert report.lines == len(lines) and report.partitions == ["t/0", "t/1"]
    assert report.tlc is None


@pytest.mark.parametrize("doctor", DOCTORED, ids=lambda f: f.__name__)
def test_doctored_trace_rejected_by_reference(
    doctor: Callable[[Trace], tuple[Trace, int]], alo_trace: Trace, tmp_path: Path
) -> None:
    lines, blamed = doctor(alo_trace)
    report = tv.validate_trace(write(tmp_path / "t.jsonl", lines), tlc=False)
    assert not report.ok
    assert report.violations[0].line == blamed, report.summary()
    assert report.violations[0].check == "reference"


def test_reference_names_the_problem(alo_trace: Trace, tmp_path: Path) -> None:
    problems = {}
    for doctor in DOCTORED:
        lines, _ = doctor(alo_trace)
        report = tv.validate_trace(write(tmp_path / f"{doctor.__name__}.jsonl", lines), tlc=False)
        problems[doctor.__name__] = report.violations[0].problem
    assert "beyond the watermark" in problems["commit_beyond_watermark"]
    assert "but the model has (6, 2," in problems["skipped_offset"]
    assert "processed went backwards" in problems["processed_backwards"]
    assert "succeeded needs Processing" in problems["stale_epoch_event"]


def test_event_after_revoke_is_a_stale_effect(alo_trace: Trace, tmp_path: Path) -> None:
    lines = [*alo_trace, {"p": "t/0", "ev": "revoked", "off": None, "state": {}}]
    lines.append({"p": "t/0", "ev": "commit_acked", "off": 6, "state": {}})
    report = tv.validate_trace(write(tmp_path / "t.jsonl", lines), tlc=False)
    assert not report.ok and "does not hold" in report.violations[0].problem


def test_committed_backwards_across_assignments(alo_trace: Trace, tmp_path: Path) -> None:
    state = {"next": 3, "processed": 3, "committed": 3}
    lines = [
        *alo_trace,
        {"p": "t/0", "ev": "revoked", "off": None, "state": {}},
        {"p": "t/0", "ev": "assign", "off": 3, "state": state},
    ]
    report = tv.validate_trace(write(tmp_path / "t.jsonl", lines), tlc=False)
    assert not report.ok and "moved backwards" in report.violations[0].problem


def restart_with_finished_above(above: bool) -> Trace:
    """A second process: the sink stored 2 with 3 finished above it."""
    s = {"next": 2, "processed": 2, "committed": 2}
    assign: dict[str, Any] = {"p": "t/0", "ev": "assign", "off": 2, "state": s}
    if above:
        assign["above"] = [3]
    s4 = {"next": 5, "processed": 2, "committed": 2}
    done = {"next": 5, "processed": 5, "committed": 2}
    acked = {"next": 5, "processed": 5, "committed": 5}
    return [
        assign,
        *({"p": "t/0", "ev": "fetched", "off": o, "state": s4} for o in (2, 3, 4)),
        *({"p": "t/0", "ev": "started", "off": o, "state": s4} for o in (2, 4)),
        *({"p": "t/0", "ev": "succeeded", "off": o, "state": done} for o in (2, 4)),
        {"p": "t/0", "ev": "commit_acked", "off": 5, "state": acked},
    ]


def test_finished_above_on_assign(tmp_path: Path) -> None:
    good = tv.validate_trace(
        write(tmp_path / "a.jsonl", restart_with_finished_above(True)), tlc=False
    )
    assert good.ok, good.summary()
    bad = tv.validate_trace(
        write(tmp_path / "b.jsonl", restart_with_finished_above(False)), tlc=False
    )
    assert not bad.ok and bad.violations[0].line == 8


def test_cut_short_last_line_is_ignored(alo_trace: Trace, tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", alo_trace)
    path.write_text(path.read_text() + '{"p": "t/0", "ev": "start')
    report = tv.validate_trace(path, tlc=False)
    assert report.ok and report.truncated_tail and report.lines == len(alo_trace)


def test_malformed_line_in_the_middle(alo_trace: Trace, tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", alo_trace)
    text = path.read_text().splitlines()
    text[3] = '{"p": "t/0", "ev": "teleported", "off": 1, "state": {}}'
    path.write_text("\n".join(text) + "\n")
    report = tv.validate_trace(path, tlc=False)
    assert not report.ok
    assert report.violations[0].line == 4 and "unknown event" in report.violations[0].problem


def test_cli_exit_codes(
    alo_trace: Trace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path / "good.jsonl", alo_trace)
    bad = write(tmp_path / "bad.jsonl", commit_beyond_watermark(alo_trace)[0])
    assert tv.main(["--no-tlc", str(good)]) == 0
    assert tv.main(["--no-tlc", str(good), str(bad)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith(f"{bad}:") and "INVALID" in out[-1]
    assert tv.main(["--no-tlc", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read trace" in capsys.readouterr().err


def test_large_trace_replays_quickly(tmp_path: Path) -> None:
    """A 20,000-message engine trace: reference only by default, in seconds."""
    lines = engine_trace(tmp_path / "big.jsonl", count=10_000)
    assert len(lines) > 60_000
    assert not tv.tlc_fits(tv.read_trace(tmp_path / "big.jsonl")[0])
    started = time.perf_counter()
    report = tv.validate_trace(tmp_path / "big.jsonl")
    seconds = time.perf_counter() - started
    assert report.ok and report.tlc is None, report.summary()
    assert seconds < 20, f"replay took {seconds:.1f} s"


# -- TLC -------------------------------------------------------------------------------------


@pytest.mark.formal
@pytest.mark.parametrize("which", ["alo", "eos"])
def test_real_trace_accepted_by_tlc(
    which: str, alo_trace: Trace, eos_trace: Trace, tmp_path: Path
) -> None:
    lines = alo_trace if which == "alo" else eos_trace
    mode = "at-least-once" if which == "alo" else "exactly-once"
    report = tv.validate_trace(write(tmp_path / "t.jsonl", lines), tlc=True, mode=mode)
    assert report.tlc is not None and report.tlc.accepted, report.tlc
    assert report.ok


@pytest.mark.formal
@pytest.mark.parametrize("doctor", DOCTORED, ids=lambda f: f.__name__)
def test_doctored_trace_rejected_by_tlc(
    doctor: Callable[[Trace], tuple[Trace, int]], alo_trace: Trace, tmp_path: Path
) -> None:
    lines, blamed = doctor(alo_trace)
    parsed = tv.read_trace(write(tmp_path / "t.jsonl", lines))[0]
    verdict = tv.check_with_tlc(parsed)
    assert not verdict.accepted
    assert tv._tlc_violation(parsed, verdict).line == blamed


@pytest.mark.formal
def test_finished_above_on_assign_by_tlc(tmp_path: Path) -> None:
    good = tv.read_trace(write(tmp_path / "a.jsonl", restart_with_finished_above(True)))[0]
    bad = tv.read_trace(write(tmp_path / "b.jsonl", restart_with_finished_above(False)))[0]
    assert tv.check_with_tlc(good, "exactly-once").accepted
    assert not tv.check_with_tlc(bad, "exactly-once").accepted
