"""Start, watch and stop the processes of a real multi-worker Airflow for the end-to-end test.

:class:`ProcessGroup` runs each process in a session of its own with its output in a log file,
waits on readiness (a health endpoint, a log line, a predicate) instead of fixed sleeps, puts the
tail of every log into a failure message, and kills every process and its descendants at exit.
:func:`airflow_env` is the environment all the Airflow processes share: the Celery executor on
Redis, PostgreSQL as the metadata database, fast detection of a dead worker's task.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import psutil

ROOT = Path(__file__).resolve().parents[3]
DAGS_FOLDER = Path(__file__).parent / "dags"
BIN = Path(sys.executable).parent
LOG_TAIL_LINES = 40

T = TypeVar("T")


class HarnessError(AssertionError):
    """A process died or a wait timed out; the message carries the tail of every log."""


def free_port() -> int:
    """Return a TCP port that is free now on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_ok(url: str) -> Any:
    """Return the decoded JSON (or ``True``) of a 200 answer from ``url``, else ``None``.

    :param url: the URL
    """
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            body = response.read()
    except (OSError, urllib.error.URLError):
        return None
    try:
        return json.loads(body)
    except ValueError:
        return True


@dataclass
class ManagedProcess:
    """A process started by :class:`ProcessGroup`, its output in ``log_path``."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def descendants(self) -> list[psutil.Process]:
        """Return the live processes under this one (task supervisors and runners included)."""
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def kill_all(self, sig: int = signal.SIGKILL) -> list[int]:
        """Send ``sig`` to the process's group and to every descendant; return the pids signalled.

        The task runner of an Airflow 3 task puts itself in a process group of its own, so the
        group alone would miss it: every descendant found before the signal gets it too.
        """
        victims = [self.pid, *(p.pid for p in self.descendants())]
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        for pid in victims:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return victims


@dataclass
class ProcessGroup:
    """Processes of one test; everything still running is killed at exit.

    :param log_dir: where each process's log goes (``<name>.log``)
    :param env: the environment of every process (``env=`` of :meth:`start` adds to it)
    """

    log_dir: Path
    env: Mapping[str, str]
    processes: dict[str, ManagedProcess] = field(default_factory=dict)

    def __enter__(self) -> Self:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()

    def start(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> ManagedProcess:
        """Start ``argv`` in a new session (its own process group), output to ``<name>.log``.

        :param name: a short name for messages and the log file
        :param argv: the command
        :param env: variables added to the group's environment
        """
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**self.env, **(env or {})},
                cwd=self.log_dir,
                start_new_session=True,
            )
        process = ManagedProcess(name, popen, log_path)
        self.processes[name] = process
        return process

    def airflow(self, name: str, *args: str, env: Mapping[str, str] | None = None) -> ManagedProcess:
        """Start ``airflow <args>`` from this interpreter's environment."""
        return self.start(name, [str(BIN / "airflow"), *args], env)

    def stop_all(self) -> None:
        """SIGTERM every process tree, then SIGKILL whatever is left after a few seconds."""
        trees = {name: [p.pid, *(d.pid for d in p.descendants())] for name, p in self.processes.items()}
        for process in self.processes.values():
            if process.alive():
                process.kill_all(signal.SIGTERM)
        deadline = time.monotonic() + 8
        for process in self.processes.values():
            try:
                process.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for pids in trees.values():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for process in self.processes.values():
            try:
                process.popen.wait(5)
            except subprocess.TimeoutExpired:
                pass

    def report(self, headline: str) -> str:
        """Return ``headline`` followed by the tail of every process's log."""
        parts = [headline]
        for p in self.processes.values():
            state = (
                "killed by the test"
                if p.killed
                else ("running" if p.alive() else f"exited {p.popen.returncode}")
            )
            parts.append(
                f"\n----- {p.name} ({state}), last {LOG_TAIL_LINES} lines of {p.log_path} -----\n{p.tail()}"
            )
        return "\n".join(parts)

    def check_alive(self) -> None:
        """Fail with every log's tail if a process died that the test did not kill."""
        dead = [p.name for p in self.processes.values() if not p.killed and not p.alive()]
        if dead:
            raise HarnessError(self.report(f"process(es) died: {', '.join(dead)}"))

    def wait_for(self, what: str, check: Callable[[], T | None], timeout: float, interval: float = 0.5) -> T:
        """Poll ``check`` until it returns something other than ``None``/``False``; return it.

        Fails at once if a process dies, and after ``timeout`` seconds with every log's tail.

        :param what: what is awaited, for the message
        :param check: the predicate
        :param timeout: seconds
        :param interval: seconds between polls
        """
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            value = check()
            if value is not None and value is not False:
                return value
            if time.monotonic() > deadline:
                raise HarnessError(self.report(f"timed out after {timeout:g}s waiting for {what}"))
            time.sleep(interval)

    def wait_for_line(self, name: str, pattern: str, timeout: float) -> str:
        """Wait until the log of process ``name`` has a line matching ``pattern``; return it."""
        regex = re.compile(pattern)
        process = self.processes[name]

        def found() -> str | None:
            match = regex.search(process.log())
            return match.group(0) if match else None

        return self.wait_for(f"{name} to log /{pattern}/", found, timeout)


