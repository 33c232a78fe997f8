"""Delete the pods of an orphaned grant whose grace ran out, with an Event on each saying why.

The ``DELETE`` answers at once and the pod terminates on its slice meanwhile: reconcile sends every
such ``DELETE`` of a pass first, then waits for the pods together
(:func:`~airflow_gpupool.controller.pod_deletion.finish_deletion`) before it releases their grants.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow_gpupool.controller.events import pod_event
from airflow_gpupool.controller.pod_deletion import PodDeletion, begin_deletion

__all__ = ["ORPHAN_EVENT_REASON", "delete_orphan_pod"]

log = logging.getLogger(__name__)

#: The ``reason`` of the Event left on a pod deleted because its orphaned grant's grace ran out.
ORPHAN_EVENT_REASON = "GpuPoolOrphanDeleted"
_EVENT_SOURCE = "gpupool-reconcile"


def _event(pod: Mapping[str, Any], message: str, now: float) -> dict[str, Any]:
    return pod_event(
        pod,
        kind="Warning",
        reason=ORPHAN_EVENT_REASON,
        message=message,
        component=_EVENT_SOURCE,
        now=now,
        suffix=f"gpupool-{int(now * 1000):x}",
    )


def delete_orphan_pod(
    core_v1_api: Any, pod: Mapping[str, Any], message: str, now: float, *, grace_seconds: float | None = None
) -> PodDeletion | None:
    """Leave an Event on ``pod`` saying why, then send its ``DELETE`` (without waiting for it to go).

    :param core_v1_api: a ``kubernetes.client.CoreV1Api``
    :param pod: the pod as a JSON dict
    :param grace_seconds: its termination grace (``None``: the pod's own; 0: removed at once)
    :return: what :func:`~airflow_gpupool.controller.pod_deletion.finish_deletion` waits for before
        the slice is released; None when the pod was gone already
    """
    from kubernetes.client.exceptions import ApiException

    meta = pod.get("metadata") or {}
    namespace, name = meta.get("namespace", "default"), meta.get("name")
    try:
        core_v1_api.create_namespaced_event(namespace, _event(pod, message, now))
    except ApiException as e:  # the deletion matters; the event only explains it
        log.warning("Could not record an event on pod %s/%s: %s", namespace, name, e.reason)
    return begin_deletion(core_v1_api, namespace, str(name), grace_seconds=grace_seconds)
