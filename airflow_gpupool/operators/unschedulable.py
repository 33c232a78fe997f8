"""Fail a granted pod fast when the scheduler cannot place it on its granted node.

A ``GpuPodOperator`` pod is pinned to the node its slice was granted on. When kube-scheduler
marks it ``Unschedulable`` there (``PodScheduled=False``), ``KubernetesPodOperator`` would wait
out the whole schedule timeout (120 s by default) and the try would read "unknown (Pending)".
Two cases:

* the node does not advertise enough of a resource the pod asks for at all (a HAMi pod on a node
  without ``nvidia.com/gpucores``, a MIG profile the node lacks): it can never fit, whatever ends
  elsewhere, so the try fails at once with the scheduler's reason;
* the node has the resource but something holds it (a pod of the previous try still
  terminating, a pod the ledger does not know): that can pass, so the try waits
  :attr:`UnschedulableFailFast.unschedulable_grace_seconds` (default 30 s, the default
  termination grace period) unless the scheduler nominates the node for preemption, then fails
  with the reason.

Only the synchronous start-up is watched, and only through the reads of the pod that
``KubernetesPodOperator``'s start-up loop makes anyway (no read or wait of its own, so a pod that
starts normally costs nothing extra); ``deferrable=True`` pods start inside
``KubernetesPodOperator``'s trigger, which keeps its own timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any

from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import PodLaunchFailedException
from airflow.providers.cncf.kubernetes.utils.pod_manager import PodManager

from airflow_gpupool.quantity import parse_quantity


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


class UnschedulableWatch:
    """Judge each read of a starting pod: fail when it cannot be placed on its granted node.

    It adds no reads and no waits of its own: it looks at the pods ``KubernetesPodOperator``'s
    start-up loop reads anyway, at that loop's check interval.

    :param read_node: returns its granted node, or ``None`` when it is gone
    :param grace_seconds: how long a pod that may still fit is left unschedulable
    :param clock: monotonic seconds
    """

    def __init__(
        self,
        read_node: Callable[[], Any],
        *,
        grace_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_node, self._grace, self._clock = read_node, grace_seconds, clock
        self._first_seen: float | None = None

    def check(self, pod: Any) -> None:
        """Return when the pod may still be placed; raise when it cannot.

        :param pod: the pod as the API has it now
        :raises PodLaunchFailedException: with the scheduler's reason
        """
        message = unschedulable_message(pod)
        if message is None:
            self._first_seen = None
            return
        now = self._clock()
        self._first_seen = now if self._first_seen is None else self._first_seen
        why = never_fits(pod, self._read_node())
        if why is not None or now - self._first_seen >= self._grace:
            detail = why or f"still unschedulable after {self._grace:g} s"
            raise PodLaunchFailedException(
                f"The scheduler cannot place the pod on its granted node: {message} ({detail})"
            )


class _WatchedPodManager(PodManager):
    """KPO's pod manager whose every pod read is shown to a watch while one is set."""

    watch: UnschedulableWatch | None = None

    def read_pod(self, pod: Any) -> Any:
        """Read the pod as the parent does, then let the watch judge it."""
        remote = super().read_pod(pod)
        if self.watch is not None:
            self.watch.check(remote)
        return remote


class UnschedulableFailFast:
    """Mixin for ``KubernetesPodOperator`` subclasses whose pod is pinned to a granted node.

    The subclass says which node through :meth:`granted_node`.
    """

    #: How long a pod that may still fit its node is left unschedulable before the try fails.
    unschedulable_grace_seconds: float = 30.0

    def granted_node(self) -> str | None:
        """Return the node the pod is pinned to, or ``None`` (then nothing is watched)."""
        return None

    @cached_property
    def pod_manager(self) -> PodManager:
        """KPO's pod manager, able to show the start-up loop's reads to an :class:`UnschedulableWatch`."""
        op: Any = self
        return _WatchedPodManager(kube_client=op.client, callbacks=op.callbacks)

    def await_pod_start(self, pod: Any) -> None:
        """Wait as the parent does, failing at once when the pod cannot be placed on its granted node.

        :param pod: the created ``V1Pod``
        """
        node = self.granted_node()
        manager = self.pod_manager
        if node is not None and isinstance(manager, _WatchedPodManager):
            op: Any = self
            manager.watch = UnschedulableWatch(
                lambda: _read_node(op.client, node), grace_seconds=self.unschedulable_grace_seconds
            )
        try:
            super().await_pod_start(pod)  # type: ignore[misc]
        finally:
            if isinstance(manager, _WatchedPodManager):
                manager.watch = None


def _read_node(core: Any, name: str) -> Any:
    """Return a node, or ``None`` when it does not exist.

    :param core: a ``CoreV1Api``
    :param name: the node
    """
    from kubernetes.client.exceptions import ApiException

    try:
        return core.read_node(name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
