"""The CI-size chaos run on the three-node Kafka cluster (issue 17, item 5):
4,000 messages, 4 partitions, 2 consumers per sink, exactly-once into
PostgreSQL and Kafka->Kafka at once, with three broker faults (SIGKILL of a
partition leader, of the transaction coordinator of a Kafka-sink consumer, of
the active controller; each restarted, the replicas back in sync before the
next) between consumer kills and transient sink errors. The audit of each
sink must be clean (nothing lost or duplicated, no order violation, no
backward commit, no aborted output read), every broker fault must have hit the
node its role names, every trace must validate. The JSON report goes to the
test's temporary directory and its summary is printed.

In the long tier (``kafka_full``: ``make test-kafka``), not ``make test``: in
3 of 6 runs of this shape or of it with ``net-reset`` for ``sink-error`` (seed
3 twice, seed 5 once) the Kafka-sink consumers stayed blocked
in librdkafka 2.16's ``send_offsets_to_transaction`` past its timeout after a
broker fault (py-spy: ``KafkaTransaction.commit``; librdkafka issues 5456 and
5511, fix pending), the Kafka pipeline stalled and this test failed, as it
should, with "not completed". It stays red-able; it is kept out of the default
suite until the sink bounds that call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from htmqc.chaos.harness import ChaosConfig, run_chaos
from htmqc.chaos.schedule import BROKER_KINDS
from htmqc.errors import HtmqcError
from htmqc.kafka_cluster import java_binary, kafka_libs
from tests.services import missing, postgres_url

pytestmark = [pytest.mark.broker, pytest.mark.kafka, pytest.mark.kafka_full, pytest.mark.slow]

KINDS = (
    "kill",
    "sink-error",
    "broker-kill-leader",
    "broker-kill-coordinator",
    "broker-kill-controller",
)
MESSAGES = 4000


def test_ci_size_chaos_run_on_the_cluster(tmp_path: Path) -> None:
    try:
        java_binary()
        kafka_libs()
    except HtmqcError as exc:
        missing(exc.problem)
    config = ChaosConfig(
        broker="kafka-cluster",
        sinks=("postgresql", "kafka"),
        seed=3,
        partitions=4,
        consumers=2,
        messages=MESSAGES,
        faults=6,
        kinds=KINDS,
        pg_url=postgres_url(),
        produce_seconds=20.0,
        timeout=400.0,
        trace_dir=tmp_path / "traces",
        work_dir=tmp_path / "work",
        progress=False,
    )
    result = run_chaos(config)
    (tmp_path / "report.json").write_text(json.dumps(result.to_json(), indent=2))
    print(result.summary())
    broker = [i for i in result.injected if i["kind"] in BROKER_KINDS]
    assert sorted(i["kind"] for i in broker) == sorted(KINDS[2:]), result.summary()
    assert not result.broker_errors, result.summary()
    for record in broker:
        assert record["node"] in (1, 2, 3) and "t_end" in record, record
    coordinator = next(i for i in broker if i["kind"] == "broker-kill-coordinator")
    assert coordinator["role"].startswith("transaction coordinator of htmqc-"), coordinator
    assert result.completed, result.summary()
    for pipeline in result.pipelines:
        counts = pipeline.audit.counts
        assert counts["lost"] == 0 and counts["duplicate"] == 0, pipeline.summary()
        assert counts["order-violation"] == 0, pipeline.summary()
        assert all(f.count == 0 for f in pipeline.findings.values()), pipeline.summary()
        assert pipeline.audit.totals["effects"] + pipeline.audit.totals["dlq"] == MESSAGES
    assert result.ok, result.summary()
    assert result.traces and all(t["ok"] for t in result.traces)
