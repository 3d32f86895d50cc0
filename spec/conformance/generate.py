"""Generate the conformance vectors from the reference model.

Every vector is a list of steps; each step is one event, the answer the
reference model (:class:`model_checks.reference.ReferenceConsumer`) gives, and
its snapshot afterwards. The scenarios below are written by hand to cover one
topic each; the ``random_*`` vectors are seeded random walks. Generation is
deterministic: ``python -m spec.conformance.generate`` rewrites
``spec/conformance/vectors/``, ``--check`` fails if the committed files differ.
See ``spec/conformance/README.md`` for the format.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from model_checks.reference import ReferenceConsumer, RefError
from spec.conformance.replay import parse_tp as _tp

VECTORS = Path(__file__).resolve().parent / "vectors"
FORMAT = 1
MAX_RETRIES = 3

#: Reference refusals that the core reports as OffsetOrderError; every other
#: refusal is an IllegalTransition.
_ORDER_ERRORS = {"order", "end", "bad start"}


class Recorder:
    """Drives the reference model and records every step."""

    def __init__(self) -> None:
        self.ref = ReferenceConsumer(max_retries=MAX_RETRIES)
        self.steps: list[dict[str, Any]] = []

    def _do(self, op: str, args: dict[str, Any], call: Callable[[], Any]) -> Any:
        before = self.ref.snapshot()
        step: dict[str, Any] = {"op": op, "args": args}
        try:
            result = call()
        except RefError as exc:
            if self.ref.snapshot() != before:
                raise AssertionError(f"reference changed state on a refused {op}") from exc
            step["error"] = "OffsetOrderError" if str(exc) in _ORDER_ERRORS else "IllegalTransition"
            result = None
        else:
            step["result"] = result
        step["state"] = self.ref.snapshot()
        self.steps.append(step)
        return result

    # one method per event, named as in ConsumerCore ------------------------------------

    def assign(
        self, tp: str, committed: int, finished_above: Sequence[int] = (), op: str = "assign"
    ) -> int:
        """Returns the epoch, or 0 when the model refused."""
        args = {"tp": tp, "committed": committed, "finished_above": list(finished_above)}
        epoch = self._do(op, args, lambda: self.ref.assign(_tp(tp), committed, finished_above))
        return int(epoch or 0)

    def restored(self, tp: str, committed: int, finished_above: Sequence[int] = ()) -> int:
        return self.assign(tp, committed, finished_above, op="restored")

    def fetched(self, tp: str, epoch: int, offsets: Sequence[int], end: int | None = None) -> Any:
        args = {"tp": tp, "epoch": epoch, "offsets": list(offsets), "end": end}
        batch = list(offsets)
        return self._do("fetched", args, lambda: self.ref.fetched(_tp(tp), epoch, batch, end))

    def event(self, name: str, tp: str, epoch: int, offset: int | Sequence[int]) -> Any:
        if isinstance(offset, int):
            args: dict[str, Any] = {"tp": tp, "epoch": epoch, "offset": offset}
            batch = [offset]
        else:
            args = {"tp": tp, "epoch": epoch, "offsets": list(offset)}
            batch = list(offset)
        return self._do(name, args, lambda: self.ref.event(name, _tp(tp), epoch, batch))

    def failed(self, tp: str, epoch: int, offset: int, permanent: bool = False) -> Any:
        args = {"tp": tp, "epoch": epoch, "offset": offset, "permanent": permanent}
        return self._do("failed", args, lambda: self.ref.failed(_tp(tp), epoch, offset, permanent))

    def commit_requested(self, tp: str) -> Any:
        return self._do("commit_requested", {"tp": tp}, lambda: self.ref.commit_requested(_tp(tp)))

    def commit_acked(self, tp: str, epoch: int, offset: int) -> Any:
        args = {"tp": tp, "epoch": epoch, "offset": offset}
        return self._do("commit_acked", args, lambda: self.ref.commit_acked(_tp(tp), epoch, offset))

    def commit_failed(self, tp: str, epoch: int, offset: int) -> Any:
        args = {"tp": tp, "epoch": epoch, "offset": offset}
        ref = self.ref
        return self._do("commit_failed", args, lambda: ref.commit_failed(_tp(tp), epoch, offset))

    def revoking(self, tp: str) -> Any:
        return self._do("revoking", {"tp": tp}, lambda: self.ref.revoking(_tp(tp)))

    def revoked(self, tp: str) -> Any:
        return self._do("revoked", {"tp": tp}, lambda: self.ref.revoked(_tp(tp)))

    def crashed(self) -> Any:
        return self._do("crashed", {}, self.ref.crashed)


T0, T1 = "orders/0", "orders/1"


# -- the hand-written scenarios ------------------------------------------------------------


def happy_path(r: Recorder) -> None:
    """Fetch, run and commit in order."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, [0, 1, 2])
    for o in (0, 1, 2):
        r.event("started", T0, e, o)
        r.event("succeeded", T0, e, o)
    r.commit_requested(T0)
    r.commit_acked(T0, e, 3)
    r.commit_requested(T0)


