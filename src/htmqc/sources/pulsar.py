"""Apache Pulsar as a source: :class:`PulsarConsumer` implements
:class:`~htmqc.ports.ConsumerPort` (through :class:`~htmqc.sources.pumped.PumpedConsumer`,
as the NATS and RabbitMQ adapters do), so the same core and runtime drive it; the
positions under it are :class:`OffsetMapper` and :class:`PulsarAdmin`.

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

*Fetching.* Each assigned, unpaused partition has a pump (a *session*,
:meth:`PulsarConsumer._session`) that owns one **non-durable reader** of the partition
topic, created at the message id :meth:`PulsarAdmin.read_start` answers for the
partition's position (``start_message_id_inclusive``; past the last stored message, at
the last entry, whose messages below the position are dropped; on a partition with no
entry, at the earliest; both from one read of the partition's ledgers, which may grow
meanwhile). Reads of up to ``fetch_batch`` messages go into a bounded buffer (the
first waits :data:`READ_WAIT_MS`, the rest take what the reader holds); a full buffer or
a pause stops reading. ``seek`` (and a new assignment) ends the session: its reader is
closed and a new one starts at the new position. A durable subscription's ``seek``
would move the group's cursor, so it is not the fetch cursor. A message id at or below
the last one a session took is dropped before :class:`OffsetMapper` sees it (a reader
may deliver again after a reconnect), and so is a message below the session's start.
pulsar-client is synchronous (its C++ client runs its own threads): its calls and the
admin API's run on a thread pool the asyncio thread awaits, so the shared port
(generations, buffers, lease gate, ordered commits) is :class:`PumpedConsumer`'s
unchanged.

*Commits (at-least-once).* A commit is one message ``{"partition", "offset",
"metadata"}`` keyed by the partition, sent to the non-partitioned **commit topic**
``htmqc.offsets.GROUP.T`` in ``T``'s namespace (:func:`commits_topic`; created on first
use, with a compaction threshold of :data:`COMMITS_COMPACTION` bytes as a topic policy,
so the broker keeps the last commit per key). The core hears ``commit_acked`` only once
the broker confirmed the send (persisted to the bookies), in the order the commits were
asked for. ``committed`` reads the topic's compacted view to its end (the last message
per partition wins), so the metadata (work finished above the watermark) survives a
restart, as NATS's KV bucket keeps it. Not cumulative acks: ``pulsar-client``'s acks are
not confirmed, and an ack has no room for the metadata.

*Exactly-once.* Positions come from the SQL sink (its claim, then ``seek``), as with
Kafka, NATS and RabbitMQ; the commit topic is not used. ``pulsar-client`` (Python) has
no transaction API, so no ``kafka:``-like sink exists for Pulsar.

*Group membership.* ``?subscription=`` on ``--bootstrap`` says how the group's members
share the topic. ``exclusive`` (the default, Pulsar's own default subscription type):
one member consumes every partition; it holds the **lease**, the durable ``Exclusive``
subscription named after the group on the empty topic ``htmqc.lease.GROUP.T`` in
``T``'s namespace (:func:`lease_topic`; :meth:`PulsarConsumer._hold_exclusive`, on a
client connection of its own whose C++ log is discarded). Nothing is published there,
so the subscription holds no backlog; a subscription on ``T`` itself would keep every
message of ``T`` unacknowledged. A second member is refused it (``ConsumerBusy``) and
waits as a standby, subscribing again every :data:`STANDBY_POLL` s; the broker drops an
exclusive consumer with its connection, so ``close``, a crash and a SIGKILL hand over at
once. Once held, ``on_assign`` gets every partition, inside a ``consume``; nothing is
ever revoked. The lease is checked every :data:`LEASE_CHECK` s: while its subscription
is not connected (a topic unload, a broker restart, a network cut) another member may
take it, so nothing is handed out; the client reconnects it by itself, which it cannot
while another member holds it, and a lease not connected again within
:data:`LEASE_GRACE` s is lost: the member stops (``consume`` raises).
``failover``: the broker spreads the partitions over the members, through a
``Failover`` subscription on the partitioned topic ``htmqc.members.GROUP.T``
(:func:`members_topic`; :meth:`PulsarConsumer._hold_share`): partitions move to a
member that joins (revoked by their holder, which then publishes a release the new
holder waits for) and from one that leaves, as :mod:`htmqc.sources.pulsar_members`
explains; in doubt (the subscription disconnected, the owners unreadable) nothing is
handed out, and after :data:`LEASE_GRACE` s the member stops.
Exactly-once, the sink's fence is what makes a stale member harmless.

Every offset *decision* stays in the core: this module converts message ids to offsets
and back, keeps each partition's fetch position and stores the commits it is given.

Keys and headers: the partition key is the key (an empty key reads as none); the
message properties are the headers, as ``(name, bytes)``.

Not done
--------
* Sharing (``failover``) learns of a partition's move by reading the admin API every
  :data:`~htmqc.sources.pulsar_members.POLL` s (the Python client has no callback for
  it); topics in ``public/default`` only (names are plain).
* Holes at a partition's tail (a transaction marker as the last entry) are not passed:
  the position stops before them until a later message arrives.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import math
import os
import re
import socket
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import TopicPartition as KafkaTP

from htmqc.dlq.record import retry_topic
from htmqc.errors import RuntimeFailure, UsageError
from htmqc.secrets import remember as remember_secret
from htmqc.sources.pulsar_members import HANDOVER_WAIT, POLL, RELEASED_BY, Handover, Owner
from htmqc.sources.pumped import (
    CALL_TIMEOUT,
    RETRY_SUFFIX,
    TP,
    Deliveries,
    LogMessage,
    Numbered,
    NumberedProducer,
    PumpedConsumer,
    _Partition,
    check_plain,
)
from htmqc.sources.tls import (
    TLS_PARAMS,
    TLS_REFUSALS,
    client_context,
    query_of,
    tls_refusal,
)

log = logging.getLogger("htmqc.pulsar")

T = TypeVar("T")

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


class AdminError(RuntimeFailure):
    """An admin call answered an error status (``status``: the HTTP code)."""

    def __init__(self, status: int, message: str, fix: str) -> None:
        super().__init__(message, fix)
        self.status = status


class PulsarAdmin:
    """The admin (HTTP) calls the offset mapping needs: an entry's index, a
    partition's watermarks, the message id of an offset."""

    def __init__(
        self,
        admin_url: str,
        timeout: float = 10.0,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.admin_url = admin_url.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json"}
        if token is not None:
            self.headers["Authorization"] = f"Bearer {token}"
        self.tls = tls

    def _get(
        self, path: str, method: str = "GET", body: Any = None
    ) -> tuple[bytes, dict[str, str]]:
        path, mark, query = path.partition("?")
        url = f"{self.admin_url}/admin/v2/persistent/{urllib.parse.quote(path)}{mark}{query}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.tls) as answer:
                return answer.read(), dict(answer.headers.items())
        except urllib.error.HTTPError as exc:
            exc.close()  # its body's socket
            if exc.code in (401, 403):
                raise self.refused(exc.code) from None
            raise AdminError(
                exc.code,
                f"Pulsar admin {method} {path} answered {exc.code}",
                "check the topic and that the broker appends the index "
                "(brokerEntryMetadataInterceptors=...AppendIndexMetadataInterceptor)",
            ) from exc
        except OSError as exc:
            raise RuntimeFailure(
                f"cannot reach Pulsar's admin API at {self.admin_url}: {exc}",
                "check --bootstrap's admin-port and that the broker runs",
            ) from exc

    def refused(self, status: int) -> RuntimeFailure:
        """The one-line error of an admin call answered 401 or 403."""
        said = "refused the token" if "Authorization" in self.headers else "asks for a token"
        return RuntimeFailure(
            f"Pulsar's admin API at {self.admin_url} {said} ({status})",
            "pass --bootstrap ...?token-file=FILE with a token the broker accepts",
        )

    def reachable(self) -> None:
        """One admin call (the clusters list).

        :raises OSError: no answer; :raises RuntimeFailure: the token refused."""
        request = urllib.request.Request(
            f"{self.admin_url}/admin/v2/clusters", headers=self.headers
        )
        try:
            urllib.request.urlopen(request, timeout=2, context=self.tls).close()
        except urllib.error.HTTPError as exc:
            exc.close()  # its body's socket
            if exc.code in (401, 403):
                raise self.refused(exc.code) from None
            raise
        except (urllib.error.URLError, ssl.SSLError) as exc:
            # A handshake refused is a URLError; an alert after it (TLS 1.3: the
            # broker wanted a client certificate) comes as the SSLError itself.
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            refused = tls_refusal(reason) if isinstance(reason, BaseException) else ""
            if refused:
                raise RuntimeFailure(
                    f"Pulsar's admin API at {self.admin_url} {refused}", TLS_REFUSALS[refused]
                ) from None
            raise

    def partitions(self, topic: str) -> int:
        """How many partitions the partitioned topic ``topic`` has (0: no such
        partitioned topic)."""
        try:
            body, _headers = self._get(f"{topic_path(topic)}/partitions")
        except AdminError as exc:
            if exc.status == 404:
                return 0
            raise
        return int(json.loads(body).get("partitions") or 0)

    def create_partitioned(self, topic: str, partitions: int) -> None:
        """Create ``topic`` with ``partitions`` partitions (kept if it exists)."""
        try:
            self._get(f"{topic_path(topic)}/partitions", "PUT", partitions)
        except AdminError as exc:
            if exc.status != 409:
                raise

    def ensure_partitions(self, topic: str, partitions: int) -> int:
        """Make the partitioned ``topic`` have at least ``partitions`` partitions
        (created, or grown: Pulsar cannot shrink one); how many it has."""
        have = self.partitions(topic)
        if have == 0:
            self.create_partitioned(topic, partitions)
        elif have < partitions:
            self._get(f"{topic_path(topic)}/partitions", "POST", partitions)
        return max(have, partitions)

    def owners(self, topic: str, subscription: str) -> dict[int, Owner]:
        """Partition index -> its :class:`~htmqc.sources.pulsar_members.Owner` in
        ``subscription`` of the partitioned ``topic`` (a partition without the
        subscription yet: no active consumer, none at all)."""
        body, _headers = self._get(f"{topic_path(topic)}/partitioned-stats?perPartition=true")
        out: dict[int, Owner] = {}
        for name, stats in (json.loads(body).get("partitions") or {}).items():
            index = int(name.rsplit("-partition-", 1)[1])
            sub = (stats.get("subscriptions") or {}).get(subscription) or {}
            consumers = frozenset(
                str(c["consumerName"]) for c in sub.get("consumers") or () if c.get("consumerName")
            )
            out[index] = Owner(sub.get("activeConsumerName"), consumers)
        return out

    def create_plain(self, topic: str) -> None:
        """Create the non-partitioned topic ``topic`` (kept if it exists)."""
        try:
            self._get(topic_path(topic), "PUT")
        except AdminError as exc:
            if exc.status != 409:
                raise

    def compact_above(self, topic: str, size: int) -> None:
        """Let the broker compact ``topic`` once its backlog passes ``size`` bytes
        (a topic policy).

        :raises RuntimeFailure: the broker refused it (topic policies disabled)."""
        self._get(f"{topic_path(topic)}/compactionThreshold", "POST", size)

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

    def locate(
        self,
        topic: str,
        partition: int,
        offset: int,
        ledgers: list[tuple[int, int]] | None = None,
    ) -> tuple[int, int, int] | None:
        """``(ledger, entry, batch index)`` of the message at ``offset`` (batch index
        ``-1`` when its entry is not a batch; the entry's first message when the offset
        falls in a hole), or ``None`` when no stored message is at or above it.
        A binary search over ``ledgers`` (default: read now), about ``log2(entries)``
        admin calls."""
        if ledgers is None:
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

    def read_start(self, topic: str, partition: int, offset: int) -> tuple[int, int, int] | None:
        """Where a reader of the partition from ``offset`` starts, inclusive:
        :meth:`locate`'s answer; past the last stored message, the last entry (batch
        index ``-1``: the reader drops its messages below ``offset``); ``None`` (the
        earliest) when the partition holds no entry.

        Both answers come from **one** read of the ledgers. The partition may grow
        meanwhile: a second read could name an entry appended after the search, and a
        reader started there would skip every entry between (a loss, once committed)."""
        ledgers = self.ledgers(topic, partition)
        located = self.locate(topic, partition, offset, ledgers)
        if located is not None or not ledgers:
            return located
        ledger, count = ledgers[-1]
        return ledger, count - 1, -1


# -- the consumer ---------------------------------------------------------------------------

#: The ``--bootstrap`` scheme, and the default binary and admin (HTTP) ports.
SCHEME = "pulsar"
BROKER_PORT, ADMIN_PORT = 6650, 8080
#: The TLS scheme and Pulsar's default TLS ports (binary, admin).
TLS_SCHEME = "pulsar+ssl"
BROKER_TLS_PORT, ADMIN_TLS_PORT = 6651, 8443
#: What a topic or group name names here (in the refusal).
WHAT_NAMES = "a Pulsar topic or subscription"
#: Seconds between a standby's attempts to take the lease subscription.
STANDBY_POLL = 0.5
#: Seconds between two checks that the lease subscription is still connected.
LEASE_CHECK = 0.2
#: Seconds the lease subscription may stay disconnected (a topic unload, a broker
#: restart) before the member stops: it hands nothing out meanwhile.
LEASE_GRACE = 10.0
#: Milliseconds a read waits for a partition's first message of a batch.
READ_WAIT_MS = 200
#: Seconds between two background refreshes of a partition's cached watermarks
#: (a refresh is three admin calls).
WATERMARK_REFRESH = 2.0
#: Backlog bytes above which the broker compacts a commit topic.
COMMITS_COMPACTION = 1 << 20
#: Threads of the blocking pulsar-client and admin calls (a partition's read holds one
#: for up to READ_WAIT_MS).
WORKERS = 32


def check_name(what: str, name: str) -> None:
    """:raises UsageError: ``name`` is not letters, digits, ``_`` and ``-``."""
    check_plain(what, name, WHAT_NAMES)


@dataclass(frozen=True)
class Endpoint:
    """Where a broker is: ``pulsar[+ssl]://HOST[:PORT][?admin-port=N | ?admin=URL]``,
    with ``token-file=PATH`` for a broker that wants a token and, over TLS, ``ca=``,
    ``cert=``, ``key=`` (:mod:`htmqc.sources.tls`). The admin API is
    ``http://HOST:8080`` (TLS: ``https://HOST:8443``) unless said."""

    service_url: str
    admin_url: str
    host: str
    port: int
    #: The token read from ``token-file`` (kept out of ``repr``).
    token: str | None = field(default=None, repr=False)
    #: TLS: the query's files (the C++ client reads paths) and the admin API's context.
    tls_files: Mapping[str, str] = field(default_factory=dict)
    tls: ssl.SSLContext | None = field(default=None, repr=False)
    #: How the group's members share a topic (:data:`SUBSCRIPTIONS`).
    subscription: str = "exclusive"


#: What ``--bootstrap`` may carry beside the broker.
QUERY_PARAMS = ("admin-port", "admin", "token-file", "subscription", *TLS_PARAMS)
#: ``?subscription=``: ``exclusive`` (one member reads every partition, the others
#: wait as standbys) or ``failover`` (the broker spreads the partitions over the
#: members, :mod:`htmqc.sources.pulsar_members`).
SUBSCRIPTIONS = ("exclusive", "failover")


def endpoint_of(bootstrap: str) -> Endpoint:
    """``--bootstrap`` as an :class:`Endpoint`. A token is read from ``token-file``
    (its one line; remembered as a secret, so logs mask it). ``pulsar+ssl://`` is
    TLS on both the binary protocol and the admin API, the broker's certificate and
    host name verified.

    :raises UsageError: another scheme, no host, a port that is not a number, an
        unknown parameter, TLS files without ``+ssl``, or a file that cannot be
        read (an empty token file too)."""
    hint = f"pass {SCHEME}://HOST:PORT[?admin-port=N] (or {TLS_SCHEME}://HOST:PORT?ca=FILE)"
    if not bootstrap.strip():
        raise UsageError("--bootstrap is empty", hint)
    tls = bootstrap.startswith(f"{TLS_SCHEME}://")
    if not tls and not bootstrap.startswith(f"{SCHEME}://"):
        raise UsageError(f"--bootstrap {bootstrap!r} is not a Pulsar URL", hint)
    url = urllib.parse.urlsplit(bootstrap)
    query = query_of(url.query, QUERY_PARAMS, bootstrap)
    try:
        port = url.port or (BROKER_TLS_PORT if tls else BROKER_PORT)
        admin_port = int(query.get("admin-port", ADMIN_TLS_PORT if tls else ADMIN_PORT))
    except ValueError:
        raise UsageError(f"--bootstrap {bootstrap!r} has a bad port", hint) from None
    if not url.hostname:
        raise UsageError(f"--bootstrap {bootstrap!r} names no host", hint)
    files = {k: query[k] for k in TLS_PARAMS if k in query}
    if files and not tls:
        raise UsageError(
            f"--bootstrap gives TLS files ({', '.join(files)}) to a plain {SCHEME}:// URL",
            f"use {TLS_SCHEME}://HOST:PORT (the broker's TLS port, 6651 by default)",
        )
    web = "https" if tls else "http"
    admin = query.get("admin", f"{web}://{url.hostname}:{admin_port}")
    if not admin.startswith(("http://", "https://")):
        raise UsageError(f"--bootstrap's admin {admin!r} is not an http(s) URL", hint)
    token = _read_token(query["token-file"]) if "token-file" in query else None
    subscription = query.get("subscription", SUBSCRIPTIONS[0])
    if subscription not in SUBSCRIPTIONS:
        raise UsageError(
            f"--bootstrap's subscription {subscription!r} is not a way to share a topic",
            "pass ?subscription=exclusive (one member, standbys) or ?subscription=failover "
            "(partitions spread over the members)",
        )
    scheme = TLS_SCHEME if tls else SCHEME
    return Endpoint(
        f"{scheme}://{url.hostname}:{port}", admin, url.hostname, port, token, files,
        client_context(files) if tls else None, subscription,
    )  # fmt: skip


def _read_token(path: str) -> str:
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not text"
        raise UsageError(
            f"cannot read the Pulsar token file {path}: {reason}",
            "pass token-file= a file holding the token (a JWT) on one line",
        ) from None
    if not token:
        raise UsageError(f"the Pulsar token file {path} is empty", "put the token in it")
    remember_secret(token)
    return token


def _group_topic(kind: str, group: str, topic: str) -> str:
    """``persistent://NS/htmqc.KIND.GROUP.NAME``: a topic of htmqc's own for
    ``group`` on ``topic``, in ``topic``'s namespace."""
    namespace, name = topic_path(topic).rsplit("/", 1)
    return f"persistent://{namespace}/htmqc.{kind}.{group}.{name}"


def commits_topic(group: str, topic: str) -> str:
    """The compacted topic of a group's at-least-once commits of ``topic`` (one
    message per commit, keyed by partition), in ``topic``'s namespace."""
    return _group_topic("offsets", group, topic)


def lease_topic(group: str, topic: str) -> str:
    """The empty topic whose ``Exclusive`` subscription named after the group is
    the group's lease on ``topic`` (nothing is ever published to it, so the
    subscription holds no backlog)."""
    return _group_topic("lease", group, topic)


def members_topic(group: str, topic: str) -> str:
    """The partitioned topic whose ``Failover`` subscription named after the group
    spreads ``topic``'s partitions over the group's members
    (``?subscription=failover``, :mod:`htmqc.sources.pulsar_members`)."""
    return _group_topic("members", group, topic)


def encode_commit(partition: int, offset: int, metadata: str | None) -> bytes:
    """A commit as stored: ``{"partition", "offset", "metadata"}`` (JSON)."""
    return json.dumps({"partition": partition, "offset": offset, "metadata": metadata}).encode()


def decode_commits(values: list[bytes]) -> dict[int, tuple[int, str | None]]:
    """Partition -> ``(offset, metadata)`` of the last stored commit of each, from a
    commit topic's messages in order."""
    out: dict[int, tuple[int, str | None]] = {}
    for value in values:
        stored = json.loads(value)
        out[int(stored["partition"])] = (int(stored["offset"]), stored.get("metadata"))
    return out


class PulsarMessage(LogMessage):
    """A consumed Pulsar message: ``offset()`` from the broker-entry index
    (:class:`OffsetMapper`), ``timestamp()`` its publish time."""

    __slots__ = ()


def convert(topic: str, partition: int, offset: int, msg: Any) -> PulsarMessage:
    """A ``pulsar.Message`` at ``offset`` as a :class:`PulsarMessage`: the partition
    key is the key (none if empty), the properties the headers."""
    key_text = msg.partition_key()
    props = msg.properties()
    key: bytes | None = key_text.encode() if key_text else None
    headers: list[tuple[str, bytes]] | None = None
    if props:
        headers = []
        for name, value in props.items():
            headers.append((name, value.encode()))
    return PulsarMessage(
        topic, partition, offset, key, msg.data(), headers, int(msg.publish_timestamp())
    )


def _text(value: bytes | None) -> str:
    """Bytes as a Pulsar property or key (a string; bytes that are not UTF-8 kept)."""
    return (value or b"").decode("utf-8", "surrogateescape")


#: The Python logger pulsar-client's C++ lines go to at ``--log-level DEBUG``, through
#: the configured handler (``--log-format json`` too): one of
#: :data:`htmqc.logs.CLIENT_LOGGERS`, quieted below ``DEBUG``.
CLIENT_LOGGER = "pulsar"


def client_logger(quiet: bool = False) -> Any:
    """pulsar-client's C++ logger. Like pika's and rstream's lines, its lines repeat
    what this module reports itself, so they show at ``--log-level DEBUG`` only: there
    they go to the Python logger :data:`CLIENT_LOGGER` (so ``--log-format json``
    formats them) through :class:`_ClientLog`; below it (``htmqc.logs.setup``
    quieted that logger) nowhere. Without ``setup`` (a library user, a test) its
    errors go to the console. ``quiet``: nowhere (the lease client, whose standby
    attempts fail with ``ConsumerBusy`` every :data:`STANDBY_POLL` s; this module
    logs what the lease does).

    Never a Python ``logging.Logger`` itself: with one the process may abort at exit
    ("terminate called without an active exception",
    apache/pulsar-client-python#256; seen here once in 12 runs with a dead-letter
    producer)."""
    import pulsar  # type: ignore[import-untyped]

    logger = logging.getLogger(CLIENT_LOGGER)
    if quiet or not logger.isEnabledFor(logging.ERROR):
        return pulsar.FileLogger(pulsar.LoggerLevel.Error, os.devnull)
    if logger.isEnabledFor(logging.DEBUG):
        with contextlib.suppress(OSError):  # no temporary file: the console, as before
            return pulsar.FileLogger(pulsar.LoggerLevel.Debug, _ClientLog.path())
    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


#: A line of pulsar-client's file logger:
#: ``2021-03-24 17:35:46.571 INFO  [0x10a951e00] ConnectionPool:85 | Created ...``
_CLIENT_LINE = re.compile(r"\S+ \S+ (?P<level>[A-Z]+)\s+\[[^\]]*\] (?P<msg>.*)")
_CLIENT_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
                  "ERROR": logging.ERROR}  # fmt: skip


