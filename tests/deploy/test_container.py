"""The Dockerfile against the project: its entry point is the console script
pyproject.toml declares, the port it EXPOSEs and HEALTHCHECKs is the one its
``HTMQC_*`` variables make ``htmqc run`` serve on, it runs as a non-root user,
its HEALTHCHECK command really tells a live consumer from a stuck one, and the
image's entry point works.

No image registry is reachable from this machine, so ``docker build`` runs only
when ``python:3.11-slim`` is already present locally (and a Docker daemon
answers). Otherwise the image's build is replayed plainly: the build context
that .dockerignore leaves, the build stage's COPYs, a wheel built from them,
installed (``--target``) as the runtime stage installs it, and its
``htmqc`` console script run as the ENTRYPOINT would be, from the runtime
stage's working directory with its environment.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.deploy.dockerfile import DockerIgnore, Stage, lay_out, read_stages
from tests.deploy.support import (
    ROOT,
    StubHealth,
    console_scripts,
    observe_server,
    run_options,
)

BASE_IMAGE = "python:3.11-slim"
#: A run command with the required options (the image's environment adds the rest);
#: no broker answers at its bootstrap address.
RUN_ARGS = ["run", "examples.transform:upper", "--bootstrap", "127.0.0.1:9", "--topic", "t",
            "--group", "g", "--mode", "exactly-once", "--sink", "kafka:out"]  # fmt: skip


def _runtime() -> Stage:
    found = read_stages()
    assert len(found) >= 2, "expected a multi-stage Dockerfile (build, runtime)"
    return found[-1]


def _exposed_port(stage: Stage) -> int:
    (port,) = [int(p.split("/")[0]) for args in stage.all("EXPOSE") for p in args.split()]
    return port


def _healthcheck(stage: Stage) -> list[str]:
    """The HEALTHCHECK's command, exec form (``CMD [...]`` after the options)."""
    args = stage.one("HEALTHCHECK")
    match = re.search(r"\bCMD\s+(\[.*\])\s*$", args)
    assert match, f"HEALTHCHECK must use the exec form: {args}"
    command = json.loads(match.group(1))
    assert isinstance(command, list) and all(isinstance(v, str) for v in command), command
    return command


def test_stages_build_a_wheel_and_install_it_on_slim() -> None:
    """A build stage makes the wheel; the final stage, on python:3.11-slim, installs
    it from that stage."""
    build, *_middle, runtime = read_stages()
    assert build.name is not None
    assert any("pip wheel" in run for run in build.all("RUN")), "the build stage builds a wheel"
    assert runtime.image == BASE_IMAGE
    copies = [c for c in runtime.all("COPY") if c.startswith(f"--from={build.name} ")]
    assert copies, f"the runtime stage copies nothing from stage {build.name!r}"
    assert any("pip install" in run and ".whl" in run for run in runtime.all("RUN"))


def test_entrypoint_is_the_console_script() -> None:
    """ENTRYPOINT names the command of [project.scripts], and that command is htmqc's
    CLI main."""
    entry = _runtime().exec_form("ENTRYPOINT")
    scripts = console_scripts()
    assert entry == ["htmqc"] and entry[0] in scripts, (entry, scripts)
    module, _sep, function = scripts[entry[0]].partition(":")
    assert module == "htmqc.cli" and function == "main", scripts[entry[0]]


def test_user_is_not_root() -> None:
    """USER is a numeric non-zero uid (Kubernetes' runAsNonRoot can check it), the
    uid the image creates, and the one the Kubernetes Deployment runs as."""
    user = _runtime().one("USER")
    uid, _sep, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {user}: use a numeric, non-root uid"
    assert not gid or (gid.isdigit() and int(gid) != 0), f"USER {user}: non-root group"
    assert any(f"--uid {uid}" in run for run in _runtime().all("RUN")), "no user with that uid"


def test_exposed_port_is_where_htmqc_run_serves() -> None:
    """The image's HTMQC_* variables, resolved as ``htmqc run`` resolves them, serve
    the metrics and probes on the EXPOSEd port, on every interface; the
    HEALTHCHECK asks that port by default."""
    runtime = _runtime()
    port = _exposed_port(runtime)
    options = run_options(RUN_ARGS, runtime.env())
    assert options.metrics_port == port, (options.metrics_port, port)
    assert options.metrics_host in ("0.0.0.0", "::"), "a container must not bind to loopback"
    command = _healthcheck(runtime)
    assert command[:2] == ["python", "-c"], command
    assert "/healthz" in command[2] and f"'{port}'" in command[2], command[2]


