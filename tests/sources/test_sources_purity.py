"""Adapters hold no offset logic: the modules of :mod:`htmqc.sources` never import
the core, the runtime or the sinks, and never touch the core's decision API. What
an adapter may do with positions is said in :mod:`htmqc.sources` (map its log's
positions to offsets, keep a fetch position, store the commits it is given)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCES = Path(__file__).resolve().parents[2] / "src" / "htmqc" / "sources"
#: The htmqc modules an adapter may import: errors, secrets to mask, the test message
#: format, DLQ names, the shared consumer port (:mod:`htmqc.sources.pumped`), TLS from a URL
#: (:mod:`htmqc.sources.tls`), who owns which Pulsar partition
#: (:mod:`htmqc.sources.pulsar_members`: membership, no offsets), the private servers
#: and the free ports they listen on (:mod:`htmqc.loopback`).
ALLOWED = {
    "htmqc.errors", "htmqc.secrets", "htmqc.produce", "htmqc.dlq.record", "htmqc.sources.pumped",
    "htmqc.sources.tls", "htmqc.sources.pulsar_members", "htmqc.sources.nats_server",
    "htmqc.sources.pulsar_server", "htmqc.sources.rabbitmq_server", "htmqc.loopback",
}  # fmt: skip
#: The core's decision API (htmqc.core): only the runtime calls it.
CORE_NAMES = {
    "ConsumerCore", "PartitionTracker", "commits", "commit_requested", "commit_acked",
    "commit_failed", "fetched", "started_many", "succeeded_many", "dead_lettered",
}  # fmt: skip
CORE_CLASSES = {"ConsumerCore", "PartitionTracker"}


def modules() -> list[Path]:
    return sorted(SOURCES.glob("*.py"))


def test_every_adapter_is_checked() -> None:
    names = {p.name for p in modules()}
    assert {"nats.py", "rabbitmq.py", "pulsar.py", "pumped.py"} <= names


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.name)
def test_an_adapter_imports_no_core_runtime_or_sink(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    ours = {m for m in imported if m == "htmqc" or m.startswith("htmqc.")}
    assert ours <= ALLOWED, f"{path.name} imports {sorted(ours - ALLOWED)}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.name)
def test_an_adapter_never_calls_the_core_decision_api(path: Path) -> None:
    tree = ast.parse(path.read_text())
    # Methods called on an object (``core.fetched(...)``), and the core's classes by name;
    # a local variable may be called anything.
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    used |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} & CORE_CLASSES
    assert not used & CORE_NAMES, f"{path.name} uses {sorted(used & CORE_NAMES)}"
