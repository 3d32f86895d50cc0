"""One small, read-only HTTP server for metrics and the live state.

Routes (GET and HEAD only; anything else is ``405``)::

    /metrics      Prometheus text format (from :class:`~htmqc.observe.metrics.Metrics`)
    /state.json   the state document (:mod:`htmqc.observe.state`), with ``health``
                  (live and ready, asked at request time) when a ``health`` is given
    /state        the live page (``page.html``), refreshing from /state.json: a bar
                  per partition, to scale with an axis, sortable by lag; health and
                  the circuit breaker
    /healthz      liveness: 200 ``ok``, or 503 and the reason (``health.live()``)
    /readyz       readiness: 200 ``ready``, or 503 and the reason (``health.ready()``)

Without a ``health`` (:class:`Health`), ``/healthz`` is always ``ok`` and
``/readyz`` follows it. A client that goes away mid-answer is dropped quietly
(no traceback on stderr).

Safety: binds to ``127.0.0.1`` unless ``host`` is given explicitly. Each
connection has ``request_timeout`` seconds, in total, to send its request head
(a deadline, not an idle timeout, so a client dribbling one byte at a time is
cut off too), heads are capped at ``MAX_HEAD`` bytes, one request per
connection, and at most ``max_connections`` connections are served at once
(more are closed at once). Handlers run in daemon threads; the server itself
runs in one daemon thread between :meth:`ObserveServer.start` and
:meth:`ObserveServer.stop`.
"""

from __future__ import annotations

import io
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST

from htmqc.errors import RuntimeFailure
from htmqc.observe.metrics import Metrics
from htmqc.observe.state import StateSource, health_state

#: Largest request head accepted, bytes.
MAX_HEAD = 16 * 1024
_END_OF_HEAD = b"\r\n\r\n"


class Health(Protocol):
    """What ``/healthz`` and ``/readyz`` ask; each answer is ``(ok, reason)`` and
    must not block (read plain attributes, take no lock the engine holds)."""

    def live(self) -> tuple[bool, str]:
        """Whether the process is doing its work (else it should be restarted)."""
        ...

    def ready(self) -> tuple[bool, str]:
        """Whether it is consuming (else traffic and alerts should look elsewhere)."""
        ...


def _probe(check: Any, word: str) -> Any:
    """A route answering ``check()``: 200 ``word`` or 503 with the reason."""

    def answer() -> tuple[int, bytes]:
        ok, reason = check()
        return (200, f"{word}\n".encode()) if ok else (503, f"{reason}\n".encode())

    return answer


def _page() -> bytes:
    return resources.files("htmqc.observe").joinpath("page.html").read_bytes()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "htmqc-observe"
    sys_version = ""

    def handle(self) -> None:
        # Read the whole head under a deadline ourselves, then let
        # BaseHTTPRequestHandler parse it from memory.
        head = _read_head(self.connection, self.server.request_timeout)
        if head is None:
            self.close_connection = True
            return
        self.rfile = io.BytesIO(head)
        self.close_connection = True
        self.handle_one_request()

    def do_GET(self) -> None:
        self._respond(send_body=True)

    def do_HEAD(self) -> None:
        self._respond(send_body=False)

    def _not_allowed(self) -> None:
        self.send_response(405)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _respond(self, *, send_body: bool) -> None:
        path = self.path.split("?", 1)[0]
        try:
            route = self.server.routes.get(path)
            if route is None:
                status, ctype, body = 404, "text/plain; charset=utf-8", b"not found\n"
            else:
                ctype, make = route
                answer = make()
                status, body = answer if isinstance(answer, tuple) else (200, answer)
        except Exception as exc:  # a broken source answers 500, the server lives on
            status, ctype = 500, "text/plain; charset=utf-8"
            body = f"state unavailable: {type(exc).__name__}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (BrokenPipeError, ConnectionResetError):  # the client went away
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: scrapes every few seconds would flood stderr."""


def _read_head(conn: socket.socket, timeout: float) -> bytes | None:
    """The request head, or ``None`` if it was not complete within ``timeout``
    seconds, was too big, or the client went away."""
    deadline = time.monotonic() + timeout
    buf = bytearray()
    while _END_OF_HEAD not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or len(buf) > MAX_HEAD:
            return None
        conn.settimeout(remaining)
        try:
            chunk = conn.recv(4096)
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    conn.settimeout(timeout)  # for writing the answer
    return bytes(buf)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(
        self,
        address: tuple[str, int],
        routes: dict[str, tuple[str, Any]],
        request_timeout: float,
        max_connections: int,
    ) -> None:
        self.routes = routes
        self.request_timeout = request_timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return  # the client went away: nothing to report
        super().handle_error(request, client_address)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class ObserveServer:
    """Serves ``/metrics``, ``/state.json``, ``/state``, ``/healthz`` and ``/readyz``
    (module docs).

    ``metrics`` may be ``None`` (then ``/metrics`` is 404); ``source`` defaults to
    ``metrics.source``.
    """

    def __init__(
        self,
        metrics: Metrics | None = None,
        source: StateSource | None = None,
        *,
        host: str = "127.0.0.1",
        request_timeout: float = 5.0,
        max_connections: int = 32,
        health: Health | None = None,
    ) -> None:
        if source is None and metrics is not None:
            source = metrics.source
        if source is None:
            raise ValueError("ObserveServer needs a state source (or metrics with one)")
        self.metrics = metrics
        self.source = source
        self.host = host
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self.health = health
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def _state_json(self) -> bytes:
        """``/state.json``: the source's document, plus ``health`` (asked now) when
        the server has a ``health`` (:func:`~htmqc.observe.state.health_state`).
        The source's document is never modified (a snapshot is shared)."""
        doc = self.source.state()
        health = self.health
        if health is not None:
            doc = {**doc, "health": health_state(health.live(), health.ready())}
        return json.dumps(doc, separators=(",", ":")).encode()

    def _routes(self) -> dict[str, tuple[str, Any]]:
        page = _page()
        routes: dict[str, tuple[str, Any]] = {
            "/state.json": ("application/json", self._state_json),
            "/state": ("text/html; charset=utf-8", lambda: page),
            "/": ("text/html; charset=utf-8", lambda: page),
        }
        text = "text/plain; charset=utf-8"
        health = self.health
        if health is None:
            routes["/healthz"] = (text, lambda: b"ok\n")
            routes["/readyz"] = (text, lambda: b"ready\n")
        else:
            routes["/healthz"] = (text, _probe(health.live, "ok"))
            routes["/readyz"] = (text, _probe(health.ready, "ready"))
        if self.metrics is not None:
            routes["/metrics"] = (CONTENT_TYPE_LATEST, self.metrics.exposition)
        return routes

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        if self._server is None:
            raise RuntimeError("the server is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://host:port`` (after :meth:`start`)."""
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    def start(self, port: int = 0) -> int:
        """Bind (``port=0``: any free port), serve in a daemon thread; return the port.

        :raises RuntimeFailure: the address is in use or not available.
        """
        if self._server is not None:
            raise RuntimeError("the server is already started")
        try:
            server = _Server(
                (self.host, port), self._routes(), self.request_timeout, self.max_connections
            )
        except OSError as exc:
            raise RuntimeFailure(
                f"cannot serve metrics on {self.host}:{port}: {exc.strerror or exc}",
                "choose another --metrics-port (0 picks a free one) or stop what uses it",
            ) from None
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.2},
            name="htmqc-observe", daemon=True,
        )
        self._thread.start()
        return self.port

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> ObserveServer:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
