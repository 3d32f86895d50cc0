"""The broker goes away under a running ``htmqc run`` and comes back (issue 16,
item 6), on the bundled broker, killed for real: librdkafka's ``Connection
refused`` lines are rate-limited, ``/readyz`` answers 503 while the broker is
down, and processing resumes once a broker answers on the same port again.

Regression kept from the report: with the bundled broker killed, ``/healthz``
said 200, and librdkafka printed ~900 ``Connection refused`` lines.
"""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

import htmqc.broker
from htmqc.broker import Broker, create_topic, start_broker
from htmqc.loopback import free_port
from htmqc.produce import produce
from tests.runtime.test_run_broker import finish, htmqc_run, wait_for

pytestmark = pytest.mark.slow  # starts (and kills) a broker of its own

HANDLERS = "tests.runtime.handlers"
#: How long the broker stays away: a few of librdkafka's reconnect backoffs.
DOWN_SECONDS = 8.0


def status(url: str) -> tuple[int, str]:
    """Status and body of a GET (the connection refused: ``(0, "")``)."""
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def handled(out: Path) -> set[int]:
    """The message ids the handler journalled (``partition key id thread``)."""
    if not out.exists():
        return set()
    return {int(line.split()[2]) for line in out.read_text().splitlines() if line.strip()}


def refused(text: str) -> int:
    return sum("Connection refused" in line for line in text.splitlines())


def test_a_killed_broker_is_waited_out_quietly_and_processing_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, metrics = free_port(), free_port()
    broker: Broker | None = start_broker(port)
    assert broker is not None
    topic, group = f"loss-{uuid.uuid4().hex[:8]}", f"g-loss-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, 100, keys=10)
    out, log = tmp_path / "out.txt", tmp_path / "run.log"
    proc = htmqc_run(
        broker.bootstrap, topic, f"{HANDLERS}:log_order", "--group", group,
        "--commit-ms", "100", "--metrics-port", str(metrics),
        env={"HTMQC_TEST_OUT": str(out)}, log=log,
    )  # fmt: skip
    ready = f"http://127.0.0.1:{metrics}/readyz"
    try:
        wait_for(lambda: handled(out) >= set(range(100)), 60, "the first 100 messages")
        wait_for(lambda: status(ready)[0] == 200, 30, "/readyz 200")
        before = refused(log.read_text())

        broker.process.kill()  # SIGKILL: no goodbye to the clients
        broker.stop()
        broker = None
        killed = time.monotonic()
        answers = []
        while time.monotonic() < killed + DOWN_SECONDS:
            answers.append(status(ready))
            time.sleep(0.25)
        assert proc.poll() is None, log.read_text()[-3000:]
        text = log.read_text()
        lines = refused(text) - before
        assert 1 <= lines <= 6, f"{lines} 'Connection refused' lines in {DOWN_SECONDS:g} s"
        # Within a few seconds of the loss and from then on: not ready, and why.
        late = [a for a in answers[int(3 / 0.25):]]
        assert late and all(code == 503 for code, _ in late), late
        reasons = {body.strip() for _, body in late}
        assert reasons <= {"the broker is unreachable", "no partitions assigned"}, reasons
        assert status(f"http://127.0.0.1:{metrics}/healthz")[0] == 200, "alive all along"

        # The killed broker's connections linger in TIME_WAIT, which start_broker's
        # probe (a bind without SO_REUSEADDR) takes for a port in use; Tansu binds it.
        monkeypatch.setattr(htmqc.broker, "_port_taken", lambda host, port: False)
        broker = start_broker(port)  # a new broker on the same port: empty
        create_topic(broker.bootstrap, topic, 2)
        produce(broker.bootstrap, topic, 100, keys=10, start_id=1000)
        wait_for(lambda: handled(out) & set(range(1000, 1100)), 90, "a message after the loss")
        wait_for(lambda: status(ready)[0] == 200, 60, "/readyz 200 again")
        proc.send_signal(signal.SIGTERM)
        assert finish(proc, 60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if broker is not None:
            broker.stop()
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
