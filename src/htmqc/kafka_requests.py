"""Two Kafka protocol requests that librdkafka's admin API does not offer.

confluent-kafka 2.16 has no FindCoordinator for a transactional id and no
DescribeQuorum, and in KRaft mode a broker's DescribeCluster answer names a
random live broker as "controller" (controllers are not reachable by
clients), so :mod:`htmqc.kafka_cluster` asks these two itself:

- :func:`find_coordinator`: FindCoordinator v1 (key type 0 = consumer group,
  1 = transactional id) answers the node that coordinates the key;
- :func:`quorum_leader`: DescribeQuorum v0 for ``__cluster_metadata``, which
  a broker forwards to the controller quorum, answers the active controller.

Each call opens one plaintext connection to ``host:port``, sends one request,
reads one answer and closes. A Kafka error code in the answer raises
:class:`KafkaRequestError` (``code`` is Kafka's numeric error code, e.g. 15
COORDINATOR_NOT_AVAILABLE while ``__transaction_state`` is being created);
a network problem raises :class:`OSError`. For tests, chaos runs and
benchmarks on loopback; not a general client (no TLS, no SASL).
"""

from __future__ import annotations

import itertools
import socket
import struct

FIND_COORDINATOR = 10
DESCRIBE_QUORUM = 55
GROUP_KEY = 0
TRANSACTION_KEY = 1
METADATA_TOPIC = "__cluster_metadata"
_CLIENT_ID = b"htmqc-admin"
_correlation = itertools.count(1)


class KafkaRequestError(Exception):
    """The broker answered with a Kafka error code (``code``)."""

    def __init__(self, api: str, code: int) -> None:
        super().__init__(f"{api} answered Kafka error code {code}")
        self.code = code


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _compact_string(text: str) -> bytes:
    raw = text.encode()
    return _uvarint(len(raw) + 1) + raw


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(value)

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    def skip(self, count: int) -> None:
        self.pos += count

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.skip(self.uvarint())


def _exchange(host: str, port: int, header: bytes, body: bytes, timeout: float) -> _Reader:
    """Send one framed request; return a reader just past the correlation id."""
    (correlation,) = struct.unpack_from(">i", header, 4)
    frame = header + body
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
        reader = _Reader(_recv_exactly(sock, size))
    if reader.take(">i") != correlation:
        raise OSError("Kafka answered another request's correlation id")
    return reader


def _recv_exactly(sock: socket.socket, count: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < count:
        chunk = sock.recv(count - len(chunks))
        if not chunk:
            raise OSError("the broker closed the connection mid-answer")
        chunks += chunk
    return bytes(chunks)


def _header(api_key: int, version: int, *, flexible: bool) -> bytes:
    head = struct.pack(">hhi", api_key, version, next(_correlation))
    head += struct.pack(">h", len(_CLIENT_ID)) + _CLIENT_ID
    return head + (b"\x00" if flexible else b"")


def find_coordinator(
    host: str, port: int, key: str, key_type: int, timeout: float = 5.0
) -> tuple[int, str, int]:
    """``(node_id, host, port)`` of the coordinator of ``key`` (FindCoordinator v1).

    ``key_type``: :data:`GROUP_KEY` or :data:`TRANSACTION_KEY`.
    :raises KafkaRequestError: the broker answered an error code.
    """
    body = _string(key) + struct.pack(">b", key_type)
    reader = _exchange(host, port, _header(FIND_COORDINATOR, 1, flexible=False), body, timeout)
    reader.skip(4)  # throttle_time_ms
    error = reader.take(">h")
    message_length = reader.take(">h")
    reader.skip(max(0, message_length))
    node_id = reader.take(">i")
    host_length = reader.take(">h")
    coordinator_host = reader.data[reader.pos : reader.pos + host_length].decode()
    reader.skip(host_length)
    coordinator_port = reader.take(">i")
    if error:
        raise KafkaRequestError("FindCoordinator", error)
    return node_id, coordinator_host, coordinator_port


def quorum_leader(host: str, port: int, timeout: float = 5.0) -> int:
    """Node id of the KRaft quorum's leader, the active controller (DescribeQuorum v0).

    :raises KafkaRequestError: the broker answered an error code, or no leader yet
        (code -1).
    """
    partition = struct.pack(">i", 0) + b"\x00"
    topic = _compact_string(METADATA_TOPIC) + _uvarint(2) + partition + b"\x00"
    body = _uvarint(2) + topic + b"\x00"
    reader = _exchange(host, port, _header(DESCRIBE_QUORUM, 0, flexible=True), body, timeout)
    reader.skip_tagged_fields()  # response header v1
    error = reader.take(">h")
    if error:
        raise KafkaRequestError("DescribeQuorum", error)
    if reader.uvarint() != 2:  # exactly one topic
        raise KafkaRequestError("DescribeQuorum", -1)
    reader.skip(reader.uvarint() - 1)  # topic name
    if reader.uvarint() != 2:  # exactly one partition
        raise KafkaRequestError("DescribeQuorum", -1)
    reader.skip(4)  # partition index
    error = reader.take(">h")
    leader = reader.take(">i")
    if error:
        raise KafkaRequestError("DescribeQuorum", error)
    if leader < 0:
        raise KafkaRequestError("DescribeQuorum", -1)
    return leader
