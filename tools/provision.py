"""Provision this machine for htmqc's tests, demo and benchmarks: ``make setup`` runs it.

Contract
--------
* Installs what is missing from Debian's packages (``apt-get``), once, and only then:
  PostgreSQL, Redis, Prometheus (``prometheus`` and ``promtool``), Chromium, a JRE, Maven and
  ``nats-server`` (NATS with JetStream; never started here: the tests and benchmarks of
  ``--source nats`` start their own, on a free port, with ``htmqc.sources.nats_server``) and
  ``rabbitmq-server`` (likewise never started here: ``--source rabbitmq-stream``'s tests
  start a private node with ``htmqc.sources.rabbitmq_server``).
* Starts the services on loopback, if they are not answering already:
  - PostgreSQL on 127.0.0.1:5432, trust authentication from 127.0.0.1 and ::1 only, a
    superuser role named after the user running this (and ``postgres``), database ``test``;
  - Redis on 127.0.0.1:6379, without persistence (no RDB snapshots, no AOF).
* Fetches Apache Kafka from Maven Central into ``build/kafka/`` (see ``tools/kafka/``),
  Spark's Kafka connector into ``build/spark-kafka/`` (see ``tools/spark-kafka/``), and
  Apicurio Registry's distribution into ``build/apicurio/app`` (see ``tools/apicurio/``;
  the Schema Registry of the serializer tests, started by them: src/htmqc/schema_registry.py),
  and Apache Pulsar's broker jars into ``build/pulsar/`` (see ``tools/pulsar/``; a standalone
  broker started by the Pulsar tests: src/htmqc/sources/pulsar_server.py).
* Idempotent, and fast when everything is there: a second run only probes (well under
  a second plus the Maven check, which is a stamp file).
* Uses the standard library only: it runs with the system ``python3`` before the venv exists.
* Bad outcome: one line ``provision: <problem> (<fix>)`` on stderr and exit 1; no traceback
  unless ``--debug``.

Nothing here is run by the tests: tests only probe (``tests/services.py``), and under
``CI=true`` a service that is not there fails the test instead of skipping it.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
SERVICES = BUILD / "services"

PG_PORT = 5432
REDIS_PORT = 6379
HBA_MARK = "# htmqc: trust on loopback (tools/provision.py)"


class ProvisionError(Exception):
    """A step that cannot be done: ``problem`` and the ``fix`` a person can apply."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem} ({fix})")


@dataclass(frozen=True)
class Package:
    """A Debian package and how to tell it is installed (any of ``probes`` exists)."""

    name: str
    probes: tuple[str, ...]

    def present(self) -> bool:
        for probe in self.probes:
            if "/" in probe:
                if glob.glob(probe):
                    return True
            elif shutil.which(probe):
                return True
        return False


PACKAGES: dict[str, Package] = {
    "postgres": Package("postgresql", ("/usr/lib/postgresql/*/bin/postgres",)),
    "redis": Package("redis-server", ("redis-server",)),
    "prometheus": Package("prometheus", ("prometheus",)),
    "promtool": Package("prometheus", ("promtool",)),
    "chromium": Package("chromium", ("chromium",)),
    "java": Package("openjdk-17-jre-headless", ("java",)),
    "maven": Package("maven", ("mvn",)),
    "nats": Package("nats-server", ("nats-server", "/usr/sbin/nats-server")),
    "rabbitmq": Package("rabbitmq-server", ("/usr/lib/rabbitmq/bin/rabbitmq-server",)),
}


def say(line: str) -> None:
    print(f"provision: {line}", flush=True)


