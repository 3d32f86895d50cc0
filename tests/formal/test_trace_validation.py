"""Trace validation: real traces from the engine are accepted by the reference
replay and by TLC; doctored ones are rejected by both, at the doctored line."""

from __future__ import annotations

import copy
import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from htmqc.core import Event, FailureKind, HandOff, PartitionTracker, Retryable, RetryPolicy
from htmqc.core.failures import RetryTopic
from htmqc.runtime import Engine, RunOptions
from htmqc.runtime.trace import TracingCore, compact_offsets
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


def restart_traces(directory: Path) -> list[Trace]:
    """Two exactly-once processes over one SQLite sink. The first leaves offset
    1 retrying and stores 2..5 as finished above it; the second restarts from
    there with the held offsets, fetching one message per batch (each batch
    ends exactly at a held offset)."""
    url = f"sqlite:///{directory / 'sink.db'}"
    logs = make_logs(TOPIC, 1, 6, keys=6)
    traces = []
    for run, (fail, count, batch) in enumerate([({1}, 5, 6), (set(), 1, 1)]):
        def handler(msg: Any, txn: Any, fail: set[int] = fail) -> None:
            if msg.offset() in fail:
                raise Retryable("later")

        sink = open_sink(url)
        sink.open("g")
        path = directory / f"run{run}.jsonl"
        options = RunOptions(
            bootstrap="fake:1", topic=TOPIC, group="g", mode="exactly-once",
            max_messages=count, trace=str(path), batch_size=batch, backoff_ms=60_000,
            backoff_max_ms=60_000, sink=url, txn_messages=2,
        )
        consumer = FakeConsumer(TOPIC, logs)
        engine = Engine(handler, options, consumer, sink=sink, seed=1)
        consumer.on_commit = engine.on_commit
        engine.run(install_signals=False)
        traces.append([json.loads(line) for line in path.read_text().splitlines()])
    return traces