class _ClientLog:
    """A file pulsar-client's C++ logger appends to (one a process, removed at exit)
    and a thread that passes each of its lines to :data:`CLIENT_LOGGER` at the
    line's level: C++ threads never call into Python. What is left is passed on at
    exit (``atexit``), before the interpreter stops."""

    _lock = threading.Lock()
    _path: str | None = None

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.rest = b""
        self.reading = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._follow, name="htmqc-pulsar-log", daemon=True)

    @classmethod
    def path(cls) -> str:
        """The file, created (and followed) on first use."""
        with cls._lock:
            if cls._path is None:
                fd, cls._path = tempfile.mkstemp(prefix="htmqc-pulsar-", suffix=".log")
                log = cls(fd)
                log.thread.start()
                atexit.register(log.close, cls._path)
            return cls._path

    def _follow(self) -> None:
        while not self.stop.wait(0.0 if self.pass_on() else 0.1):
            pass

    def pass_on(self) -> bool:
        """Log the lines appended since the last call; whether there were any."""
        with self.reading:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return False
            *lines, self.rest = (self.rest + chunk).split(b"\n")
        logger = logging.getLogger(CLIENT_LOGGER)
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip()
            got = _CLIENT_LINE.fullmatch(line)
            level = _CLIENT_LEVELS.get(got["level"], logging.INFO) if got else logging.INFO
            logger.log(level, "%s", got["msg"] if got else line)
        return True

    def close(self, path: str) -> None:
        """Stop following, pass the rest on, remove the file."""
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(2)
        with contextlib.suppress(OSError):
            while self.pass_on():
                pass
            os.close(self.fd)
            os.unlink(path)


