"""The reachable state graph of a TLC model, as Python data.

Contract
--------
:func:`load_graph` returns a :class:`StateGraph`: every reachable state of a
model (``{variable: value}``) and every edge ``(source, action, target)`` TLC
took, in the order TLC explored them (breadth first, so a source is always
reached before its out-edges). TLA+ values become Python values: integers,
strings, booleans, model values as strings, records and functions as
:class:`Fun` (a hashable dict), sets as ``frozenset``, tuples as ``tuple``.

How the graph is obtained
-------------------------
TLC 2.15 writes it with ``-dump dot,actionlabels FILE``: one line per state
(``id [label="/\\ x = 1\\n/\\ y = ..."]``, the initial ones ``style = filled``)
and one line per transition (``id -> id [label="Action"]``), where ``Action``
is the name of the spec operator TLC split ``Next`` into (it carries no
parameters: :mod:`model_checks.graph_replay` reads them off the two states).
The model is run without ``SYMMETRY`` (with it, TLC would connect an edge to
a permuted representative of its target) and without checking properties
(the TLC gate does that); :func:`graph_config` derives that configuration
from a gate ``.cfg``. The dump is parsed once and cached as a pickle under
``build/graphs/``, keyed by a hash of every ``.tla`` file of ``tla/``, the
configuration and this module, so reruns (mutation testing) only load it.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from htmqc.errors import RuntimeFailure
from model_checks.tlc import BUILD_DIR as TLC_BUILD_DIR
from model_checks.tlc import TLA_DIR, run_model

GRAPH_DIR = TLC_BUILD_DIR.parent / "graphs"
_CACHE_FORMAT = 1

_NODE = re.compile(r'^(-?\d+) \[label="((?:[^"\\]|\\.)*)"(,style = filled)?\];?$')
_EDGE = re.compile(r'^(-?\d+) -> (-?\d+) \[label="(\w+)"')
_UNESCAPE = re.compile(r"\\(.)")
_VARIABLE = re.compile(r"(?:^|\n)/\\ (\w+) = ")
_TOKEN = re.compile(
    r'\s*(?:(<<|>>|\|->|:>|@@|[\[\](){},])|("(?:[^"\\]|\\.)*")|(-?\d+)|([A-Za-z_]\w*))'
)


class Fun(dict[Any, Any]):
    """A TLA+ record or function: a dict that can be a set element or a key.
    Never mutate one (its hash is computed once)."""

    _hash: int | None = None

    def __hash__(self) -> int:  # type: ignore[override]
        if self._hash is None:
            self._hash = hash(frozenset(self.items()))
        return self._hash


@dataclass
class StateGraph:
    """A model's reachable states and edges (see module docs)."""

    model: str
    constants: dict[str, str]
    states: dict[int, dict[str, Any]]
    initial: list[int]
    edges: list[tuple[int, str, int]]

    def out_edges(self) -> dict[int, list[tuple[str, int]]]:
        """``source -> [(action, target), ...]``."""
        out: dict[int, list[tuple[str, int]]] = {}
        for src, action, dst in self.edges:
            out.setdefault(src, []).append((action, dst))
        return out


# -- TLA+ values ---------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = [
            (m.group(1), m.group(2), m.group(3), m.group(4))
            for m in _TOKEN.finditer(text)
            if m.group(0).strip()
        ]
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i][0] if self.i < len(self.tokens) else None

    def take(self, symbol: str) -> None:
        got = self.peek()
        if got != symbol:
            raise ValueError(f"expected {symbol!r}, got {got!r} at token {self.i}")
        self.i += 1

    def value(self) -> Any:
        if self.i >= len(self.tokens):
            raise ValueError("value expected, text ended")
        sym, string, number, name = self.tokens[self.i]
        self.i += 1
        if string is not None:
            return _UNESCAPE.sub(r"\1", string[1:-1])
        if number is not None:
            return int(number)
        if name is not None:
            return {"TRUE": True, "FALSE": False}.get(name, name)
        if sym == "{":
            return frozenset(self.items("}"))
        if sym == "<<":
            return tuple(self.items(">>"))
        if sym == "[":
            return self.mapping("|->", ",", "]")
        if sym == "(":
            return self.mapping(":>", "@@", ")")
        raise ValueError(f"unexpected {sym!r} at token {self.i - 1}")

    def items(self, close: str) -> Iterator[Any]:
        if self.peek() == close:
            self.i += 1
            return
        while True:
            yield self.value()
            if self.peek() == ",":
                self.i += 1
                continue
            self.take(close)
            return

    def mapping(self, arrow: str, separator: str, close: str) -> Fun:
        """A record ``[k |-> v, ...]`` or a function ``(k :> v @@ ...)``."""
        out = Fun()
        if self.peek() == close:
            self.i += 1
            return out
        while True:
            key = self.value()
            self.take(arrow)
            out[key] = self.value()
            if self.peek() == separator:
                self.i += 1
                continue
            self.take(close)
            return out


def parse_value(text: str) -> Any:
    """One TLA+ value as TLC prints it (see module docs).

    :raises ValueError: the text is not a value this parser knows.
    """
    parser = _Parser(text)
    value = parser.value()
    if parser.i != len(parser.tokens):
        raise ValueError(f"text left after the value at token {parser.i}")
    return value


