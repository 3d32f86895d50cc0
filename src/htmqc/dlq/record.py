"""The facts a dead letter carries (one value, built by the engine).

The engine builds a :class:`DeadLetterInfo` when the core answers
:class:`~htmqc.core.DeadLetter` (or the poison detector fires, or a message is
over the size limit) and hands it to the delivery, which writes it as Kafka
headers (at-least-once, Kafka->Kafka) or as a row of the SQL dead-letter table
(exactly-once into a database). Where it goes:

* ``kind == "poison"`` -> ``<topic>.dlq.poison``;
* every other kind -> ``<topic>.dlq``.

Nothing here may carry a secret: error messages and stacks are the handler's own
text, passed through :func:`htmqc.config.scrub` by the delivery before writing.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Why a message was dead-lettered. ``failed``: retries used up; ``permanent``:
#: the handler raised :class:`~htmqc.Permanent` (or a type mapped to it);
#: ``poison``: too many failures in too short a time (or it killed its worker);
#: ``too_large``: the value is above ``--max-message-bytes``.
DLQ_KINDS = ("failed", "permanent", "poison", "too_large")


def dlq_topic(topic: str) -> str:
    """The dead-letter topic of ``topic``."""
    return f"{topic}.dlq"


def poison_topic(topic: str) -> str:
    """The poison dead-letter topic of ``topic``."""
    return f"{topic}.dlq.poison"


def retry_topic(topic: str) -> str:
    """The retry topic of ``topic`` (``--retry-topic``, :mod:`htmqc.runtime.retry_topic`);
    here beside the dead-letter topics, so that the source adapters can name it too."""
    return f"{topic}.retry"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetterInfo:
    """Why and when a message ended in the DLQ (see module docs).

    ``retries``: handler attempts that failed before this decision minus one
    (0 when it was dead-lettered on its first failure). Times are unix seconds.
    """

    kind: str
    error_class: str
    error_message: str
    stack: str
    retries: int
    first_failure_at: float
    last_failure_at: float
    group: str

    def __post_init__(self) -> None:
        if self.kind not in DLQ_KINDS:
            raise ValueError(f"unknown dead-letter kind {self.kind!r}; one of {DLQ_KINDS}")

    @property
    def reason(self) -> str:
        """One line: ``kind: ErrorClass: message`` (cut at 1000 characters)."""
        first = self.error_message.splitlines()[0] if self.error_message else ""
        return f"{self.kind}: {self.error_class}: {first}"[:1000]

    def target(self, topic: str) -> str:
        """The DLQ topic this dead letter goes to."""
        return poison_topic(topic) if self.kind == "poison" else dlq_topic(topic)