def new_client(endpoint: Endpoint, connect_seconds: float, quiet: bool = False) -> Any:
    """A ``pulsar.Client`` of the broker, once its binary port and admin API
    answered (tried for ``connect_seconds``); ``quiet``: its C++ log discarded.

    :raises RuntimeFailure: they did not answer in time."""

    deadline = time.monotonic() + connect_seconds
    admin = PulsarAdmin(
        endpoint.admin_url, max(1.0, min(10.0, connect_seconds)), endpoint.token, endpoint.tls
    )
    while True:
        try:
            socket.create_connection((endpoint.host, endpoint.port), timeout=1.0).close()
            admin.reachable()
            break
        except OSError as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise RuntimeFailure(
                f"cannot reach Pulsar at {endpoint.service_url} (admin {endpoint.admin_url}): "
                f"{last}",
                "check --bootstrap (pulsar://HOST:PORT?admin-port=N) and that the broker runs",
            )
        time.sleep(0.2)
    return pulsar_client(endpoint, quiet)


def pulsar_client(endpoint: Endpoint, quiet: bool = False) -> Any:
    """A ``pulsar.Client`` of ``endpoint`` (it connects on first use)."""
    import pulsar

    auth: dict[str, Any] = {}
    if endpoint.token is not None:
        auth["authentication"] = pulsar.AuthenticationToken(endpoint.token)
    files = endpoint.tls_files
    if endpoint.tls is not None:
        auth.update(tls_validate_hostname=True, tls_allow_insecure_connection=False)
        if "ca" in files:
            auth["tls_trust_certs_file_path"] = files["ca"]
        if "cert" in files:
            auth.update(
                tls_certificate_file_path=files["cert"], tls_private_key_file_path=files["key"]
            )
    return pulsar.Client(
        endpoint.service_url,
        operation_timeout_seconds=max(5, int(CALL_TIMEOUT / 2)),
        logger=client_logger(quiet),
        **auth,
    )