def parse_state(
    text: str, memo: dict[str, Any], keep: frozenset[str] | None = None
) -> dict[str, Any]:
    """``/\\ var = value`` lines as ``{var: value}``. ``memo`` caches values by
    their text (states share most of them); ``keep`` limits the variables."""
    parts = _VARIABLE.split(text)
    state: dict[str, Any] = {}
    for name, raw in zip(parts[1::2], parts[2::2], strict=True):
        if keep is not None and name not in keep:
            continue
        value = memo.get(raw)
        if value is None:
            value = memo[raw] = parse_value(raw)
        state[name] = value
    return state


def parse_dot(lines: Iterable[str], keep: frozenset[str] | None = None) -> tuple[
    dict[int, dict[str, Any]], list[int], list[tuple[int, str, int]]
]:
    """``(states, initial, edges)`` of a TLC ``-dump dot,actionlabels`` file.

    :raises ValueError: a state label does not parse.
    """
    states: dict[int, dict[str, Any]] = {}
    initial: list[int] = []
    edges: list[tuple[int, str, int]] = []
    memo: dict[str, Any] = {}
    for line in lines:
        if " -> " in line:
            edge = _EDGE.match(line)
            if edge:
                edges.append((int(edge.group(1)), edge.group(3), int(edge.group(2))))
            continue
        node = _NODE.match(line.rstrip("\n"))
        if node is None:
            continue
        ident = int(node.group(1))
        text = _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), node.group(2))
        try:
            states[ident] = parse_state(text, memo, keep)
        except ValueError as exc:
            raise ValueError(f"state {ident}: {exc}") from None
        if node.group(3):
            initial.append(ident)
    return states, initial, edges


# -- running TLC --------------------------------------------------------------------------


def graph_config(cfg_text: str) -> str:
    """A gate configuration turned into one that only explores: no SYMMETRY,
    no properties or invariants, ``INIT Init`` / ``NEXT Next`` instead of a
    ``SPECIFICATION`` (fairness does not change the reachable graph)."""
    out: list[str] = []
    section = ""
    for raw in cfg_text.splitlines():
        line = raw.split("\\*")[0].rstrip()
        head = line.split(" ", 1)[0] if line and not line[0].isspace() else ""
        if head:
            section = head
        if section in {"SYMMETRY", "INVARIANT", "INVARIANTS", "PROPERTY", "PROPERTIES",
                       "SPECIFICATION", "INIT", "NEXT"}:
            continue
        if line:
            out.append(line)
    return "\n".join([*out, "INIT Init", "NEXT Next", ""])


def constants(cfg_text: str) -> dict[str, str]:
    """``NAME = value`` assignments of a configuration, as text."""
    found = re.findall(r"^\s+(\w+)\s*=\s*(.+?)\s*$", cfg_text, re.M)
    return {name: value for name, value in found}


def cache_key(model: str, cfg_text: str, tla_dir: Path = TLA_DIR) -> str:
    """A hash of everything the graph depends on (see module docs)."""
    digest = hashlib.sha256()
    for path in sorted(tla_dir.glob("*.tla")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(cfg_text.encode())
    digest.update(Path(__file__).read_bytes())
    digest.update(f"{model}/{_CACHE_FORMAT}".encode())
    return digest.hexdigest()[:16]


def load_graph(
    model: str,
    module: str,
    config: str,
    *,
    keep: frozenset[str] | None = None,
    tla_dir: Path = TLA_DIR,
    timeout: float = 900.0,
    refresh: bool = False,
) -> tuple[StateGraph, bool]:
    """The state graph of one model and whether it came from the cache.

    ``keep``: the variables to keep in each state (default: all).

    :raises RuntimeFailure: TLC failed or its dump did not parse.
    """
    cfg_text = graph_config((tla_dir / config).read_text())
    key = cache_key(model, cfg_text + repr(sorted(keep or ())), tla_dir)
    cached = GRAPH_DIR / f"{model}-{key}.pickle"
    if cached.is_file() and not refresh:
        with cached.open("rb") as fh:
            graph: StateGraph = pickle.load(fh)
        return graph, True
    work = GRAPH_DIR / f"{model}-{key}.run{os.getpid()}"  # parallel runs do not collide
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for spec in tla_dir.glob("*.tla"):
        shutil.copyfile(spec, work / spec.name)
    (work / "graph.cfg").write_text(cfg_text)
    dot = work / "graph.dot"
    result = run_model(
        f"graph_{model}_{os.getpid()}", module, "graph.cfg", tla_dir=work, timeout=timeout,
        extra_args=("-dump", "dot,actionlabels", str(dot)),
    )
    if not result.passed or not dot.is_file():
        raise RuntimeFailure(
            f"TLC could not dump the state graph of {model}: "
            f"{(result.errors or [result.violated or 'no dump'])[0].splitlines()[0]}",
            f"see build/tlc/logs/graph_{model}_{os.getpid()}.log",
        )
    with dot.open() as fh:
        try:
            states, initial, edges = parse_dot(fh, keep)
        except ValueError as exc:
            raise RuntimeFailure(
                f"the state graph of {model} does not parse: {exc}",
                f"see {dot}",
            ) from None
    if result.distinct_states is not None and result.distinct_states != len(states):
        raise RuntimeFailure(
            f"the dump of {model} has {len(states)} states, TLC found {result.distinct_states}",
            f"see {dot}",
        )
    graph = StateGraph(model, constants(cfg_text), states, initial, edges)
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    with tmp.open("wb") as fh:
        pickle.dump(graph, fh, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(cached)
    shutil.rmtree(work, ignore_errors=True)
    for stale in GRAPH_DIR.glob(f"{model}-*.pickle"):
        if stale != cached:
            stale.unlink()
    return graph, False