def gap_end_beyond_last(r: Recorder) -> None:
    """A batch whose end lies beyond its last offset: the tail is a gap."""
    e = r.assign(T0, 10)
    r.fetched(T0, e, [10, 11, 13], end=16)
    r.event("started", T0, e, [10, 11, 13])
    r.event("succeeded", T0, e, 13)
    r.event("succeeded", T0, e, 10)
    r.event("succeeded", T0, e, 11)
    r.commit_requested(T0)
    r.fetched(T0, e, [], end=20)
    r.commit_requested(T0)


def gap_batch_above_next(r: Recorder) -> None:
    """A batch starting above next: the offsets in between are a gap."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, [5, 6])
    r.commit_requested(T0)
    r.event("started", T0, e, 5)
    r.event("succeeded", T0, e, 5)
    r.commit_requested(T0)
    r.fetched(T0, e, [9])
    r.event("started", T0, e, [6, 9])
    r.event("succeeded", T0, e, [9, 6])
    r.commit_requested(T0)


def out_of_order_completion(r: Recorder) -> None:
    """Offsets finish out of order; finished_above carries them until the watermark passes."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, range(5))
    r.event("started", T0, e, [0, 1, 2, 3, 4])
    r.event("succeeded", T0, e, 3)
    r.event("succeeded", T0, e, 1)
    r.commit_requested(T0)
    r.event("succeeded", T0, e, 0)
    r.commit_requested(T0)
    r.event("succeeded", T0, e, 4)
    r.commit_requested(T0)
    r.event("succeeded", T0, e, 2)
    r.commit_requested(T0)


def failures_retries_dead_letter(r: Recorder) -> None:
    """Retryable failures are retried max_retries times, then dead-lettered; permanent
    failures are dead-lettered at once."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, [0, 1])
    r.event("started", T0, e, [0, 1])
    for _ in range(MAX_RETRIES):
        r.failed(T0, e, 0)
        r.event("retry_due", T0, e, 0)
    r.failed(T0, e, 0)
    r.event("retry_due", T0, e, 0)
    r.event("dead_lettered", T0, e, 0)
    r.failed(T0, e, 1, permanent=True)
    r.event("dead_lettered", T0, e, 1)
    r.commit_requested(T0)


def acks_late_duplicate_out_of_order(r: Recorder) -> None:
    """Acks may arrive late, twice or in the wrong order; only a newer one moves committed."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, range(4))
    r.event("started", T0, e, [0, 1, 2, 3])
    r.event("succeeded", T0, e, [0, 1])
    r.commit_requested(T0)
    r.event("succeeded", T0, e, [2, 3])
    r.commit_requested(T0)
    r.commit_acked(T0, e, 4)
    r.commit_acked(T0, e, 2)
    r.commit_acked(T0, e, 4)
    r.commit_acked(T0, e, 5)
    r.commit_requested(T0)


