"""Shared pytest fixtures: the brokers and fresh topics on them; and the
Hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE``: ``ci`` (default, bounded),
``thorough`` (``make verify-long``) and ``fast`` (a developer's quick run; it
misses bugs that ``ci`` finds).

Broker tests carry ``@pytest.mark.broker`` and take the ``broker`` fixture (or
``new_topic``); each test gets its own uniquely named topics, so tests do not see
each other's messages. Which broker a test gets is its ``broker_kind``
parameter (the test id ends in ``[tansu]``, ``[kafka]`` or ``[kafka3]``):

- ``tansu``: the bundled broker (:mod:`htmqc.broker`), one per session; it
  starts in well under a second and keeps data in memory;
- ``kafka``: Apache Kafka, one combined KRaft node per session
  (:mod:`htmqc.kafka_cluster`), started when the first test needs it;
- ``kafka3``: a three-node Kafka cluster (replication factor 3, min ISR 2), per
  session, for tests that need replication or failover.

Where a test runs: ``@pytest.mark.brokers("tansu", "kafka")`` on the module or
test lists its kinds; a broker test without it runs on Tansu, and with
``--kafka-full`` on Kafka too (the long tier; those Kafka instances also carry
``kafka_full``, and so may a test by hand: it is skipped without the option).
``@pytest.mark.tansu_only`` marks tests of the bundled broker itself (never on
Kafka). ``@pytest.mark.tansu_deviation("why")`` marks a test that passes on
Kafka and fails on Tansu because Tansu deviates from Kafka: it runs on both by
default, a strict ``xfail`` on Tansu. A test that takes the ``group_protocol``
fixture runs on Kafka under both consumer-group protocols (``[kafka]`` classic,
``[kafka-consumer]`` KIP-848). Every Kafka instance carries the marker
``kafka``: ``-m "not kafka"`` runs without Java, ``-m kafka`` only on Kafka. The
markers are registered here (:data:`MARKERS`), as pyproject.toml's
``--strict-markers`` wants.

Tiers: a test that needs a broker (or Java), Spark or a subprocess service is
marked ``slow`` here (:func:`_slow`) or by hand; ``-m "not slow and not formal"``
is the fast tier (``make test-fast``). A fast-tier test starts no process: while
one is set up and runs, every way of starting a process (``subprocess``, ``os.system``,
``os.posix_spawn``, the forks) raises :class:`ProcessInFastTier` and the test
fails, even if it caught the error; a test that needs a child interpreter, a
command-line tool or a browser is marked ``@pytest.mark.slow`` by hand. The guard
is the same in every run, so ``make test`` runs the same tests and catches a
misfiled one too.
"""

from __future__ import annotations

import _posixsubprocess
import os
import re
import subprocess
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from htmqc.broker import Broker, create_topic, start_broker
from htmqc.errors import HtmqcError
from htmqc.kafka_cluster import KafkaCluster, java_binary, kafka_libs, start_kafka
from htmqc.logs import unlimit_repeats
from tests.services import missing

#: stops a test process whose memory runs away, naming the test (see its docstring)
pytest_plugins = ["tests.memory_guard"]

TopicFactory = Callable[..., str]

