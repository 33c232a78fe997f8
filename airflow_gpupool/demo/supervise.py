"""Run a few long-lived processes together and stop every one of them, with its children, on a signal.

``make ui`` starts the emulator, the node agents, the controller and ``airflow standalone``, which
starts a scheduler, an API server, a triggerer and a DAG processor, which start workers. A shell
``trap`` could not stop that tree: background jobs of a non-interactive shell ignore SIGINT, the
trap runs only after the foreground ``airflow standalone`` has finished its own slow shutdown, and
``kill <pid>`` misses the grandchildren. So each service starts in a session of its own, out of
reach of the terminal's Ctrl-C, and :class:`Supervisor` alone decides: on SIGINT or SIGTERM, or
when any service ends, it sends SIGTERM to every process of those sessions and their descendants
(read from ``/proc``; Airflow moves task processes into groups of their own, never out of the
session), waits at most ``grace`` seconds, then SIGKILLs what is left. It is a subreaper, so an
orphan whose parent already exited is still found.

Standard library and the package's own errors only. Where ``/proc`` is missing (macOS), the services' process groups are signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from airflow_gpupool.exceptions import ServiceEndedError, SupervisorStoppedError

POLL_SECONDS = 0.1


@dataclass(frozen=True)
class Service:
    """A command to run under the supervisor.

    :param name: how messages name it
    :param argv: the command
    :param env: its environment (the supervisor's own when ``None``)
    :param stderr: a file its standard error is appended to (the terminal when ``None``)
    """

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    stderr: Path | None = None


@dataclass
class Supervisor:
    """Start services in process groups of their own; stop them all on a signal or when one ends.

    Use it as a context manager: entering installs the SIGINT and SIGTERM handlers, leaving stops
    every service, whatever happened inside.

    :param grace: seconds between SIGTERM and SIGKILL
    """

    grace: float = 5.0
    _running: list[tuple[Service, subprocess.Popen[bytes]]] = field(default_factory=list)
    _signal: int | None = None
    _wake: threading.Event = field(default_factory=threading.Event)
    _handlers: dict[int, Any] = field(default_factory=dict)

    def __enter__(self) -> Supervisor:
        become_subreaper()
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        try:
            self.stop()
        finally:
            for signum, handler in self._handlers.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag: raising here could leave a process started but not yet recorded.
        self._signal = signum
        self._wake.set()

    def _check(self, step: subprocess.Popen[bytes] | None = None) -> None:
        """Raise if a signal came or a service other than the one-off ``step`` ended."""
        if self._signal is not None:
            raise SupervisorStoppedError(self._signal)
        for service, process in self._running:
            code = process.poll()
            if code is not None and process is not step:
                raise ServiceEndedError(service.name, code)

    def start(self, service: Service) -> subprocess.Popen[bytes]:
        """Start a long-lived service in a new session.

        :param service: what to run
        :raises SupervisorStoppedError: a signal came before it could start
        """
        self._check()
        stderr = service.stderr.open("ab") if service.stderr is not None else None
        try:
            process = subprocess.Popen(
                list(service.argv),
                env=dict(service.env) if service.env is not None else None,
                stderr=stderr,
                start_new_session=True,  # its own session: Ctrl-C reaches the supervisor alone
            )
        finally:
            if stderr is not None:
                stderr.close()
        self._running.append((service, process))
        return process

    def run(self, service: Service) -> None:
        """Run a one-off step to its end, stopping it like a service if a signal comes first.

        :param service: what to run
        :raises ServiceEndedError: it failed (or a long-lived service ended meanwhile)
        :raises SupervisorStoppedError: a signal came first
        """
        process = self.start(service)
        while process.poll() is None:
            self._wake.wait(POLL_SECONDS)
            self._check(step=process)
        self._running.remove((service, process))
        if process.returncode != 0:
            raise ServiceEndedError(service.name, process.returncode)

    def wait_until(self, ready: Callable[[], bool], *, timeout: float, what: str) -> None:
        """Wait until ``ready()`` while every service runs.

        :param ready: the condition
        :param timeout: seconds
        :param what: what is awaited, for the error
        :raises TimeoutError: not ready in time
        :raises SupervisorStoppedError: a signal came first
        :raises ServiceEndedError: a service ended first
        """
        deadline = time.monotonic() + timeout
        while not ready():
            self._check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not ready after {timeout:g} s")
            self._wake.wait(POLL_SECONDS)

    def watch(self) -> int:
        """Wait for a signal or the end of a service; return the exit status ``make`` should see.

        130 or 143 after SIGINT or SIGTERM (128 + the signal, as a shell reports it), else the
        ended service's status (128 + the signal that killed it; 1 if it ended cleanly, since a
        service is not meant to end).
        """
        try:
            while True:
                self._check()
                self._wake.wait(POLL_SECONDS)
        except SupervisorStoppedError as stopped:
            return 128 + stopped.signum
        except ServiceEndedError as ended:
            if ended.returncode < 0:
                return 128 - ended.returncode
            return ended.returncode or 1

    def stop(self) -> None:
        """SIGTERM every process of every service, wait up to ``grace`` seconds, SIGKILL the rest, reap."""
        sessions = [process.pid for _, process in self._running]  # a leader's pid is its session's id
        _signal_all(sessions, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and self._alive(sessions):
            time.sleep(POLL_SECONDS)
        _signal_all(sessions, signal.SIGKILL)
        for _, process in self._running:
            process.wait()
        deadline = time.monotonic() + 1.0
        while self._alive(sessions) and time.monotonic() < deadline:  # SIGKILL takes a moment
            time.sleep(0.01)
        self._running.clear()

    def _alive(self, sessions: Sequence[int]) -> bool:
        for _, process in self._running:
            process.poll()  # reap the leaders that exited
        return bool(members(sessions))


def become_subreaper() -> None:
    """Adopt the orphans of our services (Linux), so that :func:`members` still finds them.

    A process that leaves its session (``setsid``, as ``start_new_session=True`` does) and
    whose parent then exits would be reparented to PID 1, out of sight; a subreaper gets it instead.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass  # not Linux: process groups still cover what does not leave its session


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    pgrp: int
    session: int
    zombie: bool


