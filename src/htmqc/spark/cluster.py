"""A Spark standalone cluster on loopback from the PySpark package: one master
and N workers (``bin/spark-class org.apache.spark.deploy.master.Master`` and
``...deploy.worker.Worker``), each worker's executors in processes of their own.

:func:`start_cluster` returns a :class:`SparkCluster` once the master's log says
every worker registered; ``close()`` kills the daemons and the executors they
started and removes the working directory. Daemons get the caller's environment
plus ``PYSPARK_PYTHON`` (this interpreter) and ``PYTHONPATH`` (this process's
``sys.path``), so executors import the same htmqc. Linux only for
:meth:`SparkCluster.executor_pids` (``/proc``); daemons die with the caller on
Linux (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

from htmqc.broker import _die_with_parent
from htmqc.errors import RuntimeFailure
from htmqc.loopback import free_port

HOST = "127.0.0.1"
_MASTER = "org.apache.spark.deploy.master.Master"
_WORKER = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """The PySpark package's directory (it holds ``bin/spark-class`` and ``jars``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: IO[bytes]


@dataclass
class SparkCluster:
    """A running master and its workers; ``url`` is the ``spark://`` master URL."""

    url: str
    work_dir: Path
    daemons: list[_Daemon] = field(default_factory=list)

    @property
    def workers(self) -> list[int]:
        """The workers' process ids, in start order."""
        return [d.process.pid for d in self.daemons if d.name.startswith("worker")]

    def executor_pids(self, worker: int) -> list[int]:
        """The executor JVMs worker number ``worker`` (0-based) runs now."""
        return _children(self.workers[worker])

    def kill_executors(self, worker: int) -> list[int]:
        """SIGKILL every executor of worker ``worker``; their ids."""
        pids = self.executor_pids(worker)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return pids

    def close(self) -> None:
        """Kill the daemons and their executors, wait for them, remove the work dir."""
        executors = [pid for i in range(len(self.workers)) for pid in self.executor_pids(i)]
        for daemon in reversed(self.daemons):
            if daemon.process.poll() is None:
                daemon.process.kill()
        for pid in executors:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for daemon in self.daemons:
            daemon.process.wait()
            daemon.log.close()
        self.daemons.clear()
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> SparkCluster:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return sorted(set(out))


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", HOST)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.setdefault("SPARK_DAEMON_MEMORY", "256m")
    env.pop("SPARK_HOME", None)  # spark-class finds the package's own
    return env


def start_cluster(
    workers: int = 2, cores: int = 1, memory: str = "1g", timeout: float = 90.0
) -> SparkCluster:
    """Start a master and ``workers`` workers (``cores`` and ``memory`` each) on
    loopback with free ports.

    :raises RuntimeFailure: a daemon exits or not all workers register in ``timeout``.
    """
    work = Path(tempfile.mkdtemp(prefix="htmqc-spark-cluster-"))
    home = spark_home()
    env = _environment()
    port = free_port()
    cluster = SparkCluster(f"spark://{HOST}:{port}", work)

    def spawn(name: str, *args: str) -> None:
        log = (work / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [str(home / "bin" / "spark-class"), *args],
            env=env,
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        cluster.daemons.append(_Daemon(name, process, log))

    try:
        spawn("master", _MASTER, "--host", HOST, "--port", str(port),
              "--webui-port", str(free_port()))  # fmt: skip
        for n in range(workers):
            spawn(
                f"worker{n}", _WORKER, cluster.url, "--host", HOST,
                "--cores", str(cores), "--memory", memory,
                "--webui-port", str(free_port()), "--work-dir", str(work / f"worker{n}"),
            )  # fmt: skip
        _wait_registered(cluster, workers, timeout)
    except BaseException:
        cluster.close()
        raise
    return cluster


def _wait_registered(cluster: SparkCluster, workers: int, timeout: float) -> None:
    master_log = cluster.work_dir / "master.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for daemon in cluster.daemons:
            if daemon.process.poll() is not None:
                raise RuntimeFailure(
                    f"Spark {daemon.name} exited with {daemon.process.returncode}",
                    f"see {cluster.work_dir / (daemon.name + '.log')}",
                )
        if master_log.read_text(errors="replace").count("Registering worker") >= workers:
            return
        time.sleep(0.2)
    raise RuntimeFailure(
        f"{workers} Spark workers did not register with {cluster.url} in {timeout:g} s",
        f"see the logs in {cluster.work_dir}",
    )