def run(argv: Sequence[str], *, timeout: float = 900, env: dict[str, str] | None = None,
        what: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; a non-zero exit becomes a ProvisionError quoting its last line."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise ProvisionError(f"{what or argv[0]} failed: {tail}",
                             f"run `{' '.join(argv)}` by hand to see why")
    return done


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_port(port: int, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if port_open(port):
            return
        time.sleep(0.1)
    raise ProvisionError(f"{what} did not open 127.0.0.1:{port} within {seconds:.0f} s",
                         f"see its log under {SERVICES}")


# -- packages -----------------------------------------------------------------------------

def install_missing(wanted: Sequence[str]) -> None:
    """apt-get install every wanted package that is absent; nothing when all are there."""
    missing = sorted({PACKAGES[w].name for w in wanted if not PACKAGES[w].present()})
    if not missing:
        return
    apt = shutil.which("apt-get")
    if apt is None:
        raise ProvisionError(f"missing Debian packages {', '.join(missing)} and no apt-get",
                             "install them with this system's package manager")
    if os.geteuid() != 0:
        raise ProvisionError(f"missing Debian packages {', '.join(missing)}, not root",
                             f"run `sudo apt-get install -y {' '.join(missing)}`")
    say(f"installing {', '.join(missing)} from Debian (once)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Keep package scripts from starting the services themselves (there is no init
    # system here; we start them below, on loopback, our way).
    policy = Path("/usr/sbin/policy-rc.d")
    had_policy = policy.exists()
    if not had_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        run([apt, "update", "-qq"], env=env, what="apt-get update")
        run([apt, "install", "-y", "-qq", "--no-install-recommends", *missing], env=env,
            timeout=1800, what=f"apt-get install {' '.join(missing)}")
    finally:
        if not had_policy:
            policy.unlink(missing_ok=True)
    still = sorted({PACKAGES[w].name for w in wanted if not PACKAGES[w].present()})
    if still:
        raise ProvisionError(f"{', '.join(still)} still missing after apt-get install",
                             "check the apt sources of this machine")


# -- PostgreSQL ---------------------------------------------------------------------------

def _pg_cluster() -> tuple[str, str]:
    """(version, name) of the Debian cluster to use; creates ``main`` when there is none."""
    versions = sorted((Path(p).name for p in glob.glob("/usr/lib/postgresql/*")),
                      key=lambda v: [int(x) for x in v.split(".") if x.isdigit()])
    if not versions:
        raise ProvisionError("no PostgreSQL server binaries under /usr/lib/postgresql",
                             "apt-get install postgresql")
    version = versions[-1]
    if not Path(f"/etc/postgresql/{version}/main").is_dir():
        run(["pg_createcluster", version, "main", "--port", str(PG_PORT)],
            what="pg_createcluster")
    return version, "main"


def _trust_loopback(hba: Path) -> bool:
    """Put trust lines for 127.0.0.1 and ::1 first in ``hba``; True if it changed."""
    text = hba.read_text()
    if HBA_MARK in text:
        return False
    block = (f"{HBA_MARK}\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n"
             "local all all trust\n\n")
    hba.write_text(block + text)
    return True


def _psql(sql: str) -> str:
    return run(["runuser", "-u", "postgres", "--", "psql", "-h", "127.0.0.1", "-p", str(PG_PORT),
                "-d", "postgres", "-Atqc", sql], what="psql").stdout.strip()


def postgres() -> None:
    version, name = _pg_cluster()
    conf = Path(f"/etc/postgresql/{version}/{name}")
    changed = _trust_loopback(conf / "pg_hba.conf")
    up = port_open(PG_PORT)
    ctl = ["pg_ctlcluster", "--skip-systemctl-redirect", version, name]
    if up and changed:
        run([*ctl, "reload"], what="pg_ctlcluster reload")
    if not up:
        run([*ctl, "start"], timeout=120, what="pg_ctlcluster start")
        wait_port(PG_PORT, "PostgreSQL")
    me = os.environ.get("USER") or os.environ.get("LOGNAME") or "root"
    for role in sorted({me, "root", "postgres"}):
        if _psql(f"SELECT 1 FROM pg_roles WHERE rolname = '{role}'") != "1":
            _psql(f'CREATE ROLE "{role}" SUPERUSER LOGIN')
    if _psql("SELECT 1 FROM pg_database WHERE datname = 'test'") != "1":
        _psql("CREATE DATABASE test")
    say(f"PostgreSQL {version} on 127.0.0.1:{PG_PORT}, database test, trust on loopback")


# -- Redis ----------------------------------------------------------------------------------

def redis() -> None:
    if not port_open(REDIS_PORT):
        SERVICES.mkdir(parents=True, exist_ok=True)
        run(["redis-server", "--bind", "127.0.0.1", "--port", str(REDIS_PORT),
             "--save", "", "--appendonly", "no", "--daemonize", "yes",
             "--dir", str(SERVICES), "--logfile", str(SERVICES / "redis.log")],
            what="redis-server")
        wait_port(REDIS_PORT, "Redis")
    say(f"Redis on 127.0.0.1:{REDIS_PORT}, no persistence")


# -- Apache Kafka ---------------------------------------------------------------------------

def maven_jars(name: str, what: str, settings: Path | None = None) -> None:
    """Resolve ``tools/<name>/pom.xml``'s runtime jars with Maven into build/<name>/libs
    (a stamp newer than the pom makes reruns free); ``settings``: a Maven settings file."""
    pom = ROOT / "tools" / name / "pom.xml"
    if not pom.exists():
        return
    libs = BUILD / name / "libs"
    stamp = BUILD / name / ".stamp"
    if stamp.exists() and stamp.stat().st_mtime >= pom.stat().st_mtime and libs.is_dir():
        say(f"{what} jars in {libs.relative_to(ROOT)}")
        return
    say(f"fetching {what} from Maven Central (once)")
    libs.mkdir(parents=True, exist_ok=True)
    for old in libs.glob("*.jar"):
        old.unlink()
    with_settings = ["-s", str(settings)] if settings else []
    run(["mvn", "-q", "-B", *with_settings, "-f", str(pom), "dependency:copy-dependencies",
         f"-DoutputDirectory={libs}", "-DincludeScope=runtime"], timeout=1800,
        what="mvn dependency:copy-dependencies")
    stamp.touch()
    say(f"{what} jars in {libs.relative_to(ROOT)} ({len(list(libs.glob('*.jar')))} jars)")


def kafka() -> None:
    """Apache Kafka's broker jars (``tools/kafka/``)."""
    maven_jars("kafka", "Apache Kafka")


def spark_kafka() -> None:
    """Spark's Kafka connector for PySpark (``tools/spark-kafka/``; htmqc.spark.session)."""
    maven_jars("spark-kafka", "Spark's Kafka connector")


def pulsar() -> None:
    """Apache Pulsar's broker jars (``tools/pulsar/``), run as a standalone by the Pulsar
    tests (src/htmqc/sources/pulsar_server.py). Maven Central only (the Apicurio settings):
    with the default repositories the same resolution takes a minute longer."""
    maven_jars("pulsar", "Apache Pulsar", ROOT / "tools" / "apicurio" / "settings.xml")


def apicurio() -> None:
    """Apicurio Registry's distribution (``tools/apicurio/``), unpacked into
    build/apicurio/app (a stamp newer than the pom makes reruns free). Maven reads
    Maven Central only (tools/apicurio/settings.xml): the registry's parent pom names
    other repositories that nothing here needs."""
    tools = ROOT / "tools" / "apicurio"
    pom = tools / "pom.xml"
    app = BUILD / "apicurio" / "app"
    stamp = BUILD / "apicurio" / ".stamp"
    if (stamp.exists() and stamp.stat().st_mtime >= pom.stat().st_mtime
            and any(app.glob("apicurio-registry-app-*-runner.jar"))):
        say(f"Apicurio Registry in {app.relative_to(ROOT)}")
        return
    say("fetching Apicurio Registry from Maven Central (once, ~140 MB)")
    markers = BUILD / "apicurio" / "markers"  # Maven's "unpacked already" notes
    for old in (app, markers):
        shutil.rmtree(old, ignore_errors=True)
    app.mkdir(parents=True)
    run(["mvn", "-q", "-B", "-s", str(tools / "settings.xml"), "-f", str(pom),
         "dependency:unpack-dependencies", f"-DoutputDirectory={app}",
         f"-DmarkersDirectory={markers}"], timeout=1800,
        what="mvn dependency:unpack-dependencies (Apicurio Registry)")
    if not any(app.glob("apicurio-registry-app-*-runner.jar")):
        raise ProvisionError(f"no Apicurio runner jar in {app} after unpacking",
                             f"check {pom.relative_to(ROOT)}")
    stamp.touch()
    say(f"Apicurio Registry in {app.relative_to(ROOT)}")


STEPS: dict[str, tuple[tuple[str, ...], Callable[[], None] | None]] = {
    "postgres": (("postgres",), postgres),
    "redis": (("redis",), redis),
    "prometheus": (("prometheus", "promtool"), None),
    "chromium": (("chromium",), None),
    "kafka": (("java", "maven"), kafka),
    "spark-kafka": (("java", "maven"), spark_kafka),
    "apicurio": (("java", "maven"), apicurio),
    "pulsar": (("java", "maven"), pulsar),
    "nats": (("nats",), None),
    "rabbitmq": (("rabbitmq",), None),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(STEPS),
                        help=f"comma-separated subset of {', '.join(STEPS)}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in STEPS]
    if unknown:
        print(f"provision: unknown step {', '.join(unknown)} (choose from {', '.join(STEPS)})",
              file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        install_missing([pkg for step in chosen for pkg in STEPS[step][0]])
        for step in chosen:
            action = STEPS[step][1]
            if action is not None:
                action()
    except (ProvisionError, subprocess.TimeoutExpired, OSError) as exc:
        if args.debug:
            raise
        print(f"provision: {exc}", file=sys.stderr)
        return 1
    say(f"ready in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
