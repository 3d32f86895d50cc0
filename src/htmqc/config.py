"""Settings of ``htmqc run`` from the command line, ``HTMQC_*`` variables and TOML.

Precedence: command line > environment > TOML file (``--config``) > defaults.
Environment variables are the option names in upper case with ``-`` as ``_``
and an ``HTMQC_`` prefix (``HTMQC_BOOTSTRAP``, ``HTMQC_MAX_IN_FLIGHT``);
``HTMQC_KAFKA_CONFIG`` holds ``key=value`` pairs separated by commas. The TOML
file holds the same names (``-`` or ``_``) at the top level or under ``[run]``,
and librdkafka settings under ``[kafka]``.

Secrets: any librdkafka key that looks secret (``password``, ``secret``,
``key``, ``token``, ``credentials``...) is shown as ``***`` by :func:`redacted`,
and URL passwords by :func:`htmqc.sinks.redact_url`; errors name keys, never values.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from htmqc.errors import UsageError
from htmqc.runtime.options import MODES, RunOptions

_SECRET_WORDS = ("password", "secret", "key", "token", "credential", "jaas", "sasl.oauthbearer")

#: option name -> (type, default). ``None`` default: optional.
FIELDS: dict[str, tuple[type, Any]] = {
    "bootstrap": (str, None),
    "topic": (str, None),
    "group": (str, None),
    "mode": (str, "at-least-once"),
    "sink": (str, None),
    "workers": (int, 1),
    "max_in_flight": (int, 10_000),
    "txn_messages": (int, 1000),
    "txn_ms": (float, 100.0),
    "commit_ms": (float, 500.0),
    "create_topic": (int, None),
    "max_messages": (int, None),
    "idle_exit": (float, None),
    "max_message_bytes": (int, None),
    "shutdown_seconds": (float, 10.0),
    "batch_size": (int, 1000),
    "connect_seconds": (float, 10.0),
    "trace": (str, None),
    "max_retries": (int, 3),
    "backoff_ms": (float, 100.0),
    "backoff_max_ms": (float, 30_000.0),
    "poison_threshold": (int, 5),
    "poison_window": (float, 60.0),
    "flow": (str, "adaptive"),
    "min_in_flight": (int, 16),
    "latency_target_ms": (float, 1000.0),
    "max_in_flight_bytes": (int, 256 * 1024 * 1024),
    "metrics_port": (int, None),
    "metrics_host": (str, "127.0.0.1"),
    "redis_url": (str, None),
    "log_format": (str, "text"),
    "otel": (bool, False),
    "retry_topic": (bool, False),
    "retry_topic_ms": (float, 5000.0),
}
REQUIRED = ("bootstrap", "topic", "group")


def is_secret(key: str) -> bool:
    """Whether a librdkafka key may hold a secret."""
    lower = key.lower()
    return any(word in lower for word in _SECRET_WORDS)


def redacted(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with every secret-looking value replaced by ``***``."""
    return {k: ("***" if is_secret(k) else v) for k, v in config.items()}


def parse_pairs(pairs: list[str] | str, where: str) -> dict[str, str]:
    """``key=value`` items (a list, or one comma-separated string) as a dict."""
    items = pairs.split(",") if isinstance(pairs, str) else pairs
    out: dict[str, str] = {}
    for item in items:
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(
                f"{where}: {key.strip() or item!r} is not key=value",
                "write librdkafka settings as key=value, e.g. fetch.wait.max.ms=50",
            )
        out[key.strip()] = value.strip()
    return out


def load_toml(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(options, kafka settings)`` from a TOML file.

    :raises UsageError: the file is missing, not TOML, or has unknown options.
    """
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"config file {path} not found", "check the --config path") from None
    except OSError as exc:
        raise UsageError(
            f"cannot read config file {path}: {exc.strerror}", "check the path"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config file {path} is not valid TOML: {exc}", "fix the syntax") from None
    kafka = data.pop("kafka", {}) or {}
    run = data.pop("run", None)
    options = dict(run) if isinstance(run, dict) else {}
    options.update({k: v for k, v in data.items() if not isinstance(v, dict)})
    if not isinstance(kafka, dict):
        raise UsageError(
            f"config file {path}: [kafka] must be a table", "write [kafka] key = value"
        )
    options = {k.replace("-", "_"): v for k, v in options.items()}
    unknown = sorted(set(options) - set(FIELDS) - {"handler"})
    if unknown:
        raise UsageError(
            f"config file {path}: unknown option {unknown[0]!r}",
            f"use one of: {', '.join(sorted(FIELDS))}",
        )
    return options, {str(k): v for k, v in kafka.items()}


def from_env(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """``(options, kafka settings)`` from ``HTMQC_*`` variables."""
    options = {}
    for name in FIELDS:
        value = environ.get(f"HTMQC_{name.upper()}")
        if value is not None and value != "":
            options[name] = value
    kafka = parse_pairs(environ.get("HTMQC_KAFKA_CONFIG", ""), "HTMQC_KAFKA_CONFIG")
    return options, kafka


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _boolean(name: str, value: Any) -> bool | None:
    """A switch from the CLI (``True``), TOML (a boolean) or the environment (text)."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    flag = "--" + name.replace("_", "-")
    raise UsageError(f"{flag} must be true or false, got {value!r}", "use true or false")


def _coerce(name: str, value: Any) -> Any:
    kind, _default = FIELDS[name]
    if kind is bool:
        return _boolean(name, value)
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    try:
        return kind(value)
    except (TypeError, ValueError):
        flag = "--" + name.replace("_", "-")
        raise UsageError(
            f"{flag} must be a {kind.__name__}, got {value!r}", f"pass a number to {flag}"
        ) from None


def resolve(
    cli: Mapping[str, Any],
    cli_kafka: Mapping[str, str],
    *,
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> RunOptions:
    """Merge the sources (CLI > env > TOML > defaults) and validate.

    ``cli`` holds the parsed options, ``None`` where not given.
    :raises UsageError: a missing or invalid option.
    """
    env = os.environ if environ is None else environ
    file_opts: dict[str, Any] = {}
    file_kafka: dict[str, Any] = {}
    if config_file is None:
        config_file = env.get("HTMQC_CONFIG") or None
    if config_file:
        file_opts, file_kafka = load_toml(config_file)
    env_opts, env_kafka = from_env(env)
    merged: dict[str, Any] = {}
    for name, (_kind, default) in FIELDS.items():
        for source in (cli, env_opts, file_opts):
            if source.get(name) is not None:
                merged[name] = _coerce(name, source[name])
                break
        else:
            merged[name] = default
    kafka: dict[str, Any] = {}
    for source in (file_kafka, env_kafka, cli_kafka):
        kafka.update({k: (str(v).lower() if isinstance(v, bool) else v) for k, v in source.items()})
    for name in REQUIRED:
        if not merged[name]:
            flag = "--" + name
            raise UsageError(
                f"{flag} is required",
                f"pass {flag}, set HTMQC_{name.upper()} or put it in --config",
            )
    if merged["mode"] not in MODES:
        raise UsageError(
            f"--mode {merged['mode']!r} is not a delivery mode", f"use one of: {', '.join(MODES)}"
        )
    for name in ("workers", "max_in_flight", "txn_messages", "batch_size"):
        low = 0 if name == "workers" else 1
        if merged[name] < low:
            raise UsageError(f"--{name.replace('_', '-')} must be >= {low}", "pass a larger number")
    for name in ("txn_ms", "commit_ms"):
        if merged[name] <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0", "pass a positive number")
    return RunOptions(kafka_config=kafka, **merged)
