"""Graceful pod deletion as Kubernetes does it: the API server answers at once, the pod ends later.

A ``DELETE`` of a pod whose containers run (or are being created) answers at once with the pod
marked ``Terminating``: ``metadata.deletionTimestamp`` (when its grace ends) and
``deletionGracePeriodSeconds`` set, a ``MODIFIED`` watch event. The pod stays listed and its
resources stay counted by the emulator's scheduler while its containers get SIGTERM and exit
(``gpupool.emulator/sigterm-exit-seconds``; an opted-in training writes its emergency checkpoint
first), or until the grace runs out and they are killed; only then is it removed (``DELETED``).

As the API server does, a pod not bound to a node, or already ``Succeeded``/``Failed``, and a
delete with ``gracePeriodSeconds=0`` are removed at once; a second delete may shorten the
grace, never lengthen it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
from typing import TYPE_CHECKING, Any

from airflow_gpupool.testing.api.kinds import PODS
from airflow_gpupool.testing.cluster.scheduling import TERMINAL_PHASES
from airflow_gpupool.testing.pods.failures import Interruption
from airflow_gpupool.testing.pods.pod_status import mark_terminating
from airflow_gpupool.testing.pods.workload import SIGTERM

if TYPE_CHECKING:
    from airflow_gpupool.testing.api.apiserver import KubernetesApiEmulator

__all__ = ["PodTerminations"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Ending:
    """A pod being terminated: when its grace ends, and a wake-up for a shortened grace."""

    deadline: float
    shortened: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


class PodTerminations:
    """The pods being deleted gracefully, and the tasks that remove them once they end.

    :param api: the API server whose pods they are
    """

    def __init__(self, api: KubernetesApiEmulator) -> None:
        self.api = api
        self._endings: dict[str, _Ending] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def delete(self, namespace: str | None, name: str, grace_seconds: float) -> dict[str, Any] | None:
        """Delete a pod as the API server does; return what the ``DELETE`` answers with.

        :param namespace: its namespace
        :param name: its name
        :param grace_seconds: the delete's grace period (``gracePeriodSeconds``)
        :return: the pod marked terminating, or its last state when it was removed at once;
            ``None`` when there is no such pod
        """
        pod = self.api.get_object(PODS, namespace, name)
        if pod is None:
            return None
        uid = pod["metadata"]["uid"]
        status, spec = pod.get("status") or {}, pod.get("spec") or {}
        if grace_seconds <= 0 or not spec.get("nodeName") or status.get("phase") in TERMINAL_PHASES:
            await self.api.remove_pod(namespace, name)
            return pod
        loop = asyncio.get_running_loop()
        grace = math.ceil(grace_seconds)
        ending = self._endings.get(uid)
        if ending is not None:
            if loop.time() + grace < ending.deadline:  # a shorter grace wins; a longer one changes nothing
                ending.deadline = loop.time() + grace
                ending.shortened.set()
                return await self._mark(namespace, name, grace)
            return pod
        marked = await self._mark(namespace, name, grace)
        self._endings[uid] = _Ending(loop.time() + grace)
        task = loop.create_task(self._end(namespace, name, uid), name=f"terminate:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return marked

    async def _mark(self, namespace: str | None, name: str, grace: int) -> dict[str, Any] | None:
        return await self.api.update_object(
            PODS, namespace, name, functools.partial(mark_terminating, grace_seconds=grace)
        )

    async def _end(self, namespace: str | None, name: str, uid: str) -> None:
        """SIGTERM the pod's containers, wait for their exit or the grace's end, then remove the pod.

        :param namespace: its namespace
        :param name: its name
        :param uid: its uid
        """
        ending = self._endings[uid]
        how = "Deleted"
        try:
            running = self.api.kubelet.lifecycle(namespace, name)
            if running is not None:  # containers not started yet are stopped at once
                self.api.kubelet.interrupt(uid, Interruption(SIGTERM, "SIGTERM: the pod is being deleted"))
                how = await self._exit_or_kill(running, ending, name)
            await self.api.remove_pod(namespace, name, how=how)
        finally:
            self._endings.pop(uid, None)

    @staticmethod
    async def _exit_or_kill(running: asyncio.Task[None], ending: _Ending, name: str) -> str:
        """Wait until the containers exit (``Deleted``) or the grace ends (``Killed``).

        :param running: the pod's lifecycle task
        :param ending: its grace
        :param name: the pod, for the log
        """
        loop = asyncio.get_running_loop()
        while not running.done():
            remaining = ending.deadline - loop.time()
            if remaining <= 0:
                log.info("pod %s outlived its grace: its containers are killed", name)
                return "Killed"
            ending.shortened.clear()
            shortened = loop.create_task(ending.shortened.wait())
            try:
                await asyncio.wait(
                    {running, shortened}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                shortened.cancel()
        return "Deleted"

    async def shutdown(self) -> None:
        """Cancel every pending removal (the server stops)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._endings.clear()
