"""``htmqc inspect``: show a running consumer's live state in the terminal.

Reads ``/state.json`` from the observability server (``--metrics-port`` of
``htmqc run``; schema in :mod:`htmqc.observe.state`) and prints one table: a
row per partition with its offsets, lag, in-flight and out-of-order counts, and
a summary line with the flow window and dead-letter counts. ``--watch``
refreshes it in place until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from htmqc.errors import RuntimeFailure, UsageError

_TIMEOUT = 5.0


def register(subparsers: Any) -> None:
    """Add the ``inspect`` subcommand."""
    parser = subparsers.add_parser(
        "inspect",
        help="show a running consumer's partitions, offsets and flow window",
        description=(
            "Read /state.json from a running consumer's observability server (the"
            " --metrics-port of 'htmqc run') and print a row per partition: offsets,"
            " lag, in-flight and out-of-order counts, plus the flow window and"
            " dead-letter counts. --watch refreshes until Ctrl-C."
        ),
    )
    parser.add_argument(
        "--url",
        required=True,
        help="the consumer's observability server, e.g. http://127.0.0.1:9108",
    )
    parser.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between refreshes (--watch)"
    )
    parser.set_defaults(func=run)


def state_url(url: str) -> str:
    """The ``/state.json`` address for a server URL given by the user.

    :raises UsageError: not an http(s) URL with a host.
    """
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(
            f"--url {url!r} is not an http URL",
            "give the observability server's address, e.g. --url http://127.0.0.1:9108",
        )
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError:
        raise UsageError(
            f"--url {url!r} has an invalid port", "use a port number 1-65535"
        ) from None
    path = parts.path.rstrip("/")
    if path.endswith("/state.json"):
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    if path.endswith("/state"):
        path = path[: -len("/state")]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path + "/state.json", "", ""))


def fetch_state(url: str, timeout: float = _TIMEOUT) -> dict[str, Any]:
    """GET and decode the state document.

    :raises RuntimeFailure: unreachable, not answering 200, or not a state document.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise RuntimeFailure(
            f"{url} answered HTTP {exc.code}",
            "check that --url points at htmqc's metrics port",
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RuntimeFailure(
            f"cannot reach {url}: {reason}",
            "check that the consumer runs with --metrics-port and the URL is right",
        ) from None
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), list):
        raise RuntimeFailure(
            f"{url} did not return an htmqc state document",
            "check that --url points at htmqc's metrics port",
        )
    return doc


def _cell(value: Any) -> str:
    return "–" if value is None else str(value)


def render(doc: dict[str, Any]) -> Group:
    """The state document as a rich table and a summary line."""
    table = Table(title="htmqc partitions", title_justify="left", expand=False, box=box.SIMPLE_HEAD)
    for name in ("partition", "epoch", "committed", "processed", "next", "high", "lag"):
        table.add_column(name, justify="left" if name == "partition" else "right", no_wrap=True)
    table.add_column("in flight", justify="right", no_wrap=True)
    table.add_column("out of order", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for p in doc["partitions"]:
        status = []
        if p.get("paused"):
            status.append("[magenta]paused[/]")
        if p.get("draining"):
            status.append("[yellow]draining[/]")
        table.add_row(
            Text(str(p.get("name", f"{p['topic']}/{p['partition']}"))),
            _cell(p.get("epoch")),
            _cell(p.get("committed")),
            _cell(p.get("processed")),
            _cell(p.get("next")),
            _cell(p.get("high")),
            _cell(p.get("lag")),
            _cell(p.get("in_flight_count")),
            _cell(len(p.get("finished_above", ()))),
            " ".join(status) or "[green]running[/]",
        )
    flow = doc.get("flow")
    window = (
        f"window {flow['window']} (limit {flow['limit']}{', paused' if flow['paused'] else ''})"
        if flow
        else "no flow window"
    )
    dlq = doc.get("dlq") or {}
    dlq_text = ", ".join(f"{k} {n}" for k, n in dlq.items()) or "none"
    summary = Text(
        f"in flight {doc.get('in_flight', 0)} · {window} · "
        f"paused partitions {doc.get('paused_partitions', 0)} · dead letters: {dlq_text}"
    )
    if not doc["partitions"]:
        summary.append("\nno partitions assigned")
    return Group(table, summary)


def run(args: argparse.Namespace) -> int:
    """Print the state once, or refresh it with ``--watch``."""
    url = state_url(args.url)
    if args.interval <= 0:
        raise UsageError(f"--interval {args.interval} must be positive", "e.g. --interval 1")
    console = Console()
    if not console.is_terminal:  # piped: do not squeeze the table into 80 columns
        console = Console(width=max(console.width, 120))
    if not args.watch:
        console.print(render(fetch_state(url)))
        return 0
    with Live(render(fetch_state(url)), console=console, auto_refresh=False) as live:
        while True:
            time.sleep(args.interval)
            live.update(render(fetch_state(url)), refresh=True)
