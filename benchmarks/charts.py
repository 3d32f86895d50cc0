"""PNG charts of ``benchmarks/results/peers.json`` (matplotlib, no display).

``python -m benchmarks.charts [PEERS_JSON]`` redraws them from a stored
result; :func:`write_charts` is what ``python -m benchmarks.peers`` calls.

- ``peers_throughput.png``: median msg/s per contender, one bar group per
  value size, each bar labelled with its ratio to the raw loop;
- ``peers_latency_cdf.png``: cumulative distribution of end-to-end latency
  per contender (log-scaled milliseconds), when latency was measured; dashed
  lines for contenders whose latency ends at the transaction commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def throughput_chart(doc: dict[str, Any], path: Path) -> Path:
    """Grouped horizontal bars: median msg/s per slot and size."""
    plt = _pyplot()
    sizes = list(doc["throughput"])
    keys = [k for k in doc["slots"] if any(k in doc["throughput"][s] for s in sizes)]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(keys) * len(sizes) + 1.5))
    height = 0.8 / max(1, len(sizes))
    for i, size in enumerate(sizes):
        by_slot = doc["throughput"][size]
        raw = (by_slot.get("raw") or {}).get("rate")
        rates = [(by_slot.get(k) or {}).get("rate") or 0 for k in keys]
        ys = [n + i * height for n in range(len(keys))]
        bars = ax.barh(ys, rates, height=height, label=f"{size} B values")
        for bar, rate in zip(bars, rates, strict=True):
            text = f"{rate:,.0f}" + (f" ({rate / raw:.2f}× raw)" if raw and rate else "")
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + text,
                    va="center", fontsize=7)
    ax.set_yticks([n + height * (len(sizes) - 1) / 2 for n in range(len(keys))])
    ax.set_yticklabels([doc["slots"][k]["label"] for k in keys], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("messages per second (median, first to last message)")
    ax.set_title(f"Throughput, {doc['count']:,} messages, {doc['partitions']} partitions")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_xlim(0, max([1.0] + [(v or {}).get("rate") or 0 for s in sizes
                                for v in doc["throughput"][s].values()]) * 1.35)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_chart(doc: dict[str, Any], path: Path) -> Path | None:
    """CDF of latency samples per slot; None when latency was not measured."""
    lat = {k: v for k, v in (doc.get("latency") or {}).items() if v.get("samples_ms")}
    if not lat:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for key, v in lat.items():
        xs = sorted(max(0.01, x) for x in v["samples_ms"])
        ys = [(n + 1) / len(xs) for n in range(len(xs))]
        commit = v.get("ends_at") == "commit"
        ax.step(xs, ys, where="post", linestyle="--" if commit else "-",
                label=doc["slots"][key]["label"] + (" (to commit)" if commit else ""))
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency, ms (log)")
    ax.set_ylabel("fraction of messages")
    first = next(iter(lat.values()))
    ax.set_title(f"End-to-end latency CDF at {first['offered_rate']:,.0f} msg/s offered\n"
                 "solid: produce → handler done; dashed: produce → transaction committed",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_charts(doc: dict[str, Any], directory: Path = RESULTS, suffix: str = "") -> list[Path]:
    """Draw every chart ``doc`` has data for into ``directory``; their paths.
    ``suffix``: added to the names (``-kafka``: :func:`benchmarks.brokers.suffix`)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = [throughput_chart(doc, directory / f"peers_throughput{suffix}.png")]
    cdf = latency_chart(doc, directory / f"peers_latency_cdf{suffix}.png")
    if cdf is not None:
        written.append(cdf)
    return written


if __name__ == "__main__":
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS / "peers.json"
    # peers-kafka.json draws peers_throughput-kafka.png, ...
    suffix = source.stem.removeprefix("peers")
    for chart in write_charts(json.loads(source.read_text()), source.parent, suffix):
        print(chart)