@pytest.mark.slow  # runs the HEALTHCHECK command
@pytest.mark.parametrize("alive", [True, False])
def test_healthcheck_command_tells_live_from_stuck(alive: bool) -> None:
    """The HEALTHCHECK's own command, run against htmqc's real server: exit 0 when
    /healthz says ok, non-zero when it answers 503."""
    command = _healthcheck(_runtime())
    with observe_server(StubHealth(alive=alive)) as server:
        env = {**os.environ, "HTMQC_METRICS_PORT": str(server.port)}
        done = subprocess.run(
            [sys.executable, *command[1:]], env=env, capture_output=True, timeout=20
        )
    assert (done.returncode == 0) is alive, done.stderr.decode()[-500:]


def test_dockerignore_keeps_what_the_build_copies() -> None:
    """The build context keeps the sources the stages COPY and leaves out the
    virtualenv, git, build output, tests and bytecode."""
    rules = DockerIgnore.read()
    for kept in ("pyproject.toml", "README.md", "src/htmqc/cli/__init__.py", "examples/effects.py"):
        assert not rules.ignored(kept), kept
    for left_out in (
        ".venv/bin/python",
        ".git/HEAD",
        "build/lib/htmqc/__init__.py",
        "tests/conftest.py",
        "src/htmqc/__pycache__/api.cpython-311.pyc",
        "examples/__pycache__/effects.cpython-311.pyc",
        "src/htmqc.egg-info/PKG-INFO",
    ):
        assert rules.ignored(left_out), left_out
    context = rules.context()
    assert "src/htmqc/observe/page.html" in context
    assert not any(rules.ignored(f) for f in context)


def _docker_has_base_image() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        found = subprocess.run(
            ["docker", "image", "inspect", BASE_IMAGE], capture_output=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        return False
    return found.returncode == 0


def _run(
    argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; it must exit 0."""
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{shlex.join(argv)}: {done.returncode}\n{done.stderr[-2000:]}"
    return done


@pytest.mark.slow  # pip wheel, pip install --target, the entry point
def test_image_entry_point(tmp_path: Path) -> None:
    """The image's ENTRYPOINT answers ``--help`` and ``run --help`` and loads the
    example handler from its working directory: built by Docker when the base
    image is here, else replayed plainly (module docs)."""
    if _docker_has_base_image():  # pragma: no cover - no registry, no base image here
        tag = "htmqc-deploy-test:latest"
        _run(["docker", "build", "-t", tag, str(ROOT)])
        assert "run" in _run(["docker", "run", "--rm", tag, "--help"]).stdout
        assert "--member-id" in _run(["docker", "run", "--rm", tag, "run", "--help"]).stdout
        return
    build, *_middle, runtime = read_stages()
    context = DockerIgnore.read().context()
    source = lay_out(build, tmp_path / "build", context)
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run([*pip, "wheel", "--no-deps", "--no-cache-dir", "--wheel-dir", str(wheels), str(source)])
    (wheel,) = wheels.glob("htmqc-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        description = archive.read(metadata).decode()
    assert "\n# htmqc\n" in description, "the wheel lacks the README (COPY it in the build stage)"
    _run([*pip, "install", "--no-deps", "--no-cache-dir", "--target", str(site), str(wheel)])
    app = lay_out(runtime, tmp_path / "runtime", context)
    env = {**os.environ, **runtime.env(), "PYTHONPATH": str(site)}
    entry = [str(site / "bin" / runtime.exec_form("ENTRYPOINT")[0])]
    where = _run(
        [sys.executable, "-c", "import htmqc.cli, importlib.resources as r; "
         "print(htmqc.cli.__file__); "
         "assert r.files('htmqc.observe').joinpath('page.html').is_file()"],
        cwd=app, env=env,
    ).stdout  # fmt: skip
    assert where.startswith(str(site)), f"imported {where.strip()}, not the installed wheel"
    assert " run " in _run([*entry, "--help"], cwd=app, env=env).stdout
    assert "--member-id" in _run([*entry, "run", "--help"], cwd=app, env=env).stdout
    # The handler the image's examples provide loads; with no broker the run stops
    # at connecting (exit 1), past the option and handler checks (exit 2).
    done = subprocess.run(
        [*entry, *RUN_ARGS, "--connect-seconds", "1"],
        cwd=app, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and "127.0.0.1:9" in done.stderr, done.stderr[-1000:]
