"""Secrets never leave the process: a real run that used passwords from the
command line, ``HTMQC_KAFKA_CONFIG``, a TOML file and a ``postgresql://`` sink
URL, with a careless handler that quotes one of them in its error, and every
output of it grepped: stdout, stderr (logs and the one-line error), the
``--trace`` file, ``/state.json``, ``/metrics``, the dead letters (Kafka
records with their headers; SQL rows) and the sink's tables.

Also the one-line errors of bad settings that carry a secret.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from htmqc import secrets
from htmqc.broker import Broker
from htmqc.config import remember_secrets, resolve, url_passwords
from htmqc.produce import produce

ROOT = Path(__file__).resolve().parents[2]
PG = "127.0.0.1:5432/test"
COUNT = 20


#: Every message fails on purpose here: the circuit breaker would rightly stop the
#: stream (tests/runtime/test_breaker.py); these tests follow the secret into the DLQ.
NO_BREAKER = ("--breaker-consecutive", str(2**62), "--breaker-min-calls", str(2**62))


def secret(label: str) -> str:
    """A password nobody would type twice (so any hit is a leak)."""
    return f"{label}-Zq{uuid.uuid4().hex[:12]}!x"


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def read_topic(bootstrap: str, topic: str, count: int, timeout: float = 30) -> list[Any]:
    """``count`` records of ``topic`` (partition 0) read with a plain consumer."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:6]}"}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < count and time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.5):
                if msg.error() is None:
                    out.append(msg)
    finally:
        consumer.close()
    return out


def record_text(msg: Any) -> str:
    parts = [msg.key() or b"", msg.value() or b""]
    parts += [k.encode() + b"=" + (v or b"") for k, v in msg.headers() or []]
    return b"\n".join(parts).decode("utf-8", "replace")


def start_run(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    full_env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'src'}", **env)
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "htmqc", *args], env=full_env, stdout=out, stderr=out
        )


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("htmqc run did not stop on SIGTERM within 30 s") from None


def metrics_url(log: Path) -> str:
    found = re.search(rb"metrics on (http://127\.0\.0\.1:\d+)/metrics", log.read_bytes())
    return found.group(1).decode() if found else ""


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode("utf-8"))


def assert_nowhere(texts: dict[str, str], *values: str) -> None:
    for where, text in texts.items():
        for value in values:
            assert value not in text, f"secret {value!r} leaked into {where}"


@pytest.mark.broker
def test_kafka_secrets_never_leave_an_at_least_once_run(
    broker: Broker, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    cli_secret, env_secret, toml_secret = secret("cli"), secret("env"), secret("toml")
    topic = new_topic(1)
    produce(broker.bootstrap, topic, COUNT, keys=5)
    config = tmp_path / "htmqc.toml"
    config.write_text(f'[kafka]\n"ssl.keystore.password" = "{toml_secret}"\n')
    trace, log = tmp_path / "trace.jsonl", tmp_path / "run.log"
    proc = start_run(
        [
            "run", "tests.security.handlers:fail_quoting_secret",
            "--bootstrap", broker.bootstrap, "--topic", topic, "--group", "sec-alo",
            "--kafka-config", f"sasl.password={cli_secret}",
            "--config", str(config), "--trace", str(trace), "--metrics-port", "0",
            "--log-level", "DEBUG", "--max-retries", "0", *NO_BREAKER,
        ],
        {
            "HTMQC_KAFKA_CONFIG": f"ssl.key.password={env_secret}",
            "HTMQC_SECURITY_SECRET": cli_secret,
        },
        log,
    )  # fmt: skip
    try:
        url = wait_for(lambda: metrics_url(log), 30, "the metrics server")
        dead = read_topic(broker.bootstrap, f"{topic}.dlq", COUNT, timeout=60)
        assert len(dead) == COUNT, log.read_text()
        state, metrics = http_get(f"{url}/state.json"), http_get(f"{url}/metrics")
        json.loads(state)  # still valid JSON after scrubbing
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()
    reasons = [dict(m.headers() or [])[b"htmqc-dlq-reason".decode()] for m in dead]
    assert all(b"could not log in with password" in r for r in reasons), reasons[:1]
    assert all(b"***" in r for r in reasons), reasons[:1]
    texts = {
        "stdout/stderr": log.read_text(errors="replace"),
        "trace": trace.read_text(errors="replace"),
        "/state.json": state,
        "/metrics": metrics,
        "dead letters": "\n".join(record_text(m) for m in dead),
    }
    assert_nowhere(texts, cli_secret, env_secret, toml_secret)


@pytest.mark.broker
def test_sink_url_password_never_leaves_an_exactly_once_run(
    broker: Broker, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    password = secret("pg")
    prefix = f"sec_{uuid.uuid4().hex[:8]}_"
    sink = f"postgresql://postgres:{password}@{PG}?table_prefix={prefix}"
    topic = new_topic(1)
    produce(broker.bootstrap, topic, COUNT, keys=5)
    trace, log = tmp_path / "trace.jsonl", tmp_path / "run.log"
    proc = start_run(
        [
            "run", "tests.security.handlers:fail_quoting_secret",
            "--bootstrap", broker.bootstrap, "--topic", topic, "--group", "sec-eo",
            "--mode", "exactly-once", "--trace", str(trace), "--metrics-port", "0",
            "--log-level", "DEBUG", "--max-retries", "0", *NO_BREAKER,
        ],
        {"HTMQC_SINK": sink, "HTMQC_SECURITY_SECRET": password},
        log,
    )  # fmt: skip
    with psycopg.connect(f"postgresql://postgres@{PG}") as conn:
        try:
            url = wait_for(lambda: metrics_url(log), 30, "the metrics server")

            def stored() -> int:
                rows = conn.execute(
                    f"SELECT COALESCE(SUM(committed), 0) FROM {prefix}positions"
                ).fetchone()
                conn.rollback()
                return int(rows[0]) if rows else 0

            def committed_all() -> bool:
                try:
                    return stored() >= COUNT
                except psycopg.errors.UndefinedTable:
                    conn.rollback()
                    return False

            wait_for(committed_all, 60, "every message dead-lettered and committed")
            state, metrics = http_get(f"{url}/state.json"), http_get(f"{url}/metrics")
        finally:
            code = stop(proc)
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_name LIKE %s",
                (prefix + "%",),
            )
        ]
        rows = []
        for table in tables:
            rows += [repr(r) for r in conn.execute(f'SELECT * FROM "{table}"')]
            conn.execute(f'DROP TABLE "{table}"')
        conn.commit()
    assert code == 0, log.read_text()
    dumped = "\n".join(rows)
    assert "could not log in with password ***" in dumped, dumped[:3000]
    texts = {
        "stdout/stderr": log.read_text(errors="replace"),
        "trace": trace.read_text(errors="replace"),
        "/state.json": state,
        "/metrics": metrics,
        "sink tables (positions, dead letters)": dumped,
    }
    assert_nowhere(texts, password)


