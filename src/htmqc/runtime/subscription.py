"""What ``--topic`` subscribes to: one topic, a comma-separated list, or a pattern.

librdkafka's convention: a subscription entry that starts with ``^`` is a
regular expression, matched against every topic of the cluster as the
metadata refreshes (``topic.metadata.refresh.interval.ms``), so topics created
later join the subscription. ``--topic orders`` and ``--topic orders,refunds``
name topics; ``--topic '^orders\\..*'`` is a pattern (one, on its own).

htmqc writes to topics named after the ones it reads (``<topic>.dlq``,
``<topic>.dlq.poison``, ``<topic>.retry``). A pattern may match those too: a
consumer that read its own dead letters would dead-letter them again, for
ever. So partitions of topics with those suffixes are never taken from a
pattern: the group may assign them to this member, which leaves them unread
(:meth:`Subscription.wants`). Listed topics are taken as given.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from htmqc.dlq.record import dlq_topic, poison_topic
from htmqc.errors import UsageError
from htmqc.runtime.retry_topic import retry_topic

#: The suffixes of the topics htmqc writes next to a source topic.
DERIVED_SUFFIXES = tuple(name("") for name in (dlq_topic, poison_topic, retry_topic))


@dataclass(frozen=True, slots=True)
class Subscription:
    """``topics``: the listed names in order, or the one pattern (``pattern``)."""

    topics: tuple[str, ...]
    pattern: bool = False

    @classmethod
    def parse(cls, text: str) -> Subscription:
        """The subscription ``--topic`` gives.

        :raises UsageError: an empty name, a name twice, a pattern beside other
            entries, or a pattern that is not a valid regular expression.
        """
        entries = [part.strip() for part in text.split(",")]
        if not all(entries):
            raise UsageError(f"--topic {text!r} has an empty topic name",
                             "give names separated by commas, e.g. --topic orders,refunds")
        if any(e.startswith("^") for e in entries):
            if len(entries) > 1:
                raise UsageError(f"--topic {text!r} mixes a pattern with other entries",
                                 "give one pattern (^...) or a list of names, not both")
            try:
                re.compile(entries[0])
            except re.error as exc:
                raise UsageError(f"--topic pattern {entries[0]!r} is not a regular "
                                 f"expression: {exc}", "fix the pattern") from None
            return cls((entries[0],), pattern=True)
        twice = sorted({e for e in entries if entries.count(e) > 1})
        if twice:
            raise UsageError(f"--topic names {twice[0]!r} twice", "list each topic once")
        return cls(tuple(entries))

    @classmethod
    def of(cls, topic: str, with_retry_topic: bool) -> Subscription:
        """:meth:`parse`, and retry topics only for listed topics (each its own,
        :meth:`retry_topics`).

        :raises UsageError: as :meth:`parse`; or ``with_retry_topic`` (``--retry-topic``)
            with a pattern (its topics, and so their retry topics, are not known in
            advance), or with a listed topic that is another listed topic's retry topic.
        """
        subscription = cls.parse(topic)
        if with_retry_topic and subscription.pattern:
            raise UsageError(
                f"--retry-topic needs the source topics listed, not the pattern --topic {topic!r}",
                "list the topics (--topic a,b) with --retry-topic, or drop --retry-topic",
            )
        if with_retry_topic:
            clash = sorted(set(subscription.retry_topics().values()) & set(subscription.topics))
            if clash:
                raise UsageError(
                    f"--topic lists {clash[0]!r}, the retry topic of "
                    f"{clash[0].removesuffix(retry_topic(''))!r}",
                    "list only the source topics: their retry topics are read too",
                )
        return subscription

    def retry_topics(self) -> dict[str, str]:
        """Each listed topic's retry topic (``--retry-topic``), in order."""
        return {t: retry_topic(t) for t in self.topics}

    @property
    def single(self) -> str | None:
        """The topic when exactly one is listed (no pattern); else ``None``."""
        return self.topics[0] if len(self.topics) == 1 and not self.pattern else None

    def wants(self, topic: str) -> bool:
        """Whether partitions of ``topic`` are read (module docs): any listed
        topic; from a pattern, any topic not named like htmqc's own."""
        if self.pattern:
            return not topic.endswith(DERIVED_SUFFIXES)
        return topic in self.topics

    def __str__(self) -> str:
        return ",".join(self.topics)


def join_topics(names: str | Sequence[str], option: str = "topics") -> str:
    """``--topic``'s text for the library API's ``topics=[...]`` (or ``topic=[...]``):
    the names joined with commas; a string is taken as it is (``"orders,refunds"``).
    What the text then means (a name twice, a pattern beside names) is
    :meth:`Subscription.parse`'s to check.

    :raises UsageError: ``names`` is not a string, list or tuple; it is empty; an
        element is not a string, is blank, or holds a comma (Kafka topic names
        cannot, and the list would silently read other topics).
    """
    if isinstance(names, str):
        return names
    if not isinstance(names, (list, tuple)):
        raise UsageError(
            f"{option}= must be a topic name or a list of them, got a {type(names).__name__}",
            f'pass e.g. {option}=["orders", "refunds"]',
        )
    if not names:
        raise UsageError(f"{option}= is an empty list", "name at least one topic")
    for name in names:
        if not isinstance(name, str):
            raise UsageError(
                f"{option}= lists {name!r}, a {type(name).__name__}, not a topic name",
                "list topic names as strings",
            )
        if not name.strip():
            raise UsageError(f"{option}= lists an empty topic name", "drop it from the list")
        if "," in name:
            raise UsageError(
                f"{option}= lists {name!r}, which holds a comma",
                "list each topic as its own element (a pattern cannot hold a comma)",
            )
    return ",".join(name.strip() for name in names)
