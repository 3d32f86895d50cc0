"""Draw the message lifecycle from :data:`htmqc.core.lifecycle.TRANSITIONS`.

``python -m spec.diagram`` writes ``spec/lifecycle.svg`` and refreshes the
generated blocks of ``spec/README.md`` (the transition table and a Mermaid
diagram, between ``<!-- BEGIN GENERATED: name -->`` and ``<!-- END GENERATED:
name -->``). ``python -m spec.diagram --check`` changes nothing and exits 1 if
any of them is stale. Pure Python, no Graphviz: states are placed in columns by
their distance from the initial state, forward edges are straight arrows, edges
that go back are arcs above the boxes. The output depends only on the table, so
it is byte-for-byte reproducible.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from html import escape
from pathlib import Path

from htmqc.core import lifecycle
from htmqc.core.lifecycle import Event, MessageState
from htmqc.errors import UsageError

Table = Mapping[MessageState, Mapping[Event, MessageState]]

HERE = Path(__file__).resolve().parent
SVG_PATH = HERE / "lifecycle.svg"
README_PATH = HERE / "README.md"

BOX_W, BOX_H = 150, 44
COL_GAP, ROW_GAP = 130, 70
MARGIN = 30
TOP = 80  # room above the boxes for the arcs of edges that go back


def layers(table: Table, initial: MessageState) -> dict[MessageState, int]:
    """Each state's distance (in edges) from ``initial``; unreachable states last."""
    depth = {initial: 0}
    frontier = [initial]
    while frontier:
        following = []
        for state in frontier:
            for target in table.get(state, {}).values():
                if target not in depth:
                    depth[target] = depth[state] + 1
                    following.append(target)
        frontier = following
    last = max(depth.values()) + 1
    return {s: depth.get(s, last) for s in table}


def positions(table: Table, initial: MessageState) -> dict[MessageState, tuple[int, int]]:
    """Top-left corner of every state's box: column by layer, row by enum order."""
    depth = layers(table, initial)
    rows: dict[int, int] = {}
    out = {}
    for state in table:  # table order is enum order: deterministic
        col = depth[state]
        row = rows.get(col, 0)
        rows[col] = row + 1
        out[state] = (MARGIN + col * (BOX_W + COL_GAP), TOP + row * (BOX_H + ROW_GAP))
    return out


