"""htmqc: a formally specified, exactly-once Kafka consumer runtime for Python."""

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from htmqc.api import Consumer
    from htmqc.ports import AsyncSqlTx, KafkaTx, Message, SqlTx
    from htmqc.runtime.decode import DecodedMessage, DecodeError


def __getattr__(name: str) -> Any:
    """``htmqc.Consumer``, ``htmqc.Message``, ``htmqc.SqlTx``, ``htmqc.AsyncSqlTx``,
    ``htmqc.KafkaTx``,
    ``htmqc.DecodedMessage`` and ``htmqc.DecodeError``, imported when first used
    (the runtime and confluent-kafka are not loaded by ``import htmqc``)."""
    if name == "Consumer":
        from htmqc.api import Consumer

        return Consumer
    if name in ("Message", "SqlTx", "AsyncSqlTx", "KafkaTx"):
        from htmqc import ports

        return getattr(ports, name)
    if name in ("DecodedMessage", "DecodeError"):
        from htmqc.runtime import decode

        return getattr(decode, name)
    raise AttributeError(f"module 'htmqc' has no attribute {name!r}")


__all__ = [
    "AsyncSqlTx",
    "Commit",
    "Consumer",
    "ConsumerCore",
    "CoreError",
    "DeadLetter",
    "DecodeError",
    "DecodedMessage",
    "FailureKind",
    "IllegalTransition",
    "KafkaTx",
    "Message",
    "MessageState",
    "Permanent",
    "RetryAt",
    "RetryPolicy",
    "Retryable",
    "SqlTx",
    "__version__",
    "classify",
]
