"""Headless Chromium driven over the DevTools protocol, on a pipe.

``--dump-dom`` shows what the page wrote, not where it drew it; measuring a bar
needs layout (``getBoundingClientRect``) and sorting needs a click. Chromium's
``--remote-debugging-pipe`` speaks the protocol on file descriptors 3 (commands
in) and 4 (replies out), one NUL-terminated JSON message each, so no WebSocket
client is needed. Chromium itself comes from ``make setup``: a missing one skips
on a developer's machine and fails under ``CI=true`` (:func:`tests.services.require_tool`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.services import require_tool

#: Exec'd first in the child: argv[1] becomes descriptor 3, argv[2] descriptor 4, then
#: argv[3:] runs (no ``preexec_fn``: this process has server threads).
_ONTO_3_AND_4 = (
    "import os, sys\n"
    "r, w = int(sys.argv[1]), int(sys.argv[2])\n"
    "os.dup2(r, 3); os.dup2(w, 4); os.close(r); os.close(w)\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)

#: Window the page is laid out in (CSS pixels, device scale factor 1).
WIDTH, HEIGHT = 1280, 1000


class ProtocolError(AssertionError):
    """Chromium answered a command with an error, went away, or did not answer in time."""


class Chromium:
    """One headless Chromium with one page on ``url``; use as a context manager.

    :meth:`evaluate` runs JavaScript in the page and returns its (JSON) value;
    :meth:`click` sends a real mouse click at a point; :meth:`wait_for` polls a
    JavaScript condition.
    """

    def __init__(self, url: str, profile: Path, *, timeout: float = 60.0) -> None:
        browser = require_tool("chromium", "chromium")
        self.timeout = timeout
        self._buf = b""
        self._id = 0
        # Pipes moved to descriptors >= 10, so putting them on 3 and 4 cannot clobber them.
        cmd_r, cmd_w = (_high(fd) for fd in os.pipe())
        out_r, out_w = (_high(fd) for fd in os.pipe())
        args = [
            browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
            f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}",
            "--remote-debugging-pipe", "about:blank",
        ]
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _ONTO_3_AND_4, str(cmd_r), str(out_w), *args],
            pass_fds=(cmd_r, out_w),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True,
        )
        os.close(cmd_r)
        os.close(out_w)
        self._w, self._r = cmd_w, out_r
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self.call(
                "Target.attachToTarget", {"targetId": target, "flatten": True}
            )["sessionId"]
            self.call("Emulation.setDeviceMetricsOverride", {
                "width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False,
            }, page=True)
            self.call("Page.enable", page=True)
            self.call("Page.navigate", {"url": url}, page=True)
        except BaseException:
            self.close()
            raise

    # -- protocol -------------------------------------------------------------------------

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             page: bool = False) -> dict[str, Any]:
        """Send one command (to the page's session if ``page``) and return its result."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if page:
            msg["sessionId"] = self._session
        try:
            os.write(self._w, json.dumps(msg).encode() + b"\0")
        except BrokenPipeError:
            raise ProtocolError(f"Chromium went away: {self._stderr()}") from None
        reply = self._reply(self._id)
        if "error" in reply:
            raise ProtocolError(f"{method}: {reply['error']}")
        return dict(reply.get("result", {}))

    def _reply(self, want: int) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                msg = json.loads(raw)
                if msg.get("id") == want:
                    return dict(msg)  # events (no id) and stale replies are dropped
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise ProtocolError(f"no answer from Chromium in {self.timeout:g} s")
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise ProtocolError(f"Chromium went away: {self._stderr()}")
            self._buf += chunk

    def _stderr(self) -> str:
        if self._proc.poll() is None or self._proc.stderr is None:
            return "(still running)"
        return self._proc.stderr.read().decode(errors="replace")[-2000:]

    # -- page -----------------------------------------------------------------------------

    def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page (promises are awaited)."""
        got = self.call("Runtime.evaluate", {
            "expression": expression, "returnByValue": True, "awaitPromise": True,
        }, page=True)
        if "exceptionDetails" in got:
            raise ProtocolError(f"{expression[:200]!r} raised {got['exceptionDetails']}")
        return got["result"].get("value")

    def wait_for(self, condition: str, timeout: float = 20.0) -> Any:
        """Poll the JavaScript ``condition`` until it is truthy; return its value.
        An evaluation that raises counts as not yet (the last error is reported)."""
        deadline = time.monotonic() + timeout
        while True:
            try:  # a navigation may replace the document (and its context) meanwhile
                value = self.evaluate(condition)
            except ProtocolError as exc:
                value = exc
            if value and not isinstance(value, ProtocolError):
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {condition!r} (last: {value!r})")
            time.sleep(0.05)

    def click(self, selector: str) -> None:
        """A real left click (pressed, released) at the centre of ``selector``'s box."""
        box = self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
            ".getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {
                "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1,
            }, page=True)

    def close(self) -> None:
        """Ask Chromium to quit; kill the one process started here if it does not."""
        with contextlib.suppress(OSError):
            os.write(self._w, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # its own session: the group is what it started
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=10)
        for fd in (self._w, self._r):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._proc.stderr is not None:
            self._proc.stderr.close()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _high(fd: int) -> int:
    """``fd`` moved to a descriptor >= 10 (close-on-exec; ``pass_fds`` hands it on)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return int(moved)
