"""An async handler that calls an HTTP service for each event, at a bounded rate.

``htmqc run examples.http_score:score --workers 8 --topic payments --group scoring ...``
with ``SCORE_URL`` (the service, e.g. ``http://127.0.0.1:8080/score``) and
``SCORE_RATE`` (requests per second, default 50) in the environment.

Each event is POSTed to the service, at-least-once. The handler is an
``async def``: htmqc runs it on one event loop shared by its worker threads, so
``--workers 8`` means up to eight requests in flight (each worker waits for its
own call: per-key order holds) over one connection pool (:data:`CLIENTS`), and
one :class:`RateLimit` (a token bucket) keeps the whole consumer under
``SCORE_RATE`` requests per second, whatever the number of workers: the
service's quota, not the consumer's speed, sets the pace.

The service's answer decides the outcome, by htmqc's usual rules: 2xx is done;
a 4xx says the event itself is wrong (:class:`htmqc.Permanent`: dead-lettered
with the status and the service's text, never retried); a 5xx, a timeout or a
refused connection is worth another try (:class:`htmqc.Retryable`: retried with
backoff, then dead-lettered if it never succeeds).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx

from htmqc import Permanent, Retryable


class RateLimit:
    """A token bucket for one event loop: :meth:`take` returns once a request may
    go, at most ``rate`` per second on average, bursts up to ``burst``. Waiters
    are served in arrival order (one lock), so no call starves."""

    def __init__(self, rate: float, burst: int = 1) -> None:
        if not rate > 0 or burst < 1:
            raise ValueError(f"a rate limit needs rate > 0 and burst >= 1, not {rate}, {burst}")
        self.rate, self.burst = rate, burst
        self._tokens = float(burst)
        self._at: float | None = None
        self._lock = asyncio.Lock()

    async def take(self) -> None:
        """Wait for a token, then spend it."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            now = loop.time()
            if self._at is not None:
                self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) / self.rate)
                self._at = loop.time()
                self._tokens = 1.0
            self._tokens -= 1


#: One client (connection pool) and one rate limit per event loop: htmqc runs every
#: async handler on one shared loop, so in practice there is one of each.
CLIENTS: dict[int, tuple[httpx.AsyncClient, RateLimit]] = {}


def _client() -> tuple[httpx.AsyncClient, RateLimit]:
    loop = id(asyncio.get_running_loop())
    if loop not in CLIENTS:
        rate = float(os.environ.get("SCORE_RATE", "50"))
        CLIENTS[loop] = (httpx.AsyncClient(timeout=10.0), RateLimit(rate))
    return CLIENTS[loop]


async def score(msg: Any) -> None:
    """POST the event to ``SCORE_URL`` (module docs: what each answer means)."""
    url = os.environ.get("SCORE_URL")
    if not url:
        raise RuntimeError("set SCORE_URL to the scoring service's URL")
    client, limit = _client()
    await limit.take()
    headers = {"content-type": "application/json"}
    if msg.key() is not None:
        headers["x-key"] = msg.key().decode("utf-8", "replace")
    try:
        answer = await client.post(url, content=msg.value() or b"", headers=headers)
    except httpx.HTTPError as exc:
        raise Retryable(f"scoring service unreachable: {exc!r}") from None
    if 400 <= answer.status_code < 500:
        raise Permanent(f"scoring service refused the event: {answer.status_code} "
                        f"{answer.text[:200]}")
    if answer.status_code >= 300:
        raise Retryable(f"scoring service answered {answer.status_code}")
