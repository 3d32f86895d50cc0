"""Dead letters: what a dead-lettered record carries, and tools to read and redrive them."""

from htmqc.dlq.record import DLQ_KINDS, DeadLetterInfo, dlq_topic, poison_topic

__all__ = ["DLQ_KINDS", "DeadLetterInfo", "dlq_topic", "poison_topic"]
