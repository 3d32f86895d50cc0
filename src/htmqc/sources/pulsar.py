"""Apache Pulsar as a source: positions (the first part of the adapter; the
:class:`~htmqc.ports.ConsumerPort` over it is not written yet).

Theory of operation
-------------------
*What maps to what.* A htmqc "topic" ``T`` with ``N`` partitions is the partitioned
Pulsar topic ``persistent://public/default/T`` (or ``persistent://TENANT/NS/T``), whose
partition ``p`` is the topic ``T-partition-p`` (:func:`partition_topic`).

*Offsets.* The core needs dense, 0-based offsets, increasing per partition. A Pulsar
message id ``(ledgerId, entryId, batchIndex)`` is ordered per partition (a partition's
ledgers are created one after another with growing ids, entries grow by one within a
ledger, batch indexes within an entry) but is not dense: ledger ids are shared by every
topic of the cluster and entry ids restart at 0 in each new ledger. Numbering messages
with a counter kept by the adapter is not safe either: the counter's origin is lost on a
restart, and a re-read after a reconnect or a seek would shift it.

The broker gives the dense numbering itself when its ``brokerEntryMetadataInterceptors``
include ``AppendIndexMetadataInterceptor`` (as :mod:`htmqc.sources.pulsar_server` sets
up): every entry written to a partition carries, in its broker metadata, the ``index``
of its *last* message, counting messages (a batch of ``k`` adds ``k``) from 0 per
partition; it is written with the entry, so it survives restarts, ledger roll-overs and
the trimming of old ledgers. So a message's **offset** is

    ``offset = index - (messages in its entry - 1) + max(batchIndex, 0)``

(:func:`message_offset`), dense as written and increasing in delivery order. Entries a
reader never sees (transaction markers, aborted transactions' messages) leave holes,
which the core treats as gaps, as it treats Kafka's transaction markers.

*Reading the index.* ``pulsar-client`` (Python, 3.x) does not hand out the broker
metadata of a message (the C++ client's ``Message::getIndex`` is not bound), so the
index is read from the admin API (``GET .../ledger/L/entry/E``, header
``X-Pulsar-Broker-Entry-METADATA-index``) only where it cannot be derived:
:class:`OffsetMapper` looks one entry up at a partition's first message and after every
jump (a new ledger, or entry ids that do not follow each other), and inside a run of
consecutive entries of one ledger derives it exactly, since nothing lies between two
consecutive entries: the first offset of entry ``E+1`` is the first offset of ``E``
plus the number of ``E``'s messages (all of them delivered before any of ``E+1``'s).
One admin call per ledger (50,000 entries by default) and per start or seek.

*Seeking* an offset (a rollback, a claim from an exactly-once sink) needs the reverse:
:meth:`PulsarAdmin.locate` finds the message id of an offset by a binary search over the
partition's entries (their ledgers from ``internalStats``), about ``log2(entries)``
admin calls.

Every offset *decision* stays in the core: this module converts message ids to offsets
and back.

Not written yet (the consumer, in the shape of :mod:`htmqc.sources.nats`)
--------------------------------------------------------------------------
* Fetching: one non-durable reader per assigned partition (``create_reader`` at the
  located id, ``start_message_id_inclusive``), recreated on ``seek``; a redelivered id
  at or below the last one handed out is dropped before :class:`OffsetMapper` sees it.
  A durable subscription's ``seek`` would move the group's cursor, so it is not the
  fetch cursor.
* At-least-once commits: a cumulative ack, on a durable ``Failover`` subscription
  named after the group, of the message at ``offset - 1`` (located); the commit's
  metadata (work finished above the watermark) has no place in an ack, so it needs a
  store of its own (as NATS's KV bucket: e.g. a compacted topic ``GROUP.T`` keyed by
  partition), and ``committed`` reads the offset back from it, not from the cursor.
  ``pulsar-client``'s acks are not confirmed: ``commit_acked`` must wait for the
  store's write, not for the ack.
* Exactly-once: positions from the SQL sink (its claim, then ``seek``), as for NATS;
  ``pulsar-client`` (Python) has no transaction API.
* Group membership: a ``Failover`` subscription gives each partition one active
  consumer; ``on_assign``/``on_revoke`` have no Python callbacks for its changes.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from htmqc.errors import RuntimeFailure

#: The admin API's header of an entry's broker-metadata index (its last message's).
INDEX_HEADER = "X-Pulsar-Broker-Entry-METADATA-index"
#: The admin API's header of the number of messages in a batch entry (absent: one).
BATCH_HEADER = "X-Pulsar-num-batch-message"
DEFAULT_NAMESPACE = "public/default"


def topic_path(topic: str) -> str:
    """``TENANT/NS/NAME`` of a topic named ``NAME``, ``TENANT/NS/NAME`` or
    ``persistent://TENANT/NS/NAME`` (``public/default`` when not said)."""
    name = topic.removeprefix("persistent://")
    return name if name.count("/") == 2 else f"{DEFAULT_NAMESPACE}/{name}"