def failed_commits(r: Recorder) -> None:
    """A failed commit is requested again, even if nothing new finished."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, [0, 1])
    r.event("started", T0, e, [0, 1])
    r.event("succeeded", T0, e, 0)
    r.commit_requested(T0)
    r.commit_failed(T0, e, 1)
    r.commit_requested(T0)
    r.commit_acked(T0, e, 1)
    r.commit_failed(T0, e, 1)
    r.commit_requested(T0)
    r.commit_requested(T0)


def revoke_assign_stale_epoch(r: Recorder) -> None:
    """Revoking stops new work; after revoke and a new assignment, events of the old
    epoch are ignored."""
    e1 = r.assign(T0, 0)
    r.fetched(T0, e1, [0, 1, 2])
    r.event("started", T0, e1, [0, 1])
    r.revoking(T0)
    r.event("started", T0, e1, 2)
    r.fetched(T0, e1, [3])
    r.event("succeeded", T0, e1, 0)
    r.failed(T0, e1, 1)
    r.revoked(T0)
    r.event("retry_due", T0, e1, 1)
    e2 = r.assign(T0, 1)
    r.event("succeeded", T0, e1, 1)
    r.commit_acked(T0, e1, 1)
    r.fetched(T0, e1, [1, 2])
    r.fetched(T0, e2, [1, 2])
    r.failed(T0, e1, 1)
    r.commit_failed(T0, e1, 1)
    r.event("started", T0, e2, 1)
    r.event("succeeded", T0, e2, 1)
    r.commit_requested(T0)


def crash_restore_finished_above(r: Recorder) -> None:
    """After a crash the partition restarts from the commit; offsets the sink already
    holds (finished_above) are not handed out again."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, range(5))
    r.event("started", T0, e, [0, 1, 2, 3, 4])
    r.event("succeeded", T0, e, [0, 2, 4])
    r.commit_requested(T0)
    r.crashed()
    r.event("succeeded", T0, e, 1)
    e2 = r.restored(T0, 1, [2, 4])
    r.fetched(T0, e2, [1, 2, 3])
    r.fetched(T0, e2, [4, 5])
    r.event("started", T0, e2, [1, 3, 5])
    r.event("succeeded", T0, e2, [3, 1])
    r.commit_requested(T0)
    r.event("succeeded", T0, e2, 5)
    r.commit_requested(T0)


def illegal_events(r: Recorder) -> None:
    """Events a correct runtime never sends are refused and change nothing."""
    r.assign(T0, -1)
    e = r.assign(T0, 5, [5])
    e = r.assign(T0, 5, [7])
    r.assign(T0, 0)
    r.fetched(T0, e, [4])
    r.fetched(T0, e, [6, 5])
    r.fetched(T0, e, [5, 5])
    r.fetched(T0, e, [5, 6], end=6)
    r.fetched(T0, e, [], end=4)
    r.fetched(T0, e, [5, 6, 7, 8])
    r.event("succeeded", T0, e, 5)
    r.event("started", T0, e, 5)
    r.event("started", T0, e, 5)
    r.event("started", T0, e, 7)
    r.event("started", T0, e, 9)
    r.event("succeeded", T0, e, 5)
    r.event("succeeded", T0, e, 5)
    r.event("retry_due", T0, e, 6)
    r.event("dead_lettered", T0, e, 6)
    r.commit_acked(T0, e, 7)
    r.failed(T0, e, 6)


def batch_events(r: Recorder) -> None:
    """Batch forms move every offset or none."""
    e = r.assign(T0, 0)
    r.fetched(T0, e, range(6))
    r.event("started", T0, e, [0, 1, 2])
    r.event("started", T0, e, [3, 2])
    r.event("started", T0, e, [3, 3])
    r.event("started", T0, e, [3, 4, 5])
    r.event("succeeded", T0, e, [1, 0, 9])
    r.event("succeeded", T0, e, [1, 0])
    r.failed(T0, e, 2, permanent=True)
    r.failed(T0, e, 3, permanent=True)
    r.event("dead_lettered", T0, e, [3, 2])
    r.event("succeeded", T0, e, [])
    r.commit_requested(T0)


