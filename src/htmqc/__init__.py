"""htmqc: a formally specified, exactly-once Kafka consumer runtime for Python."""

from htmqc.core import (
    Commit,
    ConsumerCore,
    CoreError,
    DeadLetter,
    FailureKind,
    IllegalTransition,
    MessageState,
    RetryAt,
    RetryPolicy,
)

__version__ = "0.1.0"

__all__ = [
    "Commit",
    "ConsumerCore",
    "CoreError",
    "DeadLetter",
    "FailureKind",
    "IllegalTransition",
    "MessageState",
    "RetryAt",
    "RetryPolicy",
    "__version__",
]