def _table() -> list[_Proc] | None:
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    table = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended while we looked
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
        state, ppid, pgrp, session = stat[stat.rindex(")") + 2 :].split()[:4]
        table.append(_Proc(int(entry.name), int(ppid), int(pgrp), int(session), state == "Z"))
    return table


def members(sessions: Sequence[int]) -> list[int]:
    """Return the live processes of the services whose sessions are given, with their descendants.

    A service's processes are those of its session (Airflow's task runner moves tasks into process
    groups of their own, not sessions), plus any descendant or adopted orphan that left it.
    Zombies are left out (the supervisor reaps its own; PID 1 of a container may never reap
    others', yet they run nothing). Without ``/proc``, a session's group with any member counts.

    :param sessions: session ids (the services' pids)
    """
    table = _table()
    if table is None:
        return [s for s in sessions if _group_exists(s)]
    ours = {p.pid for p in table if p.session in set(sessions)}
    parents = ours | {os.getpid()}
    grew = True
    while grew:
        below = {p.pid for p in table if p.ppid in parents and p.pid not in parents}
        parents |= below
        grew = bool(below)
    me = os.getpid()
    for p in table:
        if p.zombie and p.ppid == me and p.pid not in sessions:
            _reap(p.pid)  # an adopted orphan: Popen does not know it
    return sorted(p.pid for p in table if p.pid in parents and p.pid != me and not p.zombie)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _signal_all(sessions: Sequence[int], signum: int) -> None:
    for session in sessions:
        try:
            os.killpg(session, signum)  # the leader's group: also where /proc is missing
        except ProcessLookupError:
            pass
    for pid in members(sessions):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _group_exists(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