def two_partitions(r: Recorder) -> None:
    """Partitions are independent; epochs count per consumer, not per partition."""
    a = r.assign(T0, 0)
    b = r.assign(T1, 100)
    r.fetched(T1, b, [100, 101])
    r.fetched(T0, a, [0])
    r.event("started", T1, b, 101)
    r.event("started", T0, a, 0)
    r.event("succeeded", T1, b, 101)
    r.event("succeeded", T0, a, 0)
    r.commit_requested(T0)
    r.commit_requested(T1)
    r.event("succeeded", T0, b, 0)
    r.revoked(T1)
    b2 = r.assign(T1, 100, [101])
    r.fetched(T1, b2, [100, 101, 102])
    r.commit_acked(T0, a, 1)


SCENARIOS: dict[str, Callable[[Recorder], None]] = {
    f.__name__: f
    for f in (
        happy_path,
        gap_end_beyond_last,
        gap_batch_above_next,
        out_of_order_completion,
        failures_retries_dead_letter,
        acks_late_duplicate_out_of_order,
        failed_commits,
        revoke_assign_stale_epoch,
        crash_restore_finished_above,
        illegal_events,
        batch_events,
        two_partitions,
    )
}


# -- seeded random walks -------------------------------------------------------------------


def random_walk(r: Recorder, seed: int, steps: int = 60) -> None:
    """Mostly legal events chosen from the model's state, with some illegal and
    stale ones mixed in."""
    rng = random.Random(seed)
    epochs: dict[str, int] = {}
    stale: list[tuple[str, int]] = []
    while len(r.steps) < steps:
        _random_step(r, rng, epochs, stale)


def _random_step(
    r: Recorder, rng: random.Random, epochs: dict[str, int], stale: list[tuple[str, int]]
) -> None:
    """One step of :func:`random_walk`, on a random partition."""
    tp = rng.choice([T0, T1])
    part = r.ref.parts.get(_tp(tp))
    if part is None:
        start = rng.randrange(0, 5)
        above = sorted(rng.sample(range(start + 1, start + 6), rng.randrange(0, 3)))
        epochs[tp] = r.assign(tp, start, above)
        return
    e = epochs[tp]
    by_state: dict[str, list[int]] = {}
    for o, state in sorted(part.states.items()):
        by_state.setdefault(state, []).append(o)

    def pick(state: str) -> int:
        return rng.choice(by_state[state])

    def fetch() -> None:
        first = part.next + rng.choice([0, 0, 0, 1])
        offsets = [o for o in range(first, first + rng.randrange(1, 4)) if rng.random() < 0.8]
        if offsets and rng.random() < 0.5:
            r.fetched(tp, e, offsets)  # end defaults to one past the last offset
        else:
            r.fetched(tp, e, offsets, (offsets[-1] + 1 if offsets else first) + rng.randrange(2))

    def commit() -> None:
        offset = r.commit_requested(tp)
        if offset is not None and rng.random() < 0.8:
            r.commit_acked(tp, e, offset)
        elif offset is not None:
            r.commit_failed(tp, e, offset)

    def stale_event() -> None:
        old_tp, old_e = rng.choice(stale)
        r.event("succeeded", old_tp, old_e, rng.randrange(0, 10))

    def crash() -> None:
        stale.extend(epochs.items())
        r.crashed()

    def revoke() -> None:
        stale.append((tp, e))
        r.revoked(tp)

    def illegal() -> None:
        name = rng.choice(["started", "succeeded", "retry_due", "dead_lettered"])
        r.event(name, tp, e, rng.randrange(0, part.next + 3))

    candidates: list[tuple[float, Callable[[], object]]] = [
        (3.0 if not part.draining else 0.2, fetch),
        (1.5, commit),
        (0.4, lambda: r.commit_acked(tp, e, rng.randrange(0, part.next + 2))),
        (0.3, lambda: r.revoking(tp)),
        (0.3, revoke),
        (0.15, crash),
        (0.6 if stale else 0.0, stale_event),
        (0.5, illegal),
    ]
    if "Pending" in by_state:
        candidates.append((3.0, lambda: r.event("started", tp, e, pick("Pending"))))
    if "Processing" in by_state:
        candidates.append((3.0, lambda: r.event("succeeded", tp, e, pick("Processing"))))
        candidates.append(
            (1.5, lambda: r.failed(tp, e, pick("Processing"), permanent=rng.random() < 0.2))
        )
    if "Retrying" in by_state:
        candidates.append((1.5, lambda: r.event("retry_due", tp, e, pick("Retrying"))))
    if "Failed" in by_state:
        candidates.append((1.5, lambda: r.event("dead_lettered", tp, e, pick("Failed"))))
    weights = [w for w, _ in candidates]
    rng.choices([act for _, act in candidates], weights)[0]()