def render_svg(
    table: Table = lifecycle.TRANSITIONS,
    initial: MessageState = lifecycle.INITIAL,
    finished: frozenset[MessageState] = lifecycle.FINISHED,
) -> str:
    """The lifecycle as a standalone SVG document."""
    pos = positions(table, initial)
    width = max(x for x, _ in pos.values()) + BOX_W + MARGIN
    height = max(y for _, y in pos.values()) + BOX_H + MARGIN + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="13">',
        "<title>htmqc message lifecycle (generated from htmqc.core.lifecycle.TRANSITIONS)"
        "</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"/>'
        "</marker></defs>",
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    for source, row in table.items():
        for event, target in row.items():
            out.append(_edge(pos[source], pos[target], event.value))
    for state, (x, y) in pos.items():
        out.append(_box(x, y, state, state is initial, state in finished))
    legend_y = height - 20
    out.append(
        f'<text x="{MARGIN}" y="{legend_y}" fill="#555">double border: finished '
        "(no longer holds back the watermark); bold: initial state</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _box(x: int, y: int, state: MessageState, initial: bool, finished: bool) -> str:
    weight = ' font-weight="bold"' if initial else ""
    parts = [
        f'<g id="state-{state.value}">',
        f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="8" fill="#eef3fb" '
        'stroke="black"/>',
    ]
    if finished:
        parts.append(
            f'<rect x="{x + 4}" y="{y + 4}" width="{BOX_W - 8}" height="{BOX_H - 8}" rx="6" '
            'fill="none" stroke="black"/>'
        )
    parts.append(
        f'<text x="{x + BOX_W // 2}" y="{y + BOX_H // 2 + 5}" text-anchor="middle"{weight}>'
        f"{escape(state.value)}</text></g>"
    )
    return "".join(parts)


def _edge(src: tuple[int, int], dst: tuple[int, int], label: str) -> str:
    (sx, sy), (dx, dy) = src, dst
    text = escape(label)
    if dx > sx:  # forward: right side of the source to the left side of the target
        x1, y1, x2, y2 = sx + BOX_W, sy + BOX_H // 2, dx, dy + BOX_H // 2
        lx, ly = (x1 + x2) // 2, (y1 + y2) // 2 - 6
        # A slanted edge's label runs along it, so the edges fanning out of one
        # state keep their labels apart.
        angle = math.degrees(math.atan2(y2 - y1, x2 - x1))
        turn = f' transform="rotate({angle:.1f} {lx} {ly})"' if y1 != y2 else ""
        return (
            f'<g class="edge"><line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="black" '
            f'marker-end="url(#arrow)"/><text x="{lx}" y="{ly}" text-anchor="middle"{turn} '
            f'fill="#1a4d8f">{text}</text></g>'
        )
    # back (or same column): an arc above the boxes, top to top
    x1, y1, x2, y2 = sx + BOX_W // 2, sy, dx + BOX_W // 2, dy
    cy = min(y1, y2) - 60
    lx, ly = (x1 + x2) // 2, cy + 8
    return (
        f'<g class="edge"><path d="M{x1},{y1} C{x1},{cy} {x2},{cy} {x2},{y2}" fill="none" '
        f'stroke="black" marker-end="url(#arrow)"/><text x="{lx}" y="{ly}" '
        f'text-anchor="middle" fill="#1a4d8f">{text}</text></g>'
    )


def render_table(
    table: Table = lifecycle.TRANSITIONS, finished: frozenset[MessageState] = lifecycle.FINISHED
) -> str:
    """The transitions as a Markdown table, one row per edge, then the terminal states."""
    lines = ["| from | event | to | finishes the offset |", "|---|---|---|---|"]
    for source, row in table.items():
        for event, target in row.items():
            done = "yes" if target in finished else "no"
            lines.append(f"| {source.value} | `{event.value}` | {target.value} | {done} |")
    terminal = [s.value for s, row in table.items() if not row]
    lines.append("")
    lines.append(f"Terminal states (no event leaves them): {', '.join(terminal)}.")
    return "\n".join(lines)


def render_mermaid(
    table: Table = lifecycle.TRANSITIONS,
    initial: MessageState = lifecycle.INITIAL,
    finished: frozenset[MessageState] = lifecycle.FINISHED,
) -> str:
    """The lifecycle as a Mermaid ``stateDiagram-v2`` block."""
    lines = ["```mermaid", "stateDiagram-v2", f"    [*] --> {initial.value}"]
    for source, row in table.items():
        for event, target in row.items():
            lines.append(f"    {source.value} --> {target.value}: {event.value}")
    lines.extend(f"    {s.value} --> [*]" for s in table if s in finished)
    lines.append("```")
    return "\n".join(lines)


def _block(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- BEGIN GENERATED: {name} -->\n).*?(<!-- END GENERATED: {name} -->)", re.S
    )


def _filler(body: str) -> Callable[[re.Match[str]], str]:
    def fill(match: re.Match[str]) -> str:
        return f"{match.group(1)}{body}\n{match.group(2)}"

    return fill


def update_markdown(text: str, table: Table = lifecycle.TRANSITIONS) -> str:
    """``text`` with its generated blocks (``transitions``, ``mermaid``) refreshed.

    :raises UsageError: a marker pair is missing.
    """
    for name, body in (("transitions", render_table(table)), ("mermaid", render_mermaid(table))):
        pattern = _block(name)
        if not pattern.search(text):
            raise UsageError(
                f"spec/README.md has no GENERATED: {name} block",
                f"add '<!-- BEGIN GENERATED: {name} -->' and '<!-- END GENERATED: {name} -->'",
            )
        text = pattern.sub(_filler(body), text)
    return text


def stale_files(svg: Path | None = None, readme: Path | None = None) -> list[str]:
    """The generated files whose content differs from a fresh rendering
    (default: ``spec/lifecycle.svg`` and ``spec/README.md``)."""
    svg = svg or SVG_PATH
    readme = readme or README_PATH
    stale = []
    if not svg.exists() or svg.read_text() != render_svg():
        stale.append(str(svg))
    current = readme.read_text()
    if update_markdown(current) != current:
        stale.append(str(readme))
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or with ``--check`` verify) the generated diagram and README blocks."""
    parser = argparse.ArgumentParser(prog="python -m spec.diagram", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a file is stale")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = stale_files()
            if stale:
                print(f"stale: {', '.join(stale)}; run python -m spec.diagram", file=sys.stderr)
                return 1
            print("spec/lifecycle.svg and spec/README.md are current")
            return 0
        readme = update_markdown(README_PATH.read_text())
        SVG_PATH.write_text(render_svg())
        README_PATH.write_text(readme)
    except UsageError as exc:
        print(exc.line(), file=sys.stderr)
        return exc.exit_code
    print(f"wrote {SVG_PATH.relative_to(HERE.parent)} and refreshed {README_PATH.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