def read_all(client: Any, topic: str, compacted: bool = True) -> list[bytes]:
    """Every message of the non-partitioned ``topic`` now (its compacted view), in
    order; ``[]`` if it does not exist."""
    import pulsar

    reader = client.create_reader(
        topic, pulsar.MessageId.earliest, is_read_compacted=compacted,
        start_message_id_inclusive=True,
    )  # fmt: skip
    try:
        out = []
        while reader.has_message_available():
            out.append(reader.read_next(int(CALL_TIMEOUT * 1000 / 3)).data())
        return out
    finally:
        reader.close()


class PulsarConsumer(PumpedConsumer):
    """The blocking :class:`~htmqc.ports.ConsumerPort` over Apache Pulsar (module docs).

    ``bootstrap``: a ``pulsar://`` URL (:func:`endpoint_of`); ``group``: the lease
    subscription's name and the commits' key; ``on_commit(err, partitions)``: the
    outcome of each asynchronous commit, called inside :meth:`consume`.

    pulsar-client is synchronous: its calls (readers, the lease subscription, the
    commit producer) and the admin API's run on a thread pool, awaited from
    :class:`PumpedConsumer`'s asyncio thread, so that the shared port (generations,
    buffers, lease, ordered commits) is the one NATS and RabbitMQ use.

    :raises RuntimeFailure: the broker cannot be reached within ``connect_seconds``.
    """

    SOURCE, OPTION = "Pulsar", SCHEME
    NAMES = WHAT_NAMES

    def __init__(
        self,
        bootstrap: str,
        group: str,
        *,
        connect_seconds: float = 10.0,
        lease_grace: float = LEASE_GRACE,
        **options: Any,
    ) -> None:
        """``lease_grace``: seconds the lease may stay disconnected before the member
        stops (:data:`LEASE_GRACE`); ``options``: :class:`PumpedConsumer`'s
        (``on_commit``, ``fetch_batch``, ``buffer_messages``)."""
        check_name("group", group)
        self.lease_grace = lease_grace
        self.connect_seconds = connect_seconds
        #: Why taking the lease failed for good (``None``: it did not).
        self._lease_error: str | None = None
        self.endpoint = endpoint_of(bootstrap)
        self.admin = PulsarAdmin(
            self.endpoint.admin_url, token=self.endpoint.token, tls=self.endpoint.tls
        )
        self._client: Any = new_client(self.endpoint, connect_seconds)
        #: The lease's own connection (and a quiet log: a standby is refused every 0.5 s).
        self._lease_client: Any = pulsar_client(self.endpoint, quiet=True)
        super().__init__(group, thread_name="htmqc-pulsar", **options)
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="htmqc-pulsar-io")
        self._lease: Any = None
        #: ``?subscription=failover``: this member's consumer name, its view of the
        #: partitions' owners, the partitions it is letting go of (a release is
        #: published once the runtime did) and the release producers per index.
        self.member = f"htmqc-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._handover: Handover | None = None
        self._members_name = ""
        self._parts_list: list[TP] = []
        self._releasing: set[TP] = set()
        self._release_producers: dict[int, Any] = {}
        self._commit_producer: Any = None
        self._commit_topic: str | None = None
        self._refreshed: dict[TP, float] = {}
        self._call(self._init_locks())

    async def _init_locks(self) -> None:
        self._commit_lock = asyncio.Lock()

    def _stream(self, topic: str, partition: int) -> str:
        return partition_topic(topic, partition)

    def close(self) -> None:
        """As :meth:`PumpedConsumer.close`; the pulsar-client clients are closed even
        if the orderly close timed out (an unclosed one may abort the process at exit)."""
        super().close()
        for client in (self._client, self._lease_client):
            with contextlib.suppress(Exception):
                client.close()

    def _lost_lease(self) -> RuntimeFailure:
        if self._lease_error is not None:
            return RuntimeFailure(
                f"the Pulsar lease of group {self.group!r} cannot be taken: {self._lease_error}",
                "check the broker's admin API, and that this role may create topics and "
                "subscribe in the topic's namespace",
            )
        if self.endpoint.subscription == "failover":
            return RuntimeFailure(
                f"the Pulsar share of group {self.group!r} ({self._lease_key}) was lost: its "
                f"Failover subscription was disconnected, or its owners unreadable, for "
                f"{self.lease_grace:g} s, so other members may hold its partitions now",
                "restart this member: it joins the group again",
            )
        return RuntimeFailure(
            f"the Pulsar lease of group {self.group!r} ({self._lease_key}) was lost: its "
            f"Exclusive subscription stayed disconnected for {self.lease_grace:g} s, so "
            "another member may hold it now",
            "restart this member: it waits as a standby while another one consumes",
        )

    def partitions(self, topic: str) -> int:
        """How many partitions the partitioned topic ``topic`` has (0: none)."""
        return self.admin.partitions(topic)

    def get_watermark_offsets(
        self, partition: KafkaTP, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int] | None:
        """As :meth:`PumpedConsumer.get_watermark_offsets`; a cached read refreshes
        in the background at most every :data:`WATERMARK_REFRESH` s."""
        tp = (partition.topic, partition.partition)
        if cached:
            now = time.monotonic()
            if now - self._refreshed.get(tp, -math.inf) >= WATERMARK_REFRESH:
                self._refreshed[tp] = now
                what = f"reading the watermarks of {tp[0]}/{tp[1]}"
                self._loop.call_soon_threadsafe(self._track, self._watermarks_of(tp), what)
            return self._watermarks.get(tp)
        return super().get_watermark_offsets(partition, timeout)

    # -- coroutines (the asyncio thread; blocking calls on the pool) -------------------------

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the pool, awaited."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(*args))

    def _start_id(self, topic: str, partition: int, offset: int) -> tuple[Any, bool]:
        """The reader's start of a partition read from ``offset``: ``(message id,
        inclusive)``, at :meth:`PulsarAdmin.read_start` (``None``: the earliest)."""
        import pulsar

        located = self.admin.read_start(topic, partition, offset)
        if located is None:
            return pulsar.MessageId.earliest, True
        ledger, entry, batch = located
        mid = pulsar.MessageId(partition=-1, ledger_id=ledger, entry_id=entry, batch_index=batch)
        return mid, True

    def _open_reader(self, part: _Partition, start: int) -> Any:
        mid, inclusive = self._start_id(part.topic, part.partition, start)
        return self._client.create_reader(
            partition_topic(part.topic, part.partition), mid,
            receiver_queue_size=max(100, min(self.fetch_batch, 1000)),
            start_message_id_inclusive=inclusive,
        )  # fmt: skip

    async def _session(self, part: _Partition, generation: int) -> None:
        """One non-durable reader's life from the partition's position (module docs:
        *Fetching*): reads of up to :attr:`fetch_batch` messages while the buffer has
        room and the partition is not paused; the reader is closed at the end."""
        assert part.wake is not None
        with self._cond:
            start = part.position
        if start is None:
            start = await self._start_of(part)
            with self._cond:
                if not self._current(part, generation):
                    return
                if part.position is None:
                    part.position = start
        reader = await self._blocking(self._open_reader, part, start)
        fetch = _Fetch(part.topic, part.partition, start, OffsetMapper(
            lambda ledger, entry: self.admin.entry(part.topic, part.partition, ledger, entry)
        ))  # fmt: skip
        try:
            while self._current(part, generation):
                with self._cond:
                    idle = part.idle = part.paused or len(part.buffer) >= self.buffer_messages
                    room = self.buffer_messages - len(part.buffer)
                    if idle:
                        part.wake.clear()
                if idle:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(part.wake.wait(), 0.5)
                    continue
                got = await self._blocking(fetch.read, reader, min(self.fetch_batch, room))
                if not got:
                    continue
                with self._cond:
                    if not self._current(part, generation):
                        return
                    part.buffer.extend(got)
                    self._cond.notify_all()
        finally:
            with contextlib.suppress(Exception):
                await self._blocking(reader.close)

    def _subscribe_lease(self, topic: str) -> Any:
        import pulsar

        return self._lease_client.subscribe(
            lease_topic(self.group, topic), self.group,
            consumer_type=pulsar.ConsumerType.Exclusive,
            receiver_queue_size=1,
            consumer_name=f"htmqc-{socket.gethostname()}-{os.getpid()}",
        )  # fmt: skip

    def _give_up_lease(self, why: str) -> None:
        """The lease cannot be taken at all (not: another member holds it): the
        next :meth:`consume` raises :meth:`_lost_lease` with ``why``."""
        with self._cond:
            self._lease_error = why
            self._lease_lost = True
            self._lease_until = 0.0
            self._cond.notify_all()

    async def _hold_lease(self, parts: list[KafkaTP]) -> None:
        """The group's hold on ``parts``: the exclusive lease (:meth:`_hold_exclusive`)
        or a share of them (:meth:`_hold_share`), as ``?subscription=`` says."""
        if self.endpoint.subscription == "failover":
            await self._hold_share(parts)
        else:
            await self._hold_exclusive(parts)

    async def _hold_exclusive(self, parts: list[KafkaTP]) -> None:
        """Take the Exclusive subscription named after the group on the lease topic
        (waiting as a standby while another member holds it), hand ``parts`` to the
        next :meth:`consume`, then watch it every :data:`LEASE_CHECK` s until
        :meth:`close`: while it is not connected nothing is handed out (another
        member may take it); not connected again within :attr:`lease_grace` s, the
        lease is lost (the client reconnects it by itself, and cannot while another
        member holds it)."""
        import pulsar

        topic = parts[0].topic
        waited = False
        failing_since: float | None = None
        try:  # created here: a broker may not create topics on first use
            await self._blocking(self.admin.create_plain, lease_topic(self.group, topic))
        except RuntimeFailure as exc:
            self._give_up_lease(f"creating {lease_topic(self.group, topic)}: {exc.line()}")
            return
        while not self._closed:
            try:
                self._lease = await self._blocking(self._subscribe_lease, topic)
                break
            except pulsar.ConsumerBusy:
                failing_since = None
                if not waited:
                    log.warning(
                        "group %s on topic %s is held by another member; waiting as a standby "
                        "(it takes over when that member stops or dies)", self.group, topic,
                    )  # fmt: skip
                    waited = True
            except Exception as exc:
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    log.warning("taking the Pulsar lease %s failed: %s: %s; trying for %g s",
                                self._lease_key, type(exc).__name__, exc,
                                self.connect_seconds)  # fmt: skip
                elif now - failing_since >= self.connect_seconds:
                    self._give_up_lease(
                        f"subscribing {lease_topic(self.group, topic)} failed for "
                        f"{self.connect_seconds:g} s: {type(exc).__name__}: {exc}"
                    )
                    return
            await asyncio.sleep(STANDBY_POLL)
        if self._lease is None:
            return
        if self._closed:
            await self._blocking(self._lease.close)
            return
        if waited:
            log.info("took the lease of group %s (%s)", self.group, self._lease_key)
        with self._cond:
            self._lease_until = math.inf
            self._to_assign = parts
            self._cond.notify_all()
        down_since: float | None = None
        while not self._closed:
            await asyncio.sleep(LEASE_CHECK)
            if self._closed:
                return
            if self._lease.is_connected():
                if down_since is not None:  # reconnected: nobody else holds it now
                    log.info("the Pulsar lease %s is connected again", self._lease_key)
                    down_since = None
                    with self._cond:
                        self._lease_until = math.inf
                        self._cond.notify_all()
                continue
            down_since = self._in_doubt(down_since, "lease", "its subscription is disconnected")
            if self._lease_lost:
                return

    # -- ?subscription=failover: a share of the partitions (htmqc.sources.pulsar_members) ----

    def _subscribe_members(self, name: str) -> Any:
        import pulsar

        return self._lease_client.subscribe(
            name, self.group, consumer_type=pulsar.ConsumerType.Failover,
            receiver_queue_size=1, consumer_name=self.member,
        )  # fmt: skip

    def _drain_releases(self) -> list[tuple[int, str]]:
        """The releases delivered to this member (acknowledged): ``(index, member)``."""
        import pulsar

        out: list[tuple[int, str]] = []
        while True:
            try:
                msg = self._lease.receive(timeout_millis=1)
            except pulsar.Timeout:
                return out
            self._lease.acknowledge(msg)
            member = dict(msg.properties()).get(RELEASED_BY)
            index = msg.topic_name().rsplit("-partition-", 1)[-1]
            if member and index.isdigit():
                out.append((int(index), member))

    def _publish_release(self, name: str, index: int) -> None:
        producer = self._release_producers.get(index)
        if producer is None:
            producer = self._release_producers[index] = self._lease_client.create_producer(
                partition_topic(name, index), batching_enabled=False,
            )  # fmt: skip
        producer.send(b"", properties={RELEASED_BY: self.member})

    def _released(self, tps: list[TP]) -> None:
        """Tell the next owner of each partition this member lost that it let go."""
        with self._cond:
            gone = [tp for tp in tps if tp in self._releasing]
            self._releasing.difference_update(gone)
        if gone and not self._closed:
            name = self._members_name
            indexes = [self._parts_list.index(tp) for tp in gone if tp in self._parts_list]

            async def publish() -> None:
                for index in indexes:
                    await self._blocking(self._publish_release, name, index)

            self._loop.call_soon_threadsafe(self._track, publish(), "publishing a release")

    async def _join_members(self, name: str, count: int) -> bool:
        """Create the members topic (``count`` partitions at least), note who owns
        what and subscribe; False (the lease given up) if that fails for
        :attr:`connect_seconds`."""
        failing_since: float | None = None
        while not self._closed:
            try:
                await self._blocking(self.admin.ensure_partitions, name, count)
                assert self._handover is not None
                self._handover.start(await self._blocking(self.admin.owners, name, self.group))
                self._lease = await self._blocking(self._subscribe_members, name)
                return True
            except Exception as exc:
                line = exc.line() if isinstance(exc, RuntimeFailure) else repr(exc)
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    log.warning("joining the members of %s failed: %s; trying for %g s",
                                name, line, self.connect_seconds)  # fmt: skip
                elif now - failing_since >= self.connect_seconds:
                    self._give_up_lease(f"joining {name}: {line}")
                    return False
            await asyncio.sleep(STANDBY_POLL)
        return False

    async def _hold_share(self, parts: list[KafkaTP]) -> None:
        """Join the members topic, then every :data:`POLL` s read who owns which
        partition and hand the changes to the runtime (:class:`Handover` decides),
        until :meth:`close`. While the subscription is disconnected or the owners
        cannot be read, nothing is handed out (another member may own a partition
        now); for :attr:`lease_grace` s, the member stops, as with the exclusive lease."""
        topic = parts[0].topic
        name = self._members_name = members_topic(self.group, topic)
        self._parts_list = [(p.topic, p.partition) for p in parts]
        self._handover = handover = Handover(self.member, len(parts))
        if not await self._join_members(name, len(parts)):
            return
        standby = False
        awaited: set[int] = set()  # the waits already logged
        down_since: float | None = None
        while not self._closed:
            try:  # releases first: one read before the owners was published after their change
                heard = await self._blocking(self._drain_releases)
                owners = await self._blocking(self.admin.owners, name, self.group)
                problem = None if self._lease.is_connected() else "its subscription is disconnected"
            except Exception as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if self._closed:
                return
            if problem is not None:
                down_since = self._in_doubt(down_since, "share", problem)
                if self._lease_lost:
                    return
                await asyncio.sleep(POLL)
                continue
            if down_since is not None:
                log.info("the Pulsar share of %s is back", self._lease_key)
                down_since = None
            handover.hear(heard)
            change = handover.observe(owners, time.monotonic())
            gained = [self._parts_list[i] for i in change.gained]
            lost = [self._parts_list[i] for i in change.lost]
            if lost:
                log.info("partitions %s of group %s moved to other members; letting go",
                         _tp_names(lost), self.group)  # fmt: skip
                with self._cond:
                    self._releasing.update(lost)
            if gained:
                log.info("took partitions %s of group %s", _tp_names(gained), self.group)
            if gained or lost:
                never_had = self._change_assignment(gained, lost)
                if never_had:  # nothing to revoke: released now
                    self._released(never_had)
            idle = not handover.held and not handover.waiting
            if idle and not standby:
                log.warning(
                    "group %s on topic %s: every partition is held by other members; "
                    "waiting as a standby (it takes over partitions as members leave)",
                    self.group, topic,
                )  # fmt: skip
            standby = idle
            if set(handover.waiting) - awaited:
                log.info("waiting up to %g s for the release of partitions %s by their owners",
                         HANDOVER_WAIT, _tp_names(self._parts_list[i] for i in handover.waiting))
            awaited = set(handover.waiting)
            with self._cond:
                self._lease_until = math.inf
                self._cond.notify_all()
            await asyncio.sleep(POLL)

    def _in_doubt(self, since: float | None, what: str, why: str) -> float:
        """The member's hold (``what``: its lease, its share) is in doubt since
        ``since`` (``None``: from now on, logged) for ``why``: nothing is handed out
        (another member may hold its partitions now); after :attr:`lease_grace` s it
        is lost (the next :meth:`consume` raises). The time it is in doubt since."""
        now = time.monotonic()
        if since is None:
            log.warning(
                "the Pulsar %s %s is in doubt (%s); handing nothing out until it is back "
                "(%g s at most)", what, self._lease_key, why, self.lease_grace,
            )  # fmt: skip
            with self._cond:
                self._lease_until = 0.0
            return now
        if now - since >= self.lease_grace:
            log.warning("the Pulsar %s %s was lost: in doubt for %g s",
                        what, self._lease_key, self.lease_grace)  # fmt: skip
            with self._cond:
                self._lease_lost = True
                self._lease_until = 0.0
                self._cond.notify_all()
        return since

    async def _watermarks_of(self, tp: TP) -> tuple[int, int]:
        marks = await self._blocking(self.admin.watermarks, *tp)
        self._watermarks[tp] = marks
        return marks

    async def _read_commits(self, tps: Iterable[TP]) -> dict[TP, tuple[int, str | None]]:
        wanted = list(tps)
        out: dict[TP, tuple[int, str | None]] = {}
        for topic in dict.fromkeys(t for t, _p in wanted):
            name = commits_topic(self.group, topic)
            if not await self._blocking(_plain_exists, self.admin, name):
                continue
            stored = decode_commits(await self._blocking(read_all, self._client, name))
            for t, p in wanted:
                if t == topic and p in stored:
                    out[(t, p)] = stored[p]
        return out

    def _commit_producer_of(self, topic: str) -> Any:
        """The producer of ``topic``'s commit topic (created, with its compaction
        policy, on first use)."""
        name = commits_topic(self.group, topic)
        if self._commit_producer is None or self._commit_topic != name:
            self.admin.create_plain(name)
            try:
                self.admin.compact_above(name, COMMITS_COMPACTION)
            except RuntimeFailure as exc:
                log.warning("the commit topic %s will not be compacted: %s", name, exc.line())
            if self._commit_producer is not None:
                self._commit_producer.close()
            self._commit_producer = self._client.create_producer(
                name, batching_enabled=False, block_if_queue_full=True,
            )  # fmt: skip
            self._commit_topic = name
        return self._commit_producer

    async def _store_commits(self, parts: Sequence[KafkaTP]) -> None:
        """Send each commit to the commit topic, keyed by partition, and return once
        the broker confirmed every one (persisted): the outcome the core hears.

        :raises RuntimeError: the broker refused one."""
        import pulsar

        assert self._commit_lock is not None
        loop = asyncio.get_running_loop()
        async with self._commit_lock:  # FIFO: commits are stored in the order asked
            sent: list[asyncio.Future[Any]] = []
            for p in parts:
                producer = await self._blocking(self._commit_producer_of, p.topic)
                done: asyncio.Future[Any] = loop.create_future()

                def confirmed(res: Any, _mid: Any, done: asyncio.Future[Any] = done) -> None:
                    with contextlib.suppress(RuntimeError):  # the loop closed
                        loop.call_soon_threadsafe(_settle, done, res)

                producer.send_async(
                    encode_commit(p.partition, p.offset, p.metadata or None), confirmed,
                    partition_key=str(p.partition),
                )  # fmt: skip
                sent.append(done)
            for done in sent:
                res = await asyncio.wait_for(done, CALL_TIMEOUT)
                if res != pulsar.Result.Ok:
                    raise RuntimeError(f"Pulsar refused a commit: {res}")

    async def _close(self) -> None:
        # Every generation ended (close): the pumps close their readers and return.
        pumps = list(self._pumps)
        if pumps:
            await asyncio.wait(pumps, timeout=3)
        for task in pumps:
            task.cancel()
        if self._commit_lock is not None:  # the commits asked for before close are stored
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._commit_lock.acquire(), 5)
        for closable in (self._commit_producer, *self._release_producers.values(), self._lease):
            if closable is not None:  # a standby takes the lease over at once
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._blocking(closable.close), 5)
        for client in (self._client, self._lease_client):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._blocking(client.close), 5)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _tp_names(tps: Iterable[TP]) -> str:
    return ", ".join(f"{t}/{p}" for t, p in tps)


