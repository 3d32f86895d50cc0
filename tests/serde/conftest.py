"""The Schema Registry of the serializer tests: Apicurio Registry, one per session.

It is the real thing, not a fake: Apicurio Registry 2.6.13.Final from Maven
Central (``make setup`` unpacks it into ``build/apicurio/app``;
``tools/apicurio/``), started by :func:`htmqc.schema_registry.start_registry` on a
free loopback port with in-memory storage, and spoken to through its
Confluent-compatible API (``/apis/ccompat/v7``) by confluent-kafka's own
serializers and deserializers. Without Java or the distribution the tests skip
with the fix (and fail under ``CI=true``: tests/services.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from htmqc.errors import HtmqcError
from htmqc.kafka_cluster import java_binary
from htmqc.schema_registry import SchemaRegistry, registry_jar, start_registry
from tests.services import missing


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[SchemaRegistry]:
    """Apicurio Registry on loopback for the whole session (``.url`` for clients)."""
    try:
        java_binary()
        registry_jar()
    except HtmqcError as exc:
        missing(exc.problem)
    try:
        registry = start_registry()
    except HtmqcError as exc:
        pytest.fail(f"cannot start Apicurio Registry: {exc.line()}", pytrace=False)
    with registry:
        yield registry