def partition_topic(topic: str, partition: int) -> str:
    """The full name of ``topic``'s ``partition``: ``persistent://TENANT/NS/NAME-partition-P``."""
    return f"persistent://{topic_path(topic)}-partition-{partition}"


def message_offset(index: int, messages: int, batch_index: int) -> int:
    """The offset of the message at ``batch_index`` (``-1``: not batched) of an entry
    holding ``messages`` messages whose broker-metadata index is ``index``."""
    return index - (messages - 1) + max(batch_index, 0)


@dataclass(frozen=True)
class Entry:
    """An entry's ``index`` (of its last message) and its number of ``messages``."""

    index: int
    messages: int

    @property
    def first(self) -> int:
        """The offset of the entry's first message."""
        return self.index - self.messages + 1


EntryLookup = Callable[[int, int], Entry]
"""``lookup(ledger_id, entry_id)``: the entry's index (one admin call)."""


class OffsetMapper:
    """A partition's offsets of the messages read from it, in delivery order.

    ``lookup`` answers an entry's index (:meth:`PulsarAdmin.entry`); it is called for
    the first message, and for a message whose entry does not directly follow the
    previous one in the same ledger, or follows one whose messages were not all seen
    from its first (module docs). Messages must come in id order without repeats (the
    adapter drops a redelivered id at or below the last one it handed out).
    :meth:`reset` after a seek: the next message is looked up again.
    """

    def __init__(self, lookup: EntryLookup) -> None:
        self.lookup = lookup
        #: Admin calls made (one per jump; tests and metrics read it).
        self.lookups = 0
        self._last: tuple[int, int] | None = None  # (ledger, entry) of the last message
        self._first = 0  # the offset of that entry's first message
        self._count: int | None = None  # its message count, when looked up
        self._whole = False  # its first message was the first one seen of it
        self._seen = 0  # its messages seen

    def reset(self) -> None:
        """Forget the last entry: the next message is looked up."""
        self._last = None

    def _next_first(self) -> int | None:
        """The first offset of the entry after the last one, if known exactly."""
        if self._count is not None:
            return self._first + self._count
        return self._first + self._seen if self._whole else None

    def offset(self, ledger: int, entry: int, batch_index: int) -> int:
        """The offset of message ``(ledger, entry, batch_index)`` (``-1``: not batched)."""
        here = (ledger, entry)
        at = max(batch_index, 0)
        if self._last == here:
            self._seen += 1  # another message of the same entry: its batch index says where
            return self._first + at
        following = self._last == (ledger, entry - 1)
        derived = self._next_first() if following else None
        if derived is None:
            self.lookups += 1
            found = self.lookup(ledger, entry)
            self._first, self._count = found.first, found.messages
        else:
            self._first, self._count = derived, None  # nothing lies between the two
        self._last = here
        self._whole = at == 0
        self._seen = 1
        return self._first + at