def airflow_env(
    *,
    home: Path,
    metadata_url: str,
    broker_url: str,
    api_port: int,
    ledger_url: str,
    kubeconfig: str,
    jwt_secret: str,
) -> dict[str, str]:
    """Return the environment of every Airflow process (and the controller).

    Inherited ``AIRFLOW*`` variables (the test session's own Airflow settings, its unit-test
    mode) are dropped, so the processes see only this configuration.

    :param home: ``AIRFLOW_HOME``
    :param metadata_url: the metadata database (``postgresql+psycopg://...``)
    :param broker_url: the Celery broker (``redis://...``)
    :param api_port: the API server's port (the workers' execution API)
    :param ledger_url: the GPU ledger
    :param kubeconfig: the emulator's kubeconfig
    :param jwt_secret: the secret the API server and the workers share
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    connection = {
        "conn_type": "gpupool",
        "extra": {"ledger_url": ledger_url, "poll_interval_seconds": 0.5},
    }
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "KUBECONFIG": kubeconfig,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW_CONN_GPUPOOL_DEFAULT": json.dumps(connection),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(api_port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{api_port}",
            "AIRFLOW__API_AUTH__JWT_SECRET": jwt_secret,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
            # Airflow's async engine would want asyncpg; psycopg 3 serves both.
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": metadata_url,
            "AIRFLOW__CELERY__BROKER_URL": broker_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + metadata_url,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "4",
            "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
            # A dead worker's running task is failed (then retried) after 10 s without heartbeat,
            # looked for every 2 s; live tasks heartbeat at least every few seconds.
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "10",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
            # A message the dead worker had taken but not started stays queued: requeue it soon.
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "40",
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        }
    )
    return env


def start_airflow(procs: ProcessGroup, api_port: int) -> None:
    """Start the API server, the scheduler, the DAG processor and the triggerer.

    :param procs: the test's processes (their environment from :func:`airflow_env`)
    :param api_port: the API server's port
    """
    procs.airflow(
        "api-server", "api-server", "--workers", "1", "--port", str(api_port), "--host", "127.0.0.1"
    )
    procs.airflow("scheduler", "scheduler")
    procs.airflow("dag-processor", "dag-processor")
    procs.airflow("triggerer", "triggerer")


def wait_until_healthy(procs: ProcessGroup, api_port: int, timeout: float) -> dict[str, Any]:
    """Wait until the API server's health endpoint reports every component healthy; return it.

    :param procs: the test's processes
    :param api_port: the API server's port
    :param timeout: seconds
    """
    url = f"http://127.0.0.1:{api_port}/api/v2/monitor/health"
    parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")

    def healthy() -> dict[str, Any] | None:
        health = http_ok(url)
        if isinstance(health, dict) and all((health.get(p) or {}).get("status") == "healthy" for p in parts):
            return health
        return None

    return procs.wait_for("the API server to report every component healthy", healthy, timeout)


def start_celery_worker(procs: ProcessGroup, name: str) -> ManagedProcess:
    """Start ``airflow celery worker`` as ``<name>@host`` and wait until Celery says it is ready.

    It serves no logs (two workers on one machine would fight for the log server's port; the
    task logs are local files anyway) and skips gossip and mingle, which only slow its start.

    :param procs: the test's processes
    :param name: the worker's name, also its log's
    """
    return procs.airflow(
        name, "celery", "worker", "--celery-hostname", f"{name}@%h",
        "--skip-serve-logs", "--without-gossip", "--without-mingle",
    )  # fmt: skip


def wait_until_ready(procs: ProcessGroup, worker: ManagedProcess, timeout: float) -> None:
    """Wait until a Celery worker logs ``<name>@host ready.``

    :param procs: the test's processes
    :param worker: the worker
    :param timeout: seconds
    """
    procs.wait_for_line(worker.name, rf"{re.escape(worker.name)}@\S+ ready", timeout)