def _settle(done: asyncio.Future[Any], result: Any) -> None:
    if not done.done():
        done.set_result(result)


class _Fetch:
    """A reader's fetch state (one session): the last message id handed out, the
    session's start offset and the offset mapper. :meth:`read` runs on the pool."""

    def __init__(self, topic: str, partition: int, start: int, mapper: OffsetMapper) -> None:
        self.topic = topic
        self.partition = partition
        self.start = start
        self.mapper = mapper
        #: ``(ledger, entry, batch index)`` of the last message taken.
        self.last: tuple[int, int, int] | None = None

    def read(self, reader: Any, want: int) -> list[PulsarMessage]:
        """Up to ``want`` messages: the first waits :data:`READ_WAIT_MS` at most,
        the rest only take what the reader holds. A redelivered id at or below the
        last one taken is dropped before the mapper sees it; so is a message below
        the session's start (the rest of an entry read from its first message)."""
        import pulsar

        out: list[PulsarMessage] = []
        wait = READ_WAIT_MS
        while len(out) < want:
            try:
                msg = reader.read_next(wait)
            except pulsar.Timeout:
                break
            wait = 0
            mid = msg.message_id()
            here = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
            if self.last is not None and here <= self.last:
                continue  # delivered again (a reconnect)
            self.last = here
            offset = self.mapper.offset(*here)
            if offset < self.start:
                continue
            out.append(convert(self.topic, self.partition, offset, msg))
        return out


