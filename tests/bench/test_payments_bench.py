"""The payments benchmark measures only runs that stored every event once, and
places its p99s in the same histogram buckets for the loop and for htmqc."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import payments_bench
from benchmarks.payments_bench import bucket_p99, histogram_p99
from htmqc.observe.metrics import LATENCY_BUCKETS
from tests.services import postgres_url


def test_both_p99s_name_the_same_bucket() -> None:
    latencies = [0.0004] * 98 + [0.003, 0.2]
    cumulative = [sum(v <= b for v in latencies) for b in LATENCY_BUCKETS]
    assert bucket_p99(latencies) == histogram_p99(cumulative, len(latencies)) == 0.005


@pytest.mark.slow
@pytest.mark.broker
def test_a_small_run_checks_every_effect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sink = postgres_url().rsplit("/", 1)[0] + "/htmqc_bench_payments_test"
    out = tmp_path / "payments.json"
    assert payments_bench.main(["--count", "300", "--rounds", "1", "--sink", sink,
                                "--contenders", "hand_loop,htmqc_batch", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert set(results["medians"]) == {"hand_loop", "htmqc_batch"}
    assert results["ratios"]["batch_vs_hand_loop"] > 0

    # A run that stores an event twice does not count: the check refuses it.
    real = payments_bench.hand_loop

    def doubled(*args: object, **kwargs: object) -> dict[str, float]:
        run = real(*args, **kwargs)  # type: ignore[arg-type]
        import psycopg

        with psycopg.connect(sink, autocommit=True) as db:
            db.execute("INSERT INTO ledger SELECT * FROM ledger LIMIT 1")
        return run

    monkeypatch.setattr(payments_bench, "hand_loop", doubled)
    with pytest.raises(AssertionError, match="effects"):
        payments_bench.main(["--count", "300", "--rounds", "1", "--sink", sink,
                             "--contenders", "hand_loop", "--out", str(out)])