@pytest.mark.slow  # runs `htmqc run`
@pytest.mark.parametrize(
    ("args", "env", "config"),
    [
        (["--kafka-config", "sasl.password:{s}"], {}, None),
        ([], {"HTMQC_KAFKA_CONFIG": "ssl.key.password{s}"}, None),
        (["--kafka-config", "sasl.password={s}", "--workers", "100000"], {}, None),
        (["--sink", "postgresql://u:{s}@127.0.0.1:1/x", "--mode", "exactly-once"], {}, None),
        (["--sink", "postgresql://u:{s}@[bad/x"], {}, None),
        ([], {}, '[kafka]\n"sasl.password" = "{s}"\n[bogus]\nx = 1\n'),
        ([], {}, '[kafka]\n"sasl.password" = "{s}"\n"no.such.setting" = 1\n'),
        (
            ["--kafka-config", "sasl.password={s}", "--kafka-config", "security.protocol=x"],
            {},
            None,
        ),
    ],
)
def test_one_line_errors_never_quote_a_secret(
    tmp_path: Path, args: list[str], env: dict[str, str], config: str | None
) -> None:
    """Bad settings next to (or inside) a secret: the error names, never quotes."""
    value = secret("err")
    argv = [a.replace("{s}", value) for a in args]
    if config is not None:
        path = tmp_path / "c.toml"
        path.write_text(config.replace("{s}", value))
        argv += ["--config", str(path)]
    full_env = dict(
        os.environ,
        PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'src'}",
        **{k: v.replace("{s}", value) for k, v in env.items()},
    )
    # A handler that fits the mode, so the error is the one next to the secret.
    handler = "examples.effects:record" if "exactly-once" in argv else "examples.printer:show"
    done = subprocess.run(
        [sys.executable, "-m", "htmqc", "run", handler,
         "--bootstrap", "127.0.0.1:1", "--topic", "t", "--group", "g",
         "--connect-seconds", "1", *argv],
        env=full_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode in (1, 2), done.stderr
    assert "htmqc: error:" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert value not in done.stdout + done.stderr, done.stderr


def test_resolve_remembers_every_source(tmp_path: Path) -> None:
    secrets.forget_all()
    try:
        values = [secret(n) for n in ("cli", "env", "toml", "url", "redis")]
        config = tmp_path / "c.toml"
        config.write_text(f'[kafka]\n"sasl.oauthbearer.client.secret" = "{values[2]}"\n')
        resolve(
            {
                "bootstrap": "b:1",
                "topic": "t",
                "group": "g",
                "sink": f"postgresql://u:{values[3]}@h/db",
                "redis_url": f"redis://:{values[4]}@h:6379/0",
            },
            {"sasl.password": values[0]},
            config_file=str(config),
            environ={"HTMQC_KAFKA_CONFIG": f"ssl.key.password={values[1]}"},
        )
        text = " ".join(values)
        assert secrets.scrub(text) == " ".join(["***"] * len(values))
        # Switches and locations next to secret-looking words are not secrets.
        remember_secrets({"enable.sasl.oauthbearer.unsecure.jwt": "true", "ssl.key.location": "/k"})
        assert secrets.scrub('{"ok": true}') == '{"ok": true}'
    finally:
        secrets.forget_all()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:p%40ss-word@h/db", ["p%40ss-word", "p@ss-word"]),
        ("postgresql://u@h/db?password=qwerty12", ["qwerty12"]),
        ("postgresql://u@h/db?sslpassword=abcd1234&x=1", ["abcd1234"]),
        ("redis://:hunter22@h:6379/0", ["hunter22"]),
        ("postgresql://u:pw12@[bad/db", ["pw12"]),
        ("sqlite:///x.db", []),
        ("kafka:topic", []),
        ("tls://s3cr%2Ftoken@h:4222?ca=/c.pem", ["s3cr%2Ftoken", "s3cr/token"]),
        ("nats://alice:pw-nats@h:4222", ["pw-nats"]),
        ("postgresql://alice@h/db", []),
    ],
)
def test_url_passwords(url: str, expected: list[str]) -> None:
    assert url_passwords(url) == expected
