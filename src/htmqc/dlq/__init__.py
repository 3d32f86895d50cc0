"""Dead letters: what a dead-lettered record carries, and tools to read and redrive them.

* :mod:`htmqc.dlq.record`: :class:`DeadLetterInfo`, the DLQ topic names;
* :mod:`htmqc.dlq.headers`: the ``htmqc-dlq-*`` headers of a DLQ record
  (:func:`dlq_headers`, and the strict :func:`parse_headers`);
* :mod:`htmqc.dlq.table`: the SQL dead-letter table;
* :mod:`htmqc.dlq.kafka_source`, :mod:`htmqc.dlq.sql_source`: ``htmqc dlq``'s
  list, show and redrive on each store (:mod:`htmqc.dlq.entries`: the common
  entry and filters).
"""

from htmqc.dlq.headers import REDRIVE_OF, DlqRecordMeta, dlq_headers, parse_headers
from htmqc.dlq.record import DLQ_KINDS, DeadLetterInfo, dlq_topic, poison_topic

__all__ = [
    "DLQ_KINDS",
    "REDRIVE_OF",
    "DeadLetterInfo",
    "DlqRecordMeta",
    "dlq_headers",
    "dlq_topic",
    "parse_headers",
    "poison_topic",
]
