"""Judge a granted pod the scheduler cannot place on its node: how long to wait, and whose fault it is.

A ``GpuPodOperator`` pod is pinned to the node its slice was granted on. When kube-scheduler
marks it ``Unschedulable`` there (``PodScheduled=False``), ``KubernetesPodOperator`` would wait
out the whole schedule timeout (120 s by default) and the try would read "unknown (Pending)".
Two cases:

* the node does not advertise enough of a resource the pod asks for at all (a HAMi pod on a node
  without ``nvidia.com/gpucores``, a MIG profile the node lacks): it can never fit, whatever ends
  elsewhere, so the try fails at once with the scheduler's reason;
* the node has the resource but something holds it (a pod of the previous try still
  terminating, a pod the ledger does not know): that can pass, so the try waits the grace
  (``unschedulable_grace_seconds``, default 30 s, the default termination grace period) unless
  the scheduler nominates the node for preemption, then fails with the reason. When the
  scheduler's reason is the pod's own GPU resource (``Insufficient nvidia.com/gpu``), the
  ledger's books of the node were wrong: the :class:`Unplaceable` verdict says so, and the
  operator reports the node suspect (see :mod:`airflow_gpupool.ledger.nodes.suspects`).

The watch adds no reads and no waits of its own: it looks at the pods that
``KubernetesPodOperator``'s start-up loop reads anyway, at that loop's check interval; in the
worker (sync) through the operator's pod manager, in the triggerer (deferrable) through
:class:`WatchedAsyncPodManager`, which :class:`~airflow_gpupool.triggers.pod.LeasedPodTrigger` uses.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import PodLaunchFailedException
from airflow.providers.cncf.kubernetes.utils.pod_manager import AsyncPodManager

from airflow_gpupool.quantity import parse_quantity

#: The status of the event :class:`~airflow_gpupool.triggers.pod.LeasedPodTrigger` yields for a pod
#: the scheduler cannot place on its granted node.
UNSCHEDULABLE_STATUS = "unschedulable"

__all__ = [
    "UNSCHEDULABLE_STATUS",
    "Unplaceable",
    "UnschedulableWatch",
    "WatchedAsyncPodManager",
    "extended_requests",
    "never_fits",
    "unschedulable_message",
]


def unschedulable_message(pod: Any) -> str | None:
    """Return the scheduler's message when it has declared the pod unschedulable (and nominated no node).

    :param pod: a ``V1Pod``
    """
    status = pod.status
    if status is None or status.phase not in (None, "Pending") or status.nominated_node_name:
        return None
    for condition in status.conditions or []:
        if (
            condition.type == "PodScheduled"
            and condition.status == "False"
            and condition.reason == "Unschedulable"
        ):
            return str(condition.message or "Unschedulable")
    return None


def extended_requests(pod: Any) -> dict[str, Any]:
    """Return the extended resources (``vendor/name``) the pod's containers ask for, summed.

    :param pod: a ``V1Pod``
    """
    total: dict[str, Any] = {}
    for container in pod.spec.containers or []:
        resources = container.resources
        asked: Mapping[str, Any] = {
            **((resources.limits if resources else None) or {}),
            **((resources.requests if resources else None) or {}),
        }
        for name, quantity in asked.items():
            if "/" in name:
                total[name] = total.get(name, 0) + parse_quantity(quantity)
    return total


def never_fits(pod: Any, node: Any) -> str | None:
    """Return why the node can never hold the pod (it advertises too little of a resource), or ``None``.

    :param pod: a ``V1Pod``
    :param node: the ``V1Node`` it is pinned to, or ``None`` when that node is gone
    """
    if node is None:
        return "its granted node is gone"
    allocatable = (node.status.allocatable if node.status else None) or {}
    for name, asked in sorted(extended_requests(pod).items()):
        has = parse_quantity(allocatable.get(name, "0"))
        if has < asked:
            return f"node {node.metadata.name} advertises {has} {name}, the pod asks for {asked}"
    return None


def wants_its_own_gpus(pod: Any, message: str) -> bool:
    """Whether the scheduler's reason is short of a GPU resource the pod asks for (``Insufficient nvidia.com/gpu``).

    :param pod: a ``V1Pod``
    :param message: the scheduler's message
    """
    return any(f"Insufficient {name}" in message for name in extended_requests(pod))


@dataclass(frozen=True)
class Unplaceable:
    """Why a granted pod failed to start: the scheduler cannot place it on its node.

    :param message: the scheduler's message
    :param detail: the watch's words (the node lacks the resource, or the grace ran out)
    :param books_wrong: the node advertises enough of the pod's GPU resource but something the
        ledger does not count holds it: its books of the node were wrong
    """

    message: str
    detail: str
    books_wrong: bool

    def __str__(self) -> str:
        return f"The scheduler cannot place the pod on its granted node: {self.message} ({self.detail})"


class UnschedulableWatch:
    """Judge each read of a starting pod: fail when it cannot be placed on its granted node.

    :param read_node: returns its granted node, or ``None`` when it is gone (the sync path's
        reader; the deferrable path passes the node to :meth:`judge` itself)
    :param grace_seconds: how long a pod that may still fit is left unschedulable
    :param clock: monotonic seconds
    """

    def __init__(
        self,
        read_node: Callable[[], Any] | None = None,
        *,
        grace_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_node, self._grace, self._clock = read_node, grace_seconds, clock
        self._first_seen: float | None = None
        #: Set once the watch has failed the pod: why.
        self.verdict: Unplaceable | None = None

    def check(self, pod: Any) -> None:
        """Return when the pod may still be placed; raise when it cannot (reads the node when needed).

        :param pod: the pod as the API has it now
        :raises PodLaunchFailedException: with the scheduler's reason
        """
        message = self.seen(pod)
        if message is not None and self._read_node is not None:
            self.judge(pod, message, self._read_node())

    def seen(self, pod: Any) -> str | None:
        """Note a read of the pod; return the scheduler's message while it is unschedulable.

        :param pod: the pod as the API has it now
        """
        message = unschedulable_message(pod)
        if message is None:
            self._first_seen = None
        elif self._first_seen is None:
            self._first_seen = self._clock()
        return message

    def judge(self, pod: Any, message: str, node: Any) -> None:
        """Return when the unschedulable pod may still be placed on ``node``; raise when it cannot.

        :param pod: the pod as the API has it now
        :param message: the scheduler's message (:meth:`seen`)
        :param node: its granted ``V1Node``, or ``None`` when it is gone
        :raises PodLaunchFailedException: with the scheduler's reason; :attr:`verdict` says why
        """
        first = self._first_seen if self._first_seen is not None else self._clock()
        why = never_fits(pod, node)
        if why is None and self._clock() - first < self._grace:
            return
        books_wrong = why is None and wants_its_own_gpus(pod, message)
        self.verdict = Unplaceable(
            message, why or f"still unschedulable after {self._grace:g} s", books_wrong
        )
        raise PodLaunchFailedException(str(self.verdict))


class WatchedAsyncPodManager(AsyncPodManager):
    """The triggerer's pod manager whose every pod read is shown to a watch.

    :param async_hook: the trigger's ``AsyncKubernetesHook``
    :param watch: judges the reads
    :param read_node: reads the granted node (``None`` when it is gone)
    """

    def __init__(
        self, async_hook: Any, watch: UnschedulableWatch, read_node: Callable[[], Awaitable[Any]]
    ) -> None:
        super().__init__(async_hook=async_hook)
        self.watch = watch
        self._read_node = read_node

    async def read_pod(self, pod: Any) -> Any:
        """Read the pod as the parent does, then let the watch judge it."""
        remote = await super().read_pod(pod)
        message = self.watch.seen(remote)
        if message is not None:
            self.watch.judge(remote, message, await self._read_node())
        return remote
