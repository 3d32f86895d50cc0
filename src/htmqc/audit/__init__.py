"""The audit checker: did a run deliver every produced message exactly once?

:func:`htmqc.audit.check.audit` compares what was produced with what the sink
stored (plus the dead-letter queue, the committed-offset history and the ids of
aborted transactions) and reports anomalies named after Jepsen's Kafka
workload. :mod:`htmqc.audit.load` reads the inputs from JSON-lines files and
SQLite; :mod:`htmqc.spark.audit_job` computes the same report with Spark.
"""

from htmqc.audit.check import audit
from htmqc.audit.model import (
    ANOMALIES,
    AuditReport,
    CommitObservation,
    DlqEntry,
    Effect,
    Produced,
)

__all__ = [
    "ANOMALIES",
    "AuditReport",
    "CommitObservation",
    "DlqEntry",
    "Effect",
    "Produced",
    "audit",
]
