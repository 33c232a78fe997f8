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

Only the synchronous start-up is watched (``deferrable=True`` pods start inside
``KubernetesPodOperator``'s trigger, which keeps its own timeout).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import PodLaunchFailedException

from airflow_gpupool.quantity import parse_quantity

#: The first wait for a pod the scheduler has not looked at yet; doubled up to the check interval.
QUICK_LOOK_SECONDS = 0.05


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


def fail_if_unschedulable(
    read_pod: Callable[[], Any],
    read_node: Callable[[], Any],
    *,
    grace_seconds: float,
    timeout_seconds: float,
    interval_seconds: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait until the pod is scheduled (or leaves ``Pending``); fail when it cannot be placed.

    :param read_pod: returns the pod as the API has it now
    :param read_node: returns its granted node, or ``None`` when it is gone
    :param grace_seconds: how long a pod that may still fit is left unschedulable
    :param timeout_seconds: stop watching after this long (the operator's schedule timeout follows)
    :param interval_seconds: seconds between reads
    :param clock: monotonic seconds
    :param sleep: waits
    :raises PodLaunchFailedException: with the scheduler's reason
    """
    started = clock()
    first_seen: float | None = None
    quick_look = QUICK_LOOK_SECONDS
    while clock() - started < timeout_seconds:
        pod = read_pod()
        message = unschedulable_message(pod)
        if message is None:
            if pod.status is not None and (pod.status.phase not in (None, "Pending") or pod.spec.node_name):
                return
            first_seen = None
            # Not placed yet, nor refused: the scheduler usually answers within milliseconds, and a
            # whole interval here would be added to every try's start. Look again soon, backing off.
            pause, quick_look = min(quick_look, interval_seconds), quick_look * 2
        else:
            first_seen = clock() if first_seen is None else first_seen
            why = never_fits(pod, read_node())
            if why is not None or clock() - first_seen >= grace_seconds:
                detail = why or f"still unschedulable after {grace_seconds:g} s"
                raise PodLaunchFailedException(
                    f"The scheduler cannot place the pod on its granted node: {message} ({detail})"
                )
            pause = interval_seconds
        sleep(pause)


class UnschedulableFailFast:
    """Mixin for ``KubernetesPodOperator`` subclasses whose pod is pinned to a granted node.

    The subclass says which node through :meth:`granted_node`.
    """

    #: How long a pod that may still fit its node is left unschedulable before the try fails.
    unschedulable_grace_seconds: float = 30.0

    def granted_node(self) -> str | None:
        """Return the node the pod is pinned to, or ``None`` (then nothing is watched)."""
        return None

    def await_pod_start(self, pod: Any) -> None:
        """Fail at once when the pod cannot be placed on its granted node, then wait as the parent does.

        :param pod: the created ``V1Pod``
        """
        node = self.granted_node()
        if node is not None:
            op: Any = self
            fail_if_unschedulable(
                lambda: op.pod_manager.read_pod(pod),
                lambda: _read_node(op.client, node),
                grace_seconds=self.unschedulable_grace_seconds,
                timeout_seconds=float(op.schedule_timeout_seconds),
                interval_seconds=float(op.startup_check_interval_seconds),
            )
        super().await_pod_start(pod)  # type: ignore[misc]


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