def write(path: Path, lines: Trace) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture(scope="module")
def alo_trace(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    return engine_trace(tmp_path_factory.mktemp("alo") / "trace.jsonl")


@pytest.fixture(scope="module")
def eos_trace(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    return engine_trace(tmp_path_factory.mktemp("eos") / "trace.jsonl", mode="exactly-once")


def state(
    nxt: int, processed: int, committed: int, *, requested: int | None = None,
    unsent: bool = False, epoch: int = 1, above: list[int] | None = None,
) -> dict[str, Any]:
    """A recorded state (requested defaults to committed)."""
    return {
        "next": nxt, "processed": processed, "committed": committed,
        "requested": committed if requested is None else requested, "unsent": unsent,
        "epoch": epoch, "finished_above": above or [],
    }


def index(lines: Trace, p: str, ev: str, off: int | None, nth: int = -1) -> int:
    found = [k for k, x in enumerate(lines) if (x["p"], x["ev"], x["off"]) == (p, ev, off)]
    assert found, f"no {ev} {p}@{off} in the trace"
    return found[nth]


# -- doctored traces: each returns (lines, the 1-based line number that must be blamed) ------

Doctor = Callable[[Trace], tuple[Trace, int]]


def on_eos(doctor: Doctor) -> Doctor:
    """The doctor needs the exactly-once trace (commits made while work is open)."""
    doctor.mode = "exactly-once"  # type: ignore[attr-defined]
    return doctor


def mode_of(doctor: Doctor) -> str:
    return str(getattr(doctor, "mode", "at-least-once"))


@pytest.fixture(scope="module")
def traces(alo_trace: Trace, eos_trace: Trace) -> dict[str, Trace]:
    return {"at-least-once": alo_trace, "exactly-once": eos_trace}


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
    again = state(6, 6, 6, epoch=3)
    out += [
        {"p": "t/1", "ev": "revoked", "off": None, "state": {}},
        {"p": "t/1", "ev": "assign", "off": 6, "state": again, "above": []},
        {"p": "t/1", "ev": "succeeded", "off": 5, "state": again},
    ]
    return out, len(out)


def _first_commit(lines: Trace) -> int:
    """The first commit request made while some fetched offset is unfinished."""
    return next(
        k for k, x in enumerate(lines)
        if x["ev"] == "commit_requested" and x["off"] < x["state"]["next"]
    )


@on_eos
def commit_hands_out_next(lines: Trace) -> tuple[Trace, int]:
    """The first commit request hands out next instead of the watermark."""
    out = copy.deepcopy(lines)
    k = _first_commit(out)
    out[k]["off"] = out[k]["state"]["requested"] = out[k]["state"]["next"]
    return out, k + 1


@on_eos
def commit_forgets_finished_above(lines: Trace) -> tuple[Trace, int]:
    """A commit request whose finished_above claims an offset that has not
    finished: the highest fetched one from the watermark up that it does not
    list (the watermark's own offset is one; which depends on how the engine's
    run was timed)."""
    out = copy.deepcopy(lines)
    k = _first_commit(out)
    commit = out[k]
    unfinished = set(range(commit["off"], commit["state"]["next"])) - set(commit["above"])
    commit["above"] = sorted([*commit["above"], max(unfinished)])
    return out, k + 1


def unsent_not_set(lines: Trace) -> tuple[Trace, int]:
    """A batch of finishes that does not mark the partition as having something
    to commit (the batch succeeded 0, 1 of t/0)."""
    out = copy.deepcopy(lines)
    first = index(out, "t/0", "succeeded", 0)
    batch = [k for k in (first, first + 1) if out[k]["ev"] == "succeeded"]
    for k in batch:
        out[k]["state"] = dict(out[k]["state"], unsent=False)
    return out, batch[-1] + 1


def epoch_not_fresh(lines: Trace) -> tuple[Trace, int]:
    """The second assignment gets the first one's epoch."""
    out = copy.deepcopy(lines)
    k = index(out, "t/1", "assign", 0)
    first = out[index(out, "t/0", "assign", 0)]["state"]["epoch"]
    for x in out[k:]:
        if x["p"] == "t/1" and x["state"]:
            x["state"] = dict(x["state"], epoch=first)
        if x["p"] == "t/1" and x["ev"] == "commit_requested":
            x["epoch"] = first
    return out, k + 1


@on_eos
def stale_fence(lines: Trace) -> tuple[Trace, int]:
    """A commit request carrying a fence token older than its claim's."""
    out = copy.deepcopy(lines)
    k = _first_commit(out)
    out[k]["fence"] -= 1
    return out, k + 1


DOCTORED = [
    commit_beyond_watermark, skipped_offset, processed_backwards, stale_epoch_event,
    commit_hands_out_next, commit_forgets_finished_above, unsent_not_set, epoch_not_fresh,
    stale_fence,
]


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
    doctor: Doctor, traces: dict[str, Trace], tmp_path: Path
) -> None:
    lines, blamed = doctor(traces[mode_of(doctor)])
    report = tv.validate_trace(write(tmp_path / "t.jsonl", lines), tlc=False)
    assert not report.ok
    assert report.violations[0].line == blamed, report.summary()
    assert report.violations[0].check == "reference"


def test_reference_names_the_problem(traces: dict[str, Trace], tmp_path: Path) -> None:
    problems = {}
    for doctor in DOCTORED:
        lines, _ = doctor(traces[mode_of(doctor)])
        report = tv.validate_trace(write(tmp_path / f"{doctor.__name__}.jsonl", lines), tlc=False)
        problems[doctor.__name__] = report.violations[0].problem
    assert "beyond the watermark" in problems["commit_beyond_watermark"]
    assert "but the model has (6, 2," in problems["skipped_offset"]
    assert "processed went backwards" in problems["processed_backwards"]
    assert "succeeded needs Processing" in problems["stale_epoch_event"]
    assert "the watermark is" in problems["commit_hands_out_next"]
    assert "commit carries finished_above" in problems["commit_forgets_finished_above"]
    assert "recorded unsent False" in problems["unsent_not_set"]
    assert "recorded epoch" in problems["epoch_not_fresh"]
    assert "the claim got" in problems["stale_fence"]


def test_event_after_revoke_is_a_stale_effect(alo_trace: Trace, tmp_path: Path) -> None:
    lines = [*alo_trace, {"p": "t/0", "ev": "revoked", "off": None, "state": {}}]
    lines.append({"p": "t/0", "ev": "commit_acked", "off": 6, "state": {}})
    report = tv.validate_trace(write(tmp_path / "t.jsonl", lines), tlc=False)
    assert not report.ok and "does not hold" in report.violations[0].problem


def test_committed_backwards_across_assignments(alo_trace: Trace, tmp_path: Path) -> None:
    lines = [
        *alo_trace,
        {"p": "t/0", "ev": "revoked", "off": None, "state": {}},
        {"p": "t/0", "ev": "assign", "off": 3, "state": state(3, 3, 3, epoch=3)},
    ]
    report = tv.validate_trace(write(tmp_path / "t.jsonl", lines), tlc=False)
    assert not report.ok and "moved backwards" in report.violations[0].problem


def restart_with_finished_above(above: bool) -> Trace:
    """A second process: the sink stored 2 with 3 finished above it."""
    held = [3] if above else []
    s = state(2, 2, 2, above=held)
    assign: dict[str, Any] = {"p": "t/0", "ev": "assign", "off": 2, "state": s, "above": held}
    s4 = state(5, 2, 2, above=held)
    done = state(5, 5, 2, unsent=True)
    requested = state(5, 5, 2, requested=5)
    acked = state(5, 5, 5)
    return [
        assign,
        *({"p": "t/0", "ev": "fetched", "off": o, "state": s4} for o in (2, 3, 4)),
        *({"p": "t/0", "ev": "started", "off": o, "state": s4} for o in (2, 4)),
        *({"p": "t/0", "ev": "succeeded", "off": o, "state": done} for o in (2, 4)),
        {"p": "t/0", "ev": "commit_requested", "off": 5, "state": requested, "above": [],
         "epoch": 1},
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


def test_old_format_is_a_one_line_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = {"p": "t/0", "ev": "assign", "off": 0, "state": {"next": 0, "processed": 0,
                                                            "committed": 0}}
    path = write(tmp_path / "old.jsonl", [old])
    assert tv.main(["--no-tlc", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "line 1 is in the old format" in err and "record the trace again" in err
    assert "\n" not in err


def drive(core: TracingCore) -> None:
    """Two messages, out of order, one commit between them (exactly-once style)."""
    tp = ("t", 0)
    epoch = core.assign(tp, 0, [])
    core.fetched(tp, epoch, [0, 1], 2)
    core.started_many(tp, epoch, [0, 1])
    core.succeeded(tp, epoch, 1)
    commit = core.commit_requested(tp)
    if commit is not None:
        core.commit_acked(tp, epoch, commit.offset)
    core.succeeded(tp, epoch, 0)
    core.revoked(tp)


def handed_off_trace() -> Trace:
    """At-least-once with ``--retry-topic``: offset 0 fails with a backoff long
    enough for the retry topic, is handed off, and 1 succeeds; a commit of 2."""
    out = io.StringIO()
    core = TracingCore(
        out, RetryPolicy(base_delay=10.0, max_delay=10.0),
        retry_topic=RetryTopic(name="t.retry", min_delay=5.0),
    )
    tp = ("t", 0)
    epoch = core.assign(tp, 0, [])
    core.fetched(tp, epoch, [0, 1], 2)
    core.started_many(tp, epoch, [0, 1])
    decision = core.failed(tp, epoch, 0, FailureKind.RETRYABLE, now=0.0, jitter=0.5)
    assert isinstance(decision, HandOff)
    core.succeeded(tp, epoch, 1)
    assert core.handed_off(tp, epoch, 0)
    commit = core.commit_requested(tp)
    assert commit is not None and commit.offset == 2
    core.commit_acked(tp, epoch, commit.offset)
    return [json.loads(x) for x in out.getvalue().splitlines()]


def handed_off_unfailed() -> tuple[Trace, int]:
    """The hand-off line moved before the failure it finishes."""
    lines = handed_off_trace()
    k, j = index(lines, "t/0", "failed", 0), index(lines, "t/0", "handed_off", 0)
    return [*lines[:k], lines[j], *lines[k:j], *lines[j + 1 :]], k + 1


def test_a_hand_off_to_the_retry_topic_is_accepted() -> None:
    lines = handed_off_trace()
    assert [x["ev"] for x in lines].count("handed_off") == 1
    assert tv.validate_lines(lines).ok


def test_a_hand_off_of_an_offset_that_did_not_fail_is_rejected() -> None:
    lines, blamed = handed_off_unfailed()
    report = tv.validate_lines(lines)
    assert not report.ok and report.violations[0].line == blamed


def test_lines_in_memory_are_validated() -> None:
    out = io.StringIO()
    drive(TracingCore(out))
    lines = out.getvalue().splitlines()
    assert [json.loads(x)["ev"] for x in lines].count("commit_requested") == 2
    report = tv.validate_lines(lines, mode="exactly-once")
    assert report.ok, report.summary()
    assert tv.validate_lines([json.loads(x) for x in lines]).ok


def test_a_trace_cut_between_writes_is_whole_batches_and_valid() -> None:
    """A process killed while tracing loses what it had not written yet; the
    tracer writes each event's lines in one write, so every prefix of writes
    is whole batches, and each such prefix is a valid trace (cut mid-batch,
    the recorded state would be the whole batch's, which the model refuses)."""
    writes: list[str] = []

    class Recorder(io.StringIO):
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

    drive(TracingCore(Recorder()))
    assert len(writes[2].splitlines()) == 2  # the started_many of offsets 0 and 1
    for cut in range(1, len(writes) + 1):
        lines = "".join(writes[:cut]).splitlines()
        report = tv.validate_lines(lines, mode="exactly-once")
        assert report.ok, (cut, report.summary())


def stalled_trace(n: int) -> list[str]:
    """Offset 0 held while offsets 1..n-1 finish one at a time, then 0: every
    line from the second success on has the whole stalled run finished above."""
    out = io.StringIO()
    core = TracingCore(out)
    tp = ("t", 0)
    epoch = core.assign(tp, 0)
    core.fetched(tp, epoch, list(range(n)))
    core.started_many(tp, epoch, list(range(n)))
    for o in range(1, n):
        core.succeeded(tp, epoch, o)
    core.succeeded(tp, epoch, 0)
    assert core.commit_requested(tp) is not None
    return out.getvalue().splitlines()


def test_a_long_stall_keeps_every_line_short() -> None:
    """The finished run above a held offset is written as one [first, last]
    pair: a line's size does not grow with the stall (this trace's 9,002 lines:
    1.5 MB, none over 300 bytes; written in full, 25.7 MB with lines up to 17 KB)."""
    lines = stalled_trace(3000)
    assert json.loads(lines[-3])["state"]["finished_above"] == [[1, 2999]]
    assert max(len(x) for x in lines) < 300
    assert tv.validate_lines(lines, mode="exactly-once").ok


def expanded(line: str) -> str:
    """A trace line with its offset runs written out one by one (the older form)."""
    data = json.loads(line)
    for holder, key in ((data, "above"), (data["state"], "finished_above")):
        if key in holder:
            holder[key] = list(tv._offsets(holder[key], key))
    return json.dumps(data)


def test_a_long_trace_is_validated_in_memory_bounded_by_a_batch(tmp_path: Path) -> None:
    """validate_trace reads as it replays: a 7 MB trace in the older, expanded
    form (still read) peaked at 1.4 MB here; holding all its lines, 33 MB."""
    import tracemalloc

    path = tmp_path / "stall.jsonl"
    path.write_text("".join(expanded(x) + "\n" for x in stalled_trace(1500)))
    assert path.stat().st_size > 6_000_000
    tracemalloc.start()
    try:
        report = tv.validate_trace(path, tlc=False, mode="exactly-once")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.ok and report.lines == 1 + 1500 + 1500 + 1500 + 1, report.summary()
    assert peak < 12 * 2**20, peak


@given(st.sets(st.integers(min_value=0, max_value=200)))
def test_compact_offsets_read_back_as_written(offsets: set[int]) -> None:
    written = compact_offsets(sorted(offsets))
    assert tv._offsets(written, "x") == tuple(sorted(offsets))
    runs = [x for x in written if isinstance(x, list)]
    assert all(a < b for a, b in runs)
    assert len(written) == sum(1 for o in offsets if o - 1 not in offsets)


@pytest.mark.parametrize("bad", [[[3, 3]], [[5, 2]], [[1, 2, 3]], [[-1, 2]], [["a", 2]]])
def test_a_malformed_run_is_a_format_violation(bad: list[Any]) -> None:
    lines = stalled_trace(3)
    data = json.loads(lines[0])
    data["above"] = bad
    report = tv.validate_lines([json.dumps(data), *lines[1:]])
    assert not report.ok and report.violations[0].check == "format", report.summary()


def test_lines_in_memory_from_a_mutated_core_are_rejected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A core whose finishes do not set unsent: its own trace gives it away."""
    original = PartitionTracker.apply

    def apply(self: PartitionTracker, event: Event, offset: int) -> Any:
        unsent = self._unsent
        state = original(self, event, offset)
        self._unsent = unsent
        return state

    monkeypatch.setattr(PartitionTracker, "apply", apply)
    out = io.StringIO()
    drive(TracingCore(out))
    report = tv.validate_lines(out.getvalue().splitlines())
    assert not report.ok
    assert "recorded unsent False" in report.violations[0].problem


def driven() -> Trace:
    """The lines :func:`drive` makes a :class:`TracingCore` write."""
    out = io.StringIO()
    drive(TracingCore(out))
    return [json.loads(x) for x in out.getvalue().splitlines()]


def crash_and_restore() -> Trace:
    """One process whose core crashes and restores both partitions; t/0 comes
    back with offset 1 stored as finished above 0 (lines 11 and 12)."""
    out = io.StringIO()
    core = TracingCore(out)
    t0, t1 = ("t", 0), ("t", 1)
    epoch = core.assign(t0, 0, [])
    core.assign(t1, 0, [])
    core.fetched(t0, epoch, [0, 1], 2)
    core.started_many(t0, epoch, [0, 1])
    core.succeeded(t0, epoch, 1)
    commit = core.commit_requested(t0)
    assert commit is not None and commit.finished_above == (1,)
    core.crashed()
    core.restored(t0, 0, commit.finished_above)
    core.restored(t1, 0, [])
    return [json.loads(x) for x in out.getvalue().splitlines()]


def twice(lines: Trace, k: int, where: str) -> tuple[Trace, int]:
    """Line ``k`` (0-based) lists its first offset of ``where`` (``above``, or
    ``finished_above`` of the state) twice."""
    out = copy.deepcopy(lines)
    holder = out[k] if where == "above" else out[k]["state"]
    assert holder[where], f"line {k + 1} has no {where} to repeat"
    holder[where] = [holder[where][0], *holder[where]]
    return out, k + 1


def commit_lists_an_offset_twice() -> tuple[Trace, int]:
    """The commit of driven()'s line 7 carries finished_above [1, 1]."""
    return twice(driven(), 6, "above")


def state_lists_an_offset_twice() -> tuple[Trace, int]:
    """driven()'s line 6 records finished_above [1, 1]."""
    return twice(driven(), 5, "finished_above")


def assign_lists_an_offset_twice() -> tuple[Trace, int]:
    """The sink's held offsets [3] come as [3, 3]."""
    return twice(restart_with_finished_above(True), 0, "above")


def restored_with_a_wrong_above() -> tuple[Trace, int]:
    """The second partition of one restore claims offset 1 held above it (t/0's)."""
    out = crash_and_restore()
    out[-1]["above"] = [1]
    return out, len(out)


def restored_announced_twice() -> tuple[Trace, int]:
    """The second restored partition is assigned again, with a fresh epoch."""
    out = crash_and_restore()
    again = copy.deepcopy(out[-1])
    again["state"]["epoch"] += 1
    return [*out, again], len(out) + 1


def fetched_past_next() -> tuple[Trace, int]:
    """driven()'s batch fetched 0, 1 (next 2) also lists offset 2."""
    out = driven()
    k = index(out, "t/0", "fetched", 1)
    out.insert(k + 1, dict(copy.deepcopy(out[k]), off=2))
    return out, index(out, "t/0", "fetched", 0) + 1


SMALL_DOCTORED = [
    commit_lists_an_offset_twice, state_lists_an_offset_twice, assign_lists_an_offset_twice,
    fetched_past_next, restored_with_a_wrong_above, restored_announced_twice,
]


@pytest.mark.parametrize("doctor", SMALL_DOCTORED, ids=lambda f: f.__name__)
def test_small_doctored_trace_rejected_by_reference(
    doctor: Callable[[], tuple[Trace, int]],
) -> None:
    lines, blamed = doctor()
    report = tv.validate_lines(lines, mode="exactly-once")
    assert not report.ok and report.violations[0].line == blamed, report.summary()


def test_crash_and_restore_accepted_by_reference() -> None:
    report = tv.validate_lines(crash_and_restore(), mode="exactly-once")
    assert report.ok, report.summary()


def test_restart_with_held_offsets(tmp_path: Path) -> None:
    first, second = restart_traces(tmp_path)
    assert second[0]["above"] == [[2, 5]] and second[0]["fence"] > first[0]["fence"]
    for lines in (first, second):
        report = tv.validate_lines(lines, mode="exactly-once")
        assert report.ok, report.summary()


def test_restart_from_a_core_that_forgets_a_held_offset_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fetched keeps only held offsets strictly above the batch end (o > hi):
    the restarted run's trace gives it away at its first fetch."""
    original = PartitionTracker.fetched

    def fetched(self: PartitionTracker, offsets: Any, end: int | None = None) -> Any:
        run = original(self, offsets, end)
        self._skip.discard(self.next)
        return run

    monkeypatch.setattr(PartitionTracker, "fetched", fetched)
    report = tv.validate_lines(restart_traces(tmp_path)[1], mode="exactly-once")
    assert not report.ok
    assert report.violations[0].line == 2
    assert "recorded finished_above [3, 4, 5] but the model has [2, 3, 4, 5]" in (
        report.violations[0].problem
    )


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
    doctor: Doctor, traces: dict[str, Trace], tmp_path: Path
) -> None:
    lines, blamed = doctor(traces[mode_of(doctor)])
    parsed = tv.read_trace(write(tmp_path / "t.jsonl", lines))[0]
    verdict = tv.check_with_tlc(parsed, mode_of(doctor))
    assert not verdict.accepted
    assert tv._tlc_violation(parsed, verdict).line == blamed


@pytest.mark.formal
@pytest.mark.parametrize("doctor", SMALL_DOCTORED, ids=lambda f: f.__name__)
def test_small_doctored_trace_rejected_by_tlc(doctor: Callable[[], tuple[Trace, int]]) -> None:
    """An offset listed twice must not vanish into a TLA+ set; a restore
    announces each partition once, from the durable position."""
    lines, blamed = doctor()
    parsed = tv.parse_lines(lines)[0]
    verdict = tv.check_with_tlc(parsed, "exactly-once")
    assert not verdict.accepted
    assert tv._tlc_violation(parsed, verdict).line == blamed


@pytest.mark.formal
def test_a_hand_off_is_a_step_of_the_spec_for_tlc() -> None:
    good = tv.parse_lines(handed_off_trace())[0]
    assert tv.check_with_tlc(good, "at-least-once").accepted
    bad, blamed = handed_off_unfailed()
    parsed = tv.parse_lines(bad)[0]
    verdict = tv.check_with_tlc(parsed, "at-least-once")
    assert not verdict.accepted
    assert tv._tlc_violation(parsed, verdict).line == blamed


@pytest.mark.formal
def test_crash_and_restore_accepted_by_tlc() -> None:
    parsed = tv.parse_lines(crash_and_restore())[0]
    assert tv.check_with_tlc(parsed, "exactly-once").accepted


@pytest.mark.formal
def test_restart_with_held_offsets_by_tlc(tmp_path: Path) -> None:
    for lines in restart_traces(tmp_path):
        parsed = tv.parse_lines(lines)[0]
        assert tv.check_with_tlc(parsed, "exactly-once").accepted


@pytest.mark.formal
def test_finished_above_on_assign_by_tlc(tmp_path: Path) -> None:
    good = tv.read_trace(write(tmp_path / "a.jsonl", restart_with_finished_above(True)))[0]
    bad = tv.read_trace(write(tmp_path / "b.jsonl", restart_with_finished_above(False)))[0]
    assert tv.check_with_tlc(good, "exactly-once").accepted
    assert not tv.check_with_tlc(bad, "exactly-once").accepted