# -- topics, producing, dead letters -------------------------------------------------------------


class PulsarClient:
    """A blocking client of a broker (admin and producing): a ``pulsar.Client`` and
    its :class:`PulsarAdmin`."""

    def __init__(self, bootstrap: str, connect_seconds: float = 10.0) -> None:
        self.endpoint = endpoint_of(bootstrap)
        self.admin = PulsarAdmin(
            self.endpoint.admin_url, token=self.endpoint.token, tls=self.endpoint.tls
        )
        self.client: Any = new_client(self.endpoint, connect_seconds)

    def partitions(self, topic: str) -> int:
        """Partitions of ``topic`` (0: no such partitioned topic)."""
        return self.admin.partitions(topic)

    def create_topic(self, topic: str, partitions: int) -> None:
        """Create the partitioned topic ``topic`` (kept if it exists)."""
        check_name("topic", topic)
        self.admin.create_partitioned(topic, partitions)

    def create_retry_topic(self, topic: str) -> str:
        """Create ``topic``'s retry topic ``TOPIC.retry`` (``--retry-topic``), a
        partitioned topic of one partition like Kafka's (kept if it exists); its name."""
        check_name("topic", topic)
        self.admin.create_partitioned(retry_topic(topic), 1)
        return retry_topic(topic)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """``(low, high)`` of a partition (:meth:`PulsarAdmin.watermarks`)."""
        return self.admin.watermarks(topic, partition)

    def _last_commit(self, group: str, topic: str, partition: int) -> tuple[int, str | None] | None:
        """``(offset, metadata)`` of the group's last commit of a partition, or ``None``."""
        name = commits_topic(group, topic)
        if not _plain_exists(self.admin, name):
            return None
        return decode_commits(read_all(self.client, name)).get(partition)

    def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset of a partition (at-least-once), or ``None``."""
        got = self._last_commit(group, topic, partition)
        return None if got is None else got[0]

    def commit_metadata(self, group: str, topic: str, partition: int) -> str | None:
        """The metadata of the group's last commit of a partition, or ``None``."""
        got = self._last_commit(group, topic, partition)
        return None if got is None else got[1]

    def read(self, topic: str) -> list[Any]:
        """Every message of the non-partitioned ``topic`` now, as ``pulsar.Message``."""
        import pulsar

        reader = self.client.create_reader(
            f"persistent://{topic_path(topic)}", pulsar.MessageId.earliest,
            start_message_id_inclusive=True,
        )  # fmt: skip
        try:
            out = []
            while reader.has_message_available():
                out.append(reader.read_next(10_000))
            return out
        finally:
            reader.close()

    def publish_many(self, topic: str, partitions: int, records: Iterable[tuple[int, Any]]) -> int:
        """Publish ``(partition, (value, key, properties))`` records of ``topic`` in
        order (batched) and wait until every one is confirmed; return the count.

        :raises RuntimeFailure: a message was refused."""
        import pulsar

        producers = [
            self.client.create_producer(
                partition_topic(topic, p), batching_enabled=True, batching_max_messages=100,
                batching_max_publish_delay_ms=5, block_if_queue_full=True,
            )
            for p in range(partitions)
        ]
        failed: list[Any] = []
        n = 0

        def sent(res: Any, _mid: Any) -> None:
            if res != pulsar.Result.Ok:
                failed.append(res)

        try:
            for partition, (value, key, props) in records:
                producers[partition].send_async(
                    value, sent, properties=props, partition_key=key
                )
                n += 1
            for producer in producers:
                producer.flush()
        finally:
            for producer in producers:
                with contextlib.suppress(Exception):
                    producer.close()
        if failed:
            raise RuntimeFailure(f"Pulsar refused {len(failed)} messages: {failed[0]}", "retry")
        return n

    def close(self) -> None:
        """Close the client."""
        with contextlib.suppress(Exception):
            self.client.close()