#: profile -> (max_examples, stateful_step_count); the tests set no budgets of their own.
PROFILES = {"ci": (300, 100), "thorough": (5000, 200), "fast": (40, 50)}
for _name, (_examples, _steps) in PROFILES.items():
    settings.register_profile(
        _name,
        max_examples=_examples,
        stateful_step_count=_steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


def _load_hypothesis_profile() -> None:
    """Load the profile ``HYPOTHESIS_PROFILE`` names (default ``ci``)."""
    name = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    if name not in PROFILES:
        raise pytest.UsageError(
            f"HYPOTHESIS_PROFILE={name!r} is not a profile; use one of {', '.join(PROFILES)}"
        )
    settings.load_profile(name)


BROKER_KINDS = ("tansu", "kafka", "kafka3")
MARKERS = (
    "brokers(*kinds): the broker kinds (tansu, kafka, kafka3) a broker test runs on by default",
    "tansu_only: tests the bundled broker itself; never runs on Apache Kafka",
    "tansu_deviation(reason): Tansu deviates from Kafka here: strict xfail on Tansu, "
    "a plain test on Kafka",
    "kafka: this test instance runs on Apache Kafka (applied automatically)",
    "kafka_full: a Kafka test that runs only with --kafka-full (the long tier)",
    "serial: timing-sensitive (an exit deadline, a race it must win): `make pytest` runs it "
    "alone, after the tests it runs two at a time",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kafka-full",
        action="store_true",
        default=False,
        help="run every broker test on Apache Kafka too, not only the default Kafka set",
    )


def pytest_configure(config: pytest.Config) -> None:
    _load_hypothesis_profile()
    for line in MARKERS:
        config.addinivalue_line("markers", line)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``broker_kind`` (and ``group_protocol``) by the test's markers.

    A test that takes ``group_protocol`` runs on every Kafka kind under both
    group protocols (``classic``, and KIP-848's ``consumer``, id suffix
    ``-consumer``); Tansu has the classic protocol only.
    """
    if "broker_kind" not in metafunc.fixturenames:
        return
    node = metafunc.definition
    chosen = node.get_closest_marker("brokers")
    kinds = list(chosen.args) if chosen is not None else ["tansu"]
    unknown = sorted(set(kinds) - set(BROKER_KINDS))
    if unknown:
        raise pytest.UsageError(f"{node.nodeid}: unknown broker kinds {unknown}")
    deviation = node.get_closest_marker("tansu_deviation")
    if deviation is not None and "kafka" not in kinds:
        kinds.append("kafka")  # the deviation is shown by the Kafka twin passing
    extra = (
        metafunc.config.getoption("kafka_full")
        and "kafka" not in kinds
        and node.get_closest_marker("tansu_only") is None
    )
    protocols = "group_protocol" in metafunc.fixturenames
    params = []
    for kind in [*kinds, *(["kafka"] if extra else [])]:
        marks: list[pytest.MarkDecorator] = []
        if kind != "tansu":
            marks.append(pytest.mark.kafka)
        if kind == "kafka" and extra:
            marks.append(pytest.mark.kafka_full)
        if kind == "tansu" and deviation is not None:
            marks.append(pytest.mark.xfail(strict=True, reason=str(deviation.args[0])))
        if not protocols:
            params.append(pytest.param(kind, marks=marks, id=kind))
            continue
        params.append(pytest.param(kind, "classic", marks=marks, id=kind))
        if kind != "tansu":
            params.append(pytest.param(kind, "consumer", marks=marks, id=f"{kind}-consumer"))
    names = ["broker_kind", "group_protocol"] if protocols else ["broker_kind"]
    metafunc.parametrize(names, params, indirect=True)


#: Fixtures that start or need a broker: a test using one is ``slow``.
_BROKER_FIXTURES = frozenset({"broker", "tansu_broker", "kafka_broker", "kafka3_broker"})


#: Test files (relative to ``tests/``) that start brokers, Java, Prometheus or
#: Chromium in subprocesses without the broker fixtures.
_SLOW_FILES = ("broker/", "security/test_tls.py", "observe/test_ops.py")


def _slow(item: pytest.Item) -> bool:
    """Whether ``item`` belongs to the slow tier: it needs a broker (or Java), runs
    Spark or another subprocess service, or is marked ``slow`` by hand (as every
    test that starts a process must be: :class:`ProcessInFastTier`)."""
    if item.get_closest_marker("slow") is not None or item.get_closest_marker("kafka"):
        return True
    if _BROKER_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    where = item.path.relative_to(Path(__file__).parent).as_posix()
    return where.startswith(("spark/", *_SLOW_FILES))


#: The longest test files (relative to ``tests/``), longest first: about 407 down to
#: 60 seconds each in one `make pytest-parallel` run of 1085 s here (2026-12-08).
#: pytest-xdist's ``--dist loadfile`` hands files out in collection order, and the
#: Spark files among these came last (``spark/`` sorts late): the run ended on them
#: while the other workers idled. Scheduled first, the short files fill the end. A stale entry only
#: costs order; a missing file fails ``tests/test_schedule.py``.
LONGEST_FIRST = (
    "runtime/test_modes_broker.py",
    "spark/test_cluster.py",
    "sources/test_source_contract.py",
    "spark/test_audit_job.py",
    "spark/test_kafka_source.py",
    "chaos/test_fence_broker.py",
    "sources/test_pulsar_members_run.py",
    "runtime/test_run_broker.py",
    "runtime/test_examples.py",
    "chaos/test_chaos_ci_broker.py",
    "spark/test_example.py",
    "spark/test_audit_pipeline.py",
    "sinks/test_lag_commits.py",
    "sources/test_pulsar_server.py",
    "sinks/test_kafka_sink.py",
    "sources/test_pulsar_adapter.py",
    "sources/test_rabbitmq_run.py",
    "dlq/test_redrive_after_fix.py",
    "bench/test_peers_kill.py",
    "dlq/test_kafka_dlq.py",
)
_RANK = {name: rank for rank, name in enumerate(LONGEST_FIRST)}


def schedule_rank(path: Path) -> int:
    """Where the file at ``path`` goes in the run: its place in :data:`LONGEST_FIRST`,
    the others after them all (in collection order, the sort being stable)."""
    return _RANK.get(path.relative_to(Path(__file__).parent).as_posix(), len(_RANK))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first (:data:`LONGEST_FIRST`), each file's tests in their
    order. Tests marked ``kafka_full`` by hand run only with ``--kafka-full``; the
    slow tier (:func:`_slow`) is marked ``slow``, so ``-m "not slow"`` is the fast one."""
    items.sort(key=lambda item: schedule_rank(item.path))
    for item in items:
        if _slow(item) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    if config.getoption("kafka_full"):
        return
    skip = pytest.mark.skip(reason="the long Kafka tier: run with --kafka-full")
    for item in items:
        if item.get_closest_marker("kafka_full") is not None:
            item.add_marker(skip)


def _fast(item: pytest.Item) -> bool:
    """Whether ``item`` is in the fast tier (``-m "not slow and not formal"``)."""
    return item.get_closest_marker("slow") is None and item.get_closest_marker("formal") is None


class ProcessInFastTier(RuntimeError):
    """A fast-tier test (or its fixtures) tried to start a process."""


#: The fast-tier test now in setup or call (None: a slow test, a teardown, between tests).
_guarded: pytest.Item | None = None
#: What the guarded test tried to start, said in its report.
_attempts: list[str] = []


def _refusing(
    name: str, real: Callable[..., Any], argv: Callable[..., object]
) -> Callable[..., Any]:
    """``real``, refusing while a fast-tier test runs (``argv`` picks what to name)."""

    def start(*args: Any, **kwargs: Any) -> Any:
        if _guarded is None:
            return real(*args, **kwargs)
        try:
            what = f"{name}({argv(*args, **kwargs)!r})"
        except Exception:  # naming it must not hide the refusal
            what = f"{name}(...)"
        _attempts.append(what)
        raise ProcessInFastTier(
            f"{what}: a fast-tier test starts no process (no broker, no subprocess, no "
            f"browser); mark it `slow` (tests/conftest.py: _SLOW_FILES or @pytest.mark.slow)"
        )

    return start


def _first(*args: Any, **_: Any) -> object:
    return args[0] if args else None


def _second(*args: Any, **_: Any) -> object:
    return args[1] if len(args) > 1 else None


def _nothing(*_: Any, **__: Any) -> object:
    return None


# Every way a test could start a process: subprocess.Popen (and so asyncio's
# subprocesses) goes through subprocess._fork_exec (_posixsubprocess.fork_exec,
# which multiprocessing's spawn calls) or os.posix_spawn; the rest is os.system and
# the forks. Installed once; they act only while a fast-tier test runs
# (:func:`pytest_runtest_protocol`), so `make test` runs the same tests, and a test
# marked slow starts what it likes.
_posixsubprocess.fork_exec = _refusing("fork_exec", _posixsubprocess.fork_exec, _first)
subprocess._fork_exec = _refusing(  # type: ignore[attr-defined]  # Popen's own reference
    "subprocess", subprocess._fork_exec, _first  # type: ignore[attr-defined]
)
os.posix_spawn = _refusing("posix_spawn", os.posix_spawn, _second)
os.posix_spawnp = _refusing("posix_spawnp", os.posix_spawnp, _second)
os.system = _refusing("os.system", os.system, _first)
os.fork = _refusing("os.fork", os.fork, _nothing)
os.forkpty = _refusing("os.forkpty", os.forkpty, _nothing)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Guard a fast-tier test, its fixtures' setup included, against starting processes."""
    global _guarded
    _guarded = item if _fast(item) else None
    _attempts.clear()
    try:
        return (yield)
    finally:
        _guarded = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Teardown is not guarded: it also finalizes the module's and the session's
    fixtures that slow tests set up (a broker, Chromium) after the last test using
    them, which may be a fast one."""
    global _guarded
    _guarded = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A fast-tier test that tried to start a process fails, even if it caught the
    :class:`ProcessInFastTier` (or skipped on it)."""
    report = yield
    if _attempts and item is _guarded and not report.failed:
        report.outcome = "failed"
        report.longrepr = (
            f"a fast-tier test tried to start a process ({', '.join(_attempts)}): "
            "mark it `slow`"
        )
    _attempts.clear()
    return report


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A throwaway CA with a server and a client certificate (tests/security/certs.py)."""
    from tests.security.certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"), "good")


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Another CA, which signed nothing that :func:`pki`'s server presents or accepts."""
    from tests.security.certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki-other"), "other")


@pytest.fixture
def broker_kind(request: pytest.FixtureRequest) -> str:
    """The kind of broker this test instance runs on (see the module docs)."""
    return str(request.param)


@pytest.fixture
def group_protocol(request: pytest.FixtureRequest) -> str:
    """The consumer-group protocol this test instance runs ``htmqc run`` with."""
    return str(request.param)


@pytest.fixture
def broker(broker_kind: str, request: pytest.FixtureRequest) -> Broker | KafkaCluster:
    """The session's broker of this test's kind; ``.bootstrap`` is for clients."""
    running: Broker | KafkaCluster = request.getfixturevalue(f"{broker_kind}_broker")
    return running


@pytest.fixture(scope="session")
def tansu_broker() -> Iterator[Broker]:
    """One bundled broker on a free loopback port for the whole session."""
    try:
        running = start_broker()
    except HtmqcError as exc:
        pytest.fail(f"cannot start the bundled broker: {exc.line()}", pytrace=False)
    with running:
        yield running


def _kafka(nodes: int) -> Iterator[KafkaCluster]:
    try:
        java_binary()
        kafka_libs()
    except HtmqcError as exc:
        missing(exc.problem)
    try:
        cluster = start_kafka(nodes)
    except HtmqcError as exc:
        pytest.fail(f"cannot start Apache Kafka ({nodes} nodes): {exc.line()}", pytrace=False)
    with cluster:
        cluster.warm_up()  # internal topics now, not under the first test's feet
        yield cluster


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaCluster]:
    """One combined Apache Kafka node for the whole session (started on first use)."""
    yield from _kafka(1)


@pytest.fixture(scope="session")
def kafka3_broker() -> Iterator[KafkaCluster]:
    """A three-node Apache Kafka cluster for the whole session (started on first use)."""
    yield from _kafka(3)


@pytest.fixture
def new_topic(broker: Broker | KafkaCluster, request: pytest.FixtureRequest) -> TopicFactory:
    """``new_topic(partitions=1, prefix=None) -> name``: a fresh topic on ``broker``."""

    def make(partitions: int = 1, prefix: str | None = None) -> str:
        base = prefix or re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:40]
        name = f"{base}-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, name, partitions)
        return name

    return make


@pytest.fixture
def topic_factory(new_topic: TopicFactory) -> TopicFactory:
    """The same factory as :func:`new_topic`, under the name other suites use."""
    return new_topic


@pytest.fixture(autouse=True)
def _fresh_log_limits() -> Iterator[None]:
    """Each test starts without the rate limits a run installs on htmqc's loggers
    (:func:`htmqc.logs.limit_repeats`): a summary line one test's run held back
    must not appear in another test's log capture. Held lines are said at teardown."""
    yield
    unlimit_repeats()
