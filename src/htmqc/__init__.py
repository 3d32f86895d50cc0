"""htmqc: a formally specified, exactly-once Kafka consumer runtime for Python."""

from htmqc.core import (
    Commit,
    ConsumerCore,
    CoreError,
    DeadLetter,
    FailureKind,
    IllegalTransition,
    MessageState,
    Permanent,
    Retryable,
    RetryAt,
    RetryPolicy,
    classify,
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
    "Permanent",
    "RetryAt",
    "RetryPolicy",
    "Retryable",
    "__version__",
    "classify",
]
