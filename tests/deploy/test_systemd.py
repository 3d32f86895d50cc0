"""deploy/systemd/htmqc@.service against the project, and against systemd itself.

``systemd-analyze verify`` (where the machine has it) loads the unit from a
scratch root that holds the unit, the host's own units and a stand-in for the
ExecStart binary, and must print nothing; ``systemd-analyze security
--offline`` must rate its exposure at most :data:`MAX_EXPOSURE`. The fields
that matter are checked by reading the file: the stop timeout above htmqc's
``--shutdown-seconds`` (the schema's default and the example environment
file's), the command line accepted by the real ``htmqc run`` parser with the
example environment file, the restart policy against htmqc's exit codes, the
SQLite sink inside the StateDirectory, and the hardening.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from htmqc.errors import UsageError
from htmqc.runtime.handlers import check_handler
from htmqc.runtime.launch import load_handler
from htmqc.sinks.urls import parse_sink_url
from tests.deploy.support import (
    DEPLOY,
    console_scripts,
    option_default,
    run_options,
    seconds,
)

UNIT = DEPLOY / "systemd" / "htmqc@.service"
ENV_EXAMPLE = DEPLOY / "systemd" / "htmqc.env.example"
#: The instance the example environment file is written for (/etc/htmqc/orders.env).
INSTANCE = "orders"
#: ``systemd-analyze security`` rates exposure 0-10 (lower is safer); the unit's is 1.7.
MAX_EXPOSURE = 2.0

Unit = dict[str, list[tuple[str, str]]]


def read_unit(path: Path = UNIT) -> Unit:
    """The unit's ``[Section]`` -> ``[(key, value), ...]`` (keys may repeat)."""
    unit: Unit = {}
    section = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            unit.setdefault(section, [])
            continue
        assert section is not None and "=" in line, f"not KEY=VALUE in a section: {line!r}"
        key, _sep, value = line.partition("=")
        unit[section].append((key.strip(), value.strip()))
    return unit


def value(unit: Unit, section: str, key: str) -> str:
    """The last ``key=`` of ``section`` (systemd's rule for single-valued keys)."""
    found = [v for k, v in unit.get(section, []) if k == key]
    assert found, f"[{section}] has no {key}="
    return found[-1]


def read_env(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """An EnvironmentFile's ``KEY=VALUE`` lines (no quotes are used in the example)."""
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, sep, val = line.partition("=")
            assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
            out[key.strip()] = val.strip()
    return out


def exec_argv(unit: Unit, env: dict[str, str]) -> list[str]:
    """ExecStart's words, ``${VAR}`` replaced from ``env`` as systemd does (one word)."""
    words = value(unit, "Service", "ExecStart").split()
    out = []
    for word in words:
        if word.startswith("${") and word.endswith("}"):
            word = env[word[2:-1]]
        assert "$" not in word, f"unsupported variable use in ExecStart: {word}"
        out.append(word)
    return out


def test_stop_timeout_covers_the_shutdown() -> None:
    """SIGTERM, then SIGKILL only after TimeoutStopSec: above the schema's default
    --shutdown-seconds and the example environment file's, with room to commit."""
    unit = read_unit()
    env = read_env()
    stop = seconds(value(unit, "Service", "TimeoutStopSec"))
    assert value(unit, "Service", "KillSignal") == "SIGTERM"
    default = float(option_default("shutdown_seconds"))
    configured = run_options(exec_argv(unit, env)[1:], env).shutdown_seconds
    assert stop >= 2 * max(default, configured), (stop, default, configured)


def test_exec_start_is_a_valid_htmqc_run() -> None:
    """ExecStart runs the console script, and its command line with the example
    EnvironmentFile is a run the real parser and option checks accept, with a
    handler that fits the mode."""
    unit = read_unit()
    env = read_env()
    argv = exec_argv(unit, env)
    assert Path(argv[0]).name in console_scripts(), argv[0]
    assert value(unit, "Service", "EnvironmentFile").lstrip("-") == "/etc/htmqc/%i.env"
    options = run_options(argv[1:], env)
    check_handler(load_handler(argv[2]), options.mode)
    assert options.member_id, "a systemd consumer has a stable host: give it a --member-id"


def test_restart_policy_matches_exit_codes() -> None:
    """on-failure restarts a crash, but not a usage error (exit 2), which a restart
    cannot fix."""
    unit = read_unit()
    assert value(unit, "Service", "Restart") == "on-failure"
    assert value(unit, "Service", "Type") in ("simple", "exec", "notify")
    prevented = value(unit, "Service", "RestartPreventExitStatus").split()
    assert str(UsageError.exit_code) in prevented, prevented


def test_sqlite_sink_lives_in_the_state_directory() -> None:
    """With ProtectSystem=strict only the StateDirectory is writable: the example's
    SQLite sink must be in it."""
    unit = read_unit()
    env = read_env()
    state = "/var/lib/" + value(unit, "Service", "StateDirectory").replace("%i", INSTANCE)
    sink = parse_sink_url(run_options(exec_argv(unit, env)[1:], env).sink or "")
    assert sink.kind == "sqlite", sink
    assert sink.target.startswith(state + "/"), (sink.target, state)


def test_hardening() -> None:
    """A dynamic, unprivileged user; a read-only system; no new privileges."""
    unit = read_unit()
    service = dict(unit["Service"])
    assert service.get("DynamicUser") == "yes" or service.get("User") not in (None, "root", "0")
    for key, wanted in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert service.get(key) == wanted, f"{key}={service.get(key)!r}, want {wanted!r}"


@pytest.fixture
def scratch_root(tmp_path: Path) -> Path:
    """A root with the host's units, ours, and an executable at ExecStart's path."""
    systemd_analyze = shutil.which("systemd-analyze")
    if systemd_analyze is None:
        pytest.skip("systemd-analyze is not installed; the unit is checked by reading it")
    host_units = Path("/usr/lib/systemd/system")
    shutil.copytree(host_units, tmp_path / "usr/lib/systemd/system", symlinks=True)
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    shutil.copy(UNIT, tmp_path / "etc/systemd/system" / UNIT.name)
    binary = tmp_path / exec_argv(read_unit(), read_env())[0].lstrip("/")
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    return tmp_path


@pytest.mark.slow  # runs systemd-analyze
def test_systemd_analyze_verify(scratch_root: Path) -> None:
    """systemd's own parser loads the instance unit without a word of complaint."""
    done = subprocess.run(
        ["systemd-analyze", "verify", f"--root={scratch_root}", f"htmqc@{INSTANCE}.service"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout + done.stderr) == (0, ""), done.stdout + done.stderr


@pytest.mark.slow  # runs systemd-analyze
def test_systemd_analyze_security(scratch_root: Path) -> None:
    """systemd's exposure rating of the unit stays at most :data:`MAX_EXPOSURE`."""
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", f"--root={scratch_root}",
         f"--threshold={round(MAX_EXPOSURE * 10)}", "--no-pager", f"htmqc@{INSTANCE}.service"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    summary = done.stdout.strip().splitlines()[-1:] if done.stdout else [done.stderr]
    assert done.returncode == 0, summary