RANDOM_SEEDS = (1, 2, 3)


# -- files ---------------------------------------------------------------------------------


def vectors() -> dict[str, dict[str, Any]]:
    """Every vector, by file stem, generated afresh."""
    out = {}
    for name, scenario in SCENARIOS.items():
        r = Recorder()
        scenario(r)
        out[name] = _vector(name, (scenario.__doc__ or "").strip(), r)
    for seed in RANDOM_SEEDS:
        r = Recorder()
        random_walk(r, seed)
        out[f"random_{seed}"] = _vector(f"random_{seed}", f"Seeded random walk, seed {seed}.", r)
    return out


def _vector(name: str, description: str, r: Recorder) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "name": name,
        "description": " ".join(description.split()),
        "max_retries": MAX_RETRIES,
        "steps": r.steps,
    }


def dumps(vector: dict[str, Any]) -> str:
    """One vector as JSON text: header fields first, one step per line."""
    head = {k: v for k, v in vector.items() if k != "steps"}
    lines = [json.dumps(head, sort_keys=True)[:-1] + ', "steps": [']
    steps = [json.dumps(s, sort_keys=True) for s in vector["steps"]]
    lines.extend(f"  {s}," for s in steps[:-1])
    lines.extend(f"  {s}" for s in steps[-1:])
    lines.append("]}")
    return "\n".join(lines) + "\n"


def stale_files(folder: Path = VECTORS) -> list[str]:
    """Vector files that are missing, differ from a fresh generation, or are extra."""
    fresh = {f"{name}.json": dumps(v) for name, v in vectors().items()}
    present = {p.name for p in folder.glob("*.json")}
    stale = sorted(present - set(fresh))
    for name, text in fresh.items():
        path = folder / name
        if not path.exists() or path.read_text() != text:
            stale.append(name)
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    """Write the vectors, or with ``--check`` report stale ones and exit 1."""
    parser = argparse.ArgumentParser(prog="python -m spec.conformance.generate")
    parser.add_argument("--check", action="store_true", help="fail if a vector file is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print(f"stale vectors: {', '.join(stale)}; run python -m spec.conformance.generate",
                  file=sys.stderr)
            return 1
        print(f"{len(vectors())} vectors are current")
        return 0
    VECTORS.mkdir(parents=True, exist_ok=True)
    fresh = vectors()
    for old in VECTORS.glob("*.json"):
        if old.stem not in fresh:
            old.unlink()
    for name, vector in fresh.items():
        (VECTORS / f"{name}.json").write_text(dumps(vector))
    total = sum(len(v["steps"]) for v in fresh.values())
    print(f"wrote {len(fresh)} vectors ({total} steps) to {VECTORS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
