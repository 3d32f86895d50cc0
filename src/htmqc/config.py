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
:func:`resolve` also hands every such value, and the passwords of the sink
and Redis URLs, to :func:`htmqc.secrets.remember` before it validates anything,
so :func:`htmqc.secrets.scrub` masks them in any text that leaves the process
(:func:`remember_secrets`).

Validation (:func:`resolve`, each problem one :class:`~htmqc.errors.UsageError`
line, exit code 2): every number has a type (a TOML ``true`` or ``2.5`` is
not an integer; NaN and infinity are refused) and the bounds of
:data:`LIMITS` (no zero or negative sizes, no 100000 workers); text options
are non-empty single lines without control characters; TOML files may hold
only ``[run]``, ``[kafka]`` and the option names, and ``[kafka]`` values must
be scalars. Unknown ``HTMQC_*`` variables are ignored (other tools use the
prefix); unknown librdkafka keys are refused by librdkafka when the client is
created.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from htmqc import secrets
from htmqc.errors import UsageError
from htmqc.runtime.options import (
    MODES,
    OPTIONS,
    PROFILES,
    REQUIRED_VALUE,
    SINK_DEFAULTS,
    RunOptions,
)
from htmqc.sinks.urls import parse_sink_url

_SECRET_WORDS = ("password", "secret", "key", "token", "credential", "jaas", "sasl.oauthbearer")

#: option name -> (type, default). ``None`` default: optional. From the schema
#: (:data:`htmqc.runtime.options.OPTIONS`), as are the limits and choices below.
FIELDS: dict[str, tuple[type, Any]] = {
    o.name: (o.kind, None if o.default is REQUIRED_VALUE else o.default) for o in OPTIONS
}
REQUIRED = tuple(o.name for o in OPTIONS if o.default is REQUIRED_VALUE)

#: option -> (lowest, highest, lowest allowed itself). Anything outside is
#: refused at start: zero or negative sizes, absurd counts (100000 threads).
LIMITS: dict[str, tuple[float, float, bool]] = {
    o.name: o.spec.limits for o in OPTIONS if o.spec.limits is not None
}
#: Text options: at most this many characters, one line, no control characters.
MAX_TEXT = 4096
#: A ``--config`` file larger than this is refused before it is parsed.
MAX_CONFIG_BYTES = 1024 * 1024
_CHOICES = {o.name: o.spec.choices for o in OPTIONS if o.spec.choices is not None}
#: Values of secret-looking keys that are settings, not secrets (never remembered:
#: masking "true" would break JSON output).
_NOT_SECRET_VALUES = frozenset({"true", "false", "none", "plain", "ssl", "https"})
_NOT_SECRET_KEY_PARTS = (".location", ".mechanism", ".algorithm", ".method", "enable.")


def is_secret(key: str) -> bool:
    """Whether a librdkafka key may hold a secret."""
    lower = key.lower()
    return any(word in lower for word in _SECRET_WORDS)