class PulsarAdmin:
    """The admin (HTTP) calls the offset mapping needs: an entry's index, a
    partition's watermarks, the message id of an offset."""

    def __init__(self, admin_url: str, timeout: float = 10.0) -> None:
        self.admin_url = admin_url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str) -> tuple[bytes, dict[str, str]]:
        url = f"{self.admin_url}/admin/v2/persistent/{urllib.parse.quote(path)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as answer:
                return answer.read(), dict(answer.headers.items())
        except urllib.error.HTTPError as exc:
            raise RuntimeFailure(
                f"Pulsar admin GET {path} answered {exc.code}",
                "check the topic and that the broker appends the index "
                "(brokerEntryMetadataInterceptors=...AppendIndexMetadataInterceptor)",
            ) from exc
        except OSError as exc:
            raise RuntimeFailure(
                f"cannot reach Pulsar's admin API at {self.admin_url}: {exc}",
                "check --pulsar-admin and that the broker runs",
            ) from exc

    def entry(self, topic: str, partition: int, ledger: int, entry: int) -> Entry:
        """The broker-metadata index and message count of one entry.

        :raises RuntimeFailure: no such entry, or the broker appends no index."""
        name = f"{topic_path(topic)}-partition-{partition}"
        _body, headers = self._get(f"{name}/ledger/{ledger}/entry/{entry}")
        found = {k.lower(): v for k, v in headers.items()}
        if INDEX_HEADER.lower() not in found:
            raise RuntimeFailure(
                f"Pulsar gives no broker-entry index for {name} {ledger}:{entry}",
                "set brokerEntryMetadataInterceptors="
                "org.apache.pulsar.common.intercept.AppendIndexMetadataInterceptor and "
                "exposingBrokerEntryMetadataToClientEnabled=true on the broker",
            )
        return Entry(int(found[INDEX_HEADER.lower()]), int(found.get(BATCH_HEADER.lower(), 1)))

    def ledgers(self, topic: str, partition: int) -> list[tuple[int, int]]:
        """``(ledger id, entries)`` of the partition's ledgers that hold entries, oldest
        first (the open ledger's count from ``currentLedgerEntries``)."""
        body, _headers = self._get(f"{topic_path(topic)}-partition-{partition}/internalStats")
        stats = json.loads(body)
        ledgers = stats.get("ledgers") or []
        out = []
        for i, ledger in enumerate(ledgers):
            count = int(ledger.get("entries") or 0)
            if i == len(ledgers) - 1 and stats.get("state") == "LedgerOpened":
                count = int(stats.get("currentLedgerEntries") or 0)
            if count > 0:
                out.append((int(ledger["ledgerId"]), count))
        return out

    def _nth(self, ledgers: list[tuple[int, int]], n: int) -> tuple[int, int]:
        for ledger, count in ledgers:
            if n < count:
                return ledger, n
            n -= count
        raise IndexError(n)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """``(low, high)``: the first stored offset and one past the last (``(0, 0)``
        for a partition that holds no entry)."""
        ledgers = self.ledgers(topic, partition)
        if not ledgers:
            return 0, 0
        total = sum(count for _ledger, count in ledgers)
        first = self.entry(topic, partition, *self._nth(ledgers, 0))
        last = self.entry(topic, partition, *self._nth(ledgers, total - 1))
        return first.first, last.index + 1

    def locate(self, topic: str, partition: int, offset: int) -> tuple[int, int, int] | None:
        """``(ledger, entry, batch index)`` of the message at ``offset`` (batch index
        ``-1`` when its entry is not a batch; the entry's first message when the offset
        falls in a hole), or ``None`` when no stored message is at or above it.
        A binary search: about ``log2(entries)`` admin calls."""
        ledgers = self.ledgers(topic, partition)
        lo, hi = 0, sum(count for _ledger, count in ledgers)
        found: tuple[int, int, Entry] | None = None
        while lo < hi:  # the first entry whose last message is at or above offset
            mid = (lo + hi) // 2
            ledger, entry = self._nth(ledgers, mid)
            got = self.entry(topic, partition, ledger, entry)
            if got.index >= offset:
                found = (ledger, entry, got)
                hi = mid
            else:
                lo = mid + 1
        if found is None:
            return None
        ledger, entry, got = found
        if offset < got.first:
            return ledger, entry, 0 if got.messages > 1 else -1
        return ledger, entry, (offset - got.first) if got.messages > 1 else -1