def _plain_exists(admin: PulsarAdmin, topic: str) -> bool:
    try:
        admin._get(f"{topic_path(topic)}/internalStats")
    except AdminError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _publish_numbered(
    pc: PulsarClient, topic: str, partitions: int, messages: Iterable[Numbered]
) -> int:
    """:data:`produce`'s messages, the id as a property, to their partitions."""
    from htmqc.produce import ID_HEADER

    return pc.publish_many(topic, partitions, (
        (m.partition, (m.value, None if m.key is None else _text(m.key), {ID_HEADER: str(m.id)}))
        for m in messages
    ))  # fmt: skip


#: ``produce(bootstrap, topic, count, *, partitions, keys=100, size=100, start_id=0,
#: client=None)``: numbered test messages to a partitioned topic, created if missing
#: (:class:`~htmqc.sources.pumped.NumberedProducer`).
produce = NumberedProducer(PulsarClient, _publish_numbered)


class PulsarProducer(Deliveries):
    """The dead-letter and retry producer of a Pulsar source
    (:class:`~htmqc.ports.ProducerPort`): ``produce(TOPIC.dlq, ...)`` publishes to the
    non-partitioned topic ``TOPIC.dlq`` (or ``TOPIC.dlq.poison``), created on first
    use; ``produce(TOPIC.retry, ...)`` to the one-partition partitioned topic
    ``TOPIC.retry`` made at start (:meth:`PulsarClient.create_retry_topic`); ``flush``
    waits for the broker's confirmations."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__()
        self.client = PulsarClient(bootstrap)
        self._producers: dict[str, Any] = {}

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        """Publish ``value`` (``key`` as the partition key, ``headers`` as properties)
        to ``topic``; ``on_delivery(err, None)`` once confirmed."""
        import pulsar

        producer = self._producers.get(topic)
        if producer is None:
            if not topic.endswith(RETRY_SUFFIX):  # a retry topic is partitioned, made at start
                self.client.admin.create_plain(topic)
            producer = self._producers[topic] = self.client.client.create_producer(
                f"persistent://{topic_path(topic)}", batching_enabled=False,
                block_if_queue_full=True,
            )  # fmt: skip
        value = kwargs.get("value", args[0] if args else None)
        key = kwargs.get("key")
        props = {name: _text(v) for name, v in (kwargs.get("headers") or [])}
        future: Future[None] = Future()

        def sent(res: Any, _mid: Any) -> None:
            if res == pulsar.Result.Ok:
                future.set_result(None)
            else:
                future.set_exception(RuntimeError(f"Pulsar refused a message to {topic}: {res}"))

        producer.send_async(
            value or b"", sent, properties=props or None,
            partition_key=None if key is None else _text(key),
        )  # fmt: skip
        self.track(future, kwargs.get("on_delivery"))

    def close(self) -> None:
        """Close the producers and the client."""
        for producer in self._producers.values():
            with contextlib.suppress(Exception):
                producer.close()
        self.client.close()