def redacted(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with every secret-looking value replaced by ``***``."""
    return {k: ("***" if is_secret(k) else v) for k, v in config.items()}


#: Schemes whose userinfo without a ``:`` is a token, not a user name (NATS).
_TOKEN_SCHEMES = frozenset({"nats", "tls", "ws", "wss"})


def url_passwords(url: str) -> list[str]:
    """The passwords a URL carries: ``user:PASSWORD@``, a NATS URL's ``TOKEN@``
    and ``password=`` / ``sslpassword=`` parameters, each raw and
    percent-decoded. Never raises."""
    found: list[str] = []
    try:
        parts = urlsplit(url)
        if parts.password:
            found += [parts.password, unquote(parts.password)]
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key.lower().endswith("password") and value:
                found.append(value)
    except ValueError:
        pass
    # userinfo by hand as well: urlsplit gives up on some malformed URLs.
    scheme, sep, rest = url.partition("://")
    if sep:
        userinfo = rest.split("/", 1)[0].rpartition("@")[0]
        if ":" in userinfo:
            password = userinfo.split(":", 1)[1]
            found += [password, unquote(password)]
        elif userinfo and scheme.lower() in _TOKEN_SCHEMES:  # NATS: TOKEN@HOST
            found += [userinfo, unquote(userinfo)]
    return [p for p in dict.fromkeys(found) if p]


def remember_secrets(kafka: Mapping[str, Any], urls: Iterable[str | None] = ()) -> None:
    """:func:`htmqc.secrets.remember` every secret in ``kafka`` and ``urls``.

    A librdkafka value is a secret when its key :func:`is_secret` (except
    switches, file locations and algorithm names such as ``ssl.key.location``
    or ``sasl.mechanism``); a URL's secrets are its :func:`url_passwords`.
    """
    for key, value in kafka.items():
        lower = str(key).lower()
        if not is_secret(lower) or any(part in lower for part in _NOT_SECRET_KEY_PARTS):
            continue
        if isinstance(value, bool) or str(value).strip().lower() in _NOT_SECRET_VALUES:
            continue
        secrets.remember(str(value))
        secrets.remember(str(value).strip())
    for url in urls:
        for password in url_passwords(url or ""):
            secrets.remember(password)


def parse_pairs(pairs: list[str] | str, where: str) -> dict[str, str]:
    """``key=value`` items (a list, or one comma-separated string) as a dict."""
    items = pairs.split(",") if isinstance(pairs, str) else pairs
    out: dict[str, str] = {}
    for item in items:
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # Never quote a malformed item that may hold a secret ("sasl.password:x").
            shown = "a secret-looking item" if is_secret(item) else repr(item.strip()[:80])
            raise UsageError(
                f"{where}: {shown} is not key=value",
                "write librdkafka settings as key=value, e.g. fetch.wait.max.ms=50",
            )
        out[key.strip()] = value.strip()
    return out


def load_toml(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(options, kafka settings)`` from a TOML file.

    :raises UsageError: the file is missing, unreadable, larger than
        :data:`MAX_CONFIG_BYTES`, not UTF-8 TOML, has a table other than
        ``[run]`` and ``[kafka]``, an unknown option, or a ``[kafka]`` value
        that is not a string, number or boolean.
    """
    try:
        raw = Path(path).read_bytes()
        if len(raw) > MAX_CONFIG_BYTES:
            raise UsageError(
                f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes",
                "pass a config file, not a data file",
            )
        data = tomllib.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise UsageError(f"config file {path} not found", "check the --config path") from None
    except OSError as exc:
        raise UsageError(
            f"cannot read config file {path}: {exc.strerror}", "check the path"
        ) from None
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"config file {path} is not UTF-8 (byte {exc.start})", "save it as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config file {path} is not valid TOML: {exc}", "fix the syntax") from None
    kafka = data.pop("kafka", {})
    run = data.pop("run", {})
    for name, table in (("kafka", kafka), ("run", run)):
        if not isinstance(table, dict):
            raise UsageError(
                f"config file {path}: {name} must be a table", f"write [{name}] then key = value"
            )
    tables = sorted(k for k, v in data.items() if isinstance(v, dict))
    if tables:
        raise UsageError(
            f"config file {path}: unknown table [{tables[0]}]",
            "use [run] for htmqc options and [kafka] for librdkafka settings",
        )
    for key, value in kafka.items():
        if isinstance(value, (dict, list)) or not isinstance(value, (str, int, float, bool)):
            raise UsageError(
                f"config file {path}: [kafka] {key!r} must be a string, number or boolean",
                "librdkafka takes plain values",
            )
    options = dict(run)
    options.update(data)
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


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _coerce(name: str, value: Any) -> Any:
    """``value`` as the type of option ``name``; text (CLI, environment) is parsed,
    a TOML value must already have the right type (``true`` and ``2.5`` are not
    integers, a number is not text)."""
    kind, _default = FIELDS[name]
    flag = _flag(name)
    if kind is bool:
        return _boolean(name, value)
    if value is None:
        return value
    if kind is str:
        if not isinstance(value, str):
            raise UsageError(
                f"{flag} must be text, got a {type(value).__name__}", f"quote the value of {flag}"
            )
        return value
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UsageError(
            f"{flag} must be a {kind.__name__}, got a {type(value).__name__}",
            f"pass a number to {flag}",
        )
    if kind is int and isinstance(value, float):
        if not value.is_integer():
            raise UsageError(f"{flag} must be a whole number, got {value!r}", "drop the fraction")
        value = int(value)
    try:
        number = kind(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        shown = repr(value[:40]) if isinstance(value, str) else repr(value)
        raise UsageError(
            f"{flag} must be a {kind.__name__}, got {shown}", f"pass a number to {flag}"
        ) from None
    if isinstance(number, float) and not math.isfinite(number):
        raise UsageError(f"{flag} must be a finite number, got {value!r}", "pass a real number")
    return number


def _check(merged: dict[str, Any]) -> None:
    """Bounds, choices and text hygiene of the merged options (module docs).

    :raises UsageError: the first option out of bounds.
    """
    for name, (low, high, low_ok) in LIMITS.items():
        value = merged.get(name)
        if value is None or isinstance(value, bool):
            continue
        if value < low or (value == low and not low_ok):
            relation = ">=" if low_ok else ">"
            raise UsageError(
                f"{_flag(name)} must be {relation} {low:g}, got {value:g}",
                f"pass a larger value to {_flag(name)}",
            )
        if value > high:
            raise UsageError(
                f"{_flag(name)} must be <= {high:g}, got {value:g}",
                f"pass a smaller value to {_flag(name)}",
            )
    # min_in_flight above max_in_flight is clamped by the engine; a backoff above
    # its cap would be a silent surprise, so it is refused.
    first, cap = merged.get("backoff_ms"), merged.get("backoff_max_ms")
    if first is not None and cap is not None and first > cap:
        raise UsageError(
            f"--backoff-ms {first:g} is above --backoff-max-ms {cap:g}",
            "lower --backoff-ms or raise the cap",
        )
    for name, choices in _CHOICES.items():
        if name in merged and merged[name] not in choices:
            raise UsageError(
                f"{_flag(name)} {merged[name]!r} is unknown", f"use one of: {', '.join(choices)}"
            )
    for name, (kind, _default) in FIELDS.items():
        value = merged.get(name)
        if kind is not str or value is None:
            continue
        if len(value) > MAX_TEXT:
            raise UsageError(
                f"{_flag(name)} is longer than {MAX_TEXT} characters", "pass a shorter value"
            )
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise UsageError(
                f"{_flag(name)} contains a control character (a newline?)",
                "pass a single line of printable text",
            )


def _given(name: str, *sources: Mapping[str, Any]) -> Any:
    """The value of ``name`` in the first source that has it, else ``None``."""
    return next((src[name] for src in sources if src.get(name) is not None), None)


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
    # Before anything can fail: from here on every text leaving the process is scrubbed.
    for source in (file_kafka, env_kafka, cli_kafka):
        remember_secrets(source)
    remember_secrets(
        {},
        [
            str(src.get(name))
            for src in (cli, env_opts, file_opts)
            for name in ("sink", "redis_url", "bootstrap", "schema_registry")
            if isinstance(src.get(name), str)
        ],
    )
    merged: dict[str, Any] = {}
    given: set[str] = set()
    for name, (_kind, default) in FIELDS.items():
        value = _given(name, cli, env_opts, file_opts)
        if value is None:
            merged[name] = default
        else:
            merged[name] = _coerce(name, value)
            given.add(name)
    # The profile's values stand in for the defaults of the options not given; the
    # sink's defaults for those the profile does not set either.
    tuned = PROFILES.get(merged["profile"], {})
    if merged["sink"]:
        kind = parse_sink_url(merged["sink"]).kind
        tuned = {**SINK_DEFAULTS.get(kind, {}), **tuned}
    merged.update({name: value for name, value in tuned.items() if name not in given})
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
    _check(merged)
    return RunOptions(kafka_config=kafka, **merged)
