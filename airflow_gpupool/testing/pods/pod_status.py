"""The pod status the simulated kubelet writes at each step of a pod's life.

Pure functions that change a pod dict in place: bound to a node (``ContainerCreating``),
unschedulable, containers waiting (``ErrImagePull``...), ``Running``, and terminated as an
:class:`Outcome` says, each with the ``status.conditions`` and ``containerStatuses`` a real
kubelet reports. The kubelet decides when; this module only knows what each step looks like.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Callable
from typing import Any


def now_timestamp(after_seconds: float = 0.0) -> str:
    """Return the current UTC time (or that many seconds later) as Kubernetes writes timestamps.

    :param after_seconds: seconds to add
    """
    at = datetime.datetime.now(tz=datetime.UTC) + datetime.timedelta(seconds=after_seconds)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a pod ends.

    :param phase: ``Succeeded`` or ``Failed``
    :param exit_code: the containers' exit code
    :param container_reason: ``Completed``, ``Error``, ``OOMKilled``...
    :param pod_reason: ``status.reason`` (``Evicted``, ``NodeLost``) or ``None``
    :param pod_message: ``status.message`` or ``None``
    :param events: ``(type, reason, message, component)`` events to record
    """

    phase: str
    exit_code: int
    container_reason: str
    pod_reason: str | None = None
    pod_message: str | None = None
    events: tuple[tuple[str, str, str, str], ...] = ()


def container_status(
    container: dict[str, Any], state: dict[str, Any], *, ready: bool = False
) -> dict[str, Any]:
    """Return a containerStatuses entry.

    :param container: the container spec
    :param state: its ``state`` (``{"waiting": ...}``, ``{"running": ...}``, ``{"terminated": ...}``)
    :param ready: readiness
    """
    image = container.get("image", "")
    return {
        "name": container.get("name"),
        "image": image,
        "imageID": f"{image}@sha256:{uuid.uuid5(uuid.NAMESPACE_URL, image).hex * 2}"
        if "running" in state or "terminated" in state
        else "",
        "containerID": f"containerd://{uuid.uuid4().hex}" if "waiting" not in state else None,
        "ready": ready,
        "started": "running" in state,
        "restartCount": 0,
        "state": state,
        "lastState": {},
    }


def condition(
    kind: str, status: bool, reason: str | None = None, message: str | None = None
) -> dict[str, Any]:
    """Return a pod condition.

    :param kind: ``PodScheduled``, ``Initialized``, ``ContainersReady`` or ``Ready``
    :param status: its truth
    :param reason: machine reason
    :param message: human message
    """
    result: dict[str, Any] = {
        "type": kind,
        "status": "True" if status else "False",
        "lastProbeTime": None,
        "lastTransitionTime": now_timestamp(),
    }
    if reason:
        result["reason"] = reason
    if message:
        result["message"] = message
    return result


def set_container_statuses(
    pod: dict[str, Any], state: Callable[[dict[str, Any]], dict[str, Any]], ready: bool = False
) -> None:
    """Set every container's status from a state builder.

    :param pod: the pod, changed in place
    :param state: builds the state of one container spec
    :param ready: readiness
    """
    containers = (pod.get("spec") or {}).get("containers") or []
    pod["status"]["containerStatuses"] = [container_status(c, state(c), ready=ready) for c in containers]


def bind(pod: dict[str, Any], node: str, host_ip: str) -> None:
    """Bind a pod to a node: ``spec.nodeName``, ``PodScheduled``, ``ContainerCreating``.

    :param pod: the pod, changed in place
    :param node: the node
    :param host_ip: the node's address
    """
    pod["spec"]["nodeName"] = node
    status = pod["status"]
    status.update({"hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "startTime": now_timestamp()})
    status["conditions"] = [
        condition("PodScheduled", True),
        condition("Initialized", True),
        condition("ContainersReady", False, "ContainersNotReady", "containers with unready status"),
        condition("Ready", False, "ContainersNotReady", "containers with unready status"),
    ]
    set_container_statuses(pod, lambda c: {"waiting": {"reason": "ContainerCreating"}})


def mark_unschedulable(pod: dict[str, Any], message: str) -> None:
    """Mark a pod unschedulable.

    :param pod: the pod, changed in place
    :param message: the scheduler's message
    """
    pod["status"]["conditions"] = [condition("PodScheduled", False, "Unschedulable", message)]


def mark_waiting(pod: dict[str, Any], reason: str, message: str) -> None:
    """Leave the containers waiting.

    :param pod: the pod, changed in place
    :param reason: e.g. ``ImagePullBackOff``
    :param message: details
    """
    set_container_statuses(pod, lambda c: {"waiting": {"reason": reason, "message": message}})


def mark_running(pod: dict[str, Any], pod_ip: str) -> None:
    """Mark a pod ``Running`` and ready.

    :param pod: the pod, changed in place
    :param pod_ip: its address
    """
    started = now_timestamp()
    status = pod["status"]
    status.update({"phase": "Running", "podIP": pod_ip, "podIPs": [{"ip": pod_ip}]})
    status["conditions"] = [
        condition("PodScheduled", True),
        condition("Initialized", True),
        condition("ContainersReady", True),
        condition("Ready", True),
    ]
    set_container_statuses(pod, lambda c: {"running": {"startedAt": started}}, ready=True)


def reject_at_admission(pod: dict[str, Any], reason: str, message: str) -> None:
    """Fail a pod its node's kubelet refused to admit (``OutOfnvidia.com/gpu``): it never runs.

    :param pod: the pod, changed in place
    :param reason: the kubelet's reason
    :param message: its message
    """
    pod["status"].update({"phase": "Failed", "reason": reason, "message": message})


def mark_terminating(pod: dict[str, Any], grace_seconds: float) -> None:
    """Mark a pod being deleted gracefully, as the API server does before its kubelet stops it.

    ``deletionTimestamp`` is when the grace ends (the API server's "gone by"), not when the
    delete came.

    :param pod: the pod, changed in place
    :param grace_seconds: the delete's grace period
    """
    meta = pod["metadata"]
    meta["deletionTimestamp"] = now_timestamp(grace_seconds)
    meta["deletionGracePeriodSeconds"] = int(grace_seconds)


def terminate(pod: dict[str, Any], outcome: Outcome) -> None:
    """Record a pod's end.

    :param pod: the pod, changed in place
    :param outcome: how it ended
    """
    finished = now_timestamp()
    status = pod["status"]
    started = {
        s["name"]: (s.get("state") or {}).get("running", {}).get("startedAt", finished)
        for s in status.get("containerStatuses") or []
    }
    status["phase"] = outcome.phase
    if outcome.pod_reason:
        status["reason"] = outcome.pod_reason
        status["message"] = outcome.pod_message
    reason = "PodCompleted" if outcome.phase == "Succeeded" else "PodFailed"
    status["conditions"] = [
        condition("PodScheduled", True),
        condition("Initialized", True),
        condition("ContainersReady", False, reason),
        condition("Ready", False, reason),
    ]

    def terminated(container: dict[str, Any]) -> dict[str, Any]:
        return {
            "terminated": {
                "exitCode": outcome.exit_code,
                "reason": outcome.container_reason,
                "startedAt": started.get(container.get("name"), finished),
                "finishedAt": finished,
                "containerID": f"containerd://{uuid.uuid4().hex}",
            }
        }

    set_container_statuses(pod, terminated)
