"""The core/v1 events the simulated kubelet and scheduler record about pods.

:func:`pod_event` builds the Event object (``Scheduled``, ``Pulled``, ``Killing``, ``Evicted``...)
as Kubernetes stores it; :class:`RecordPodEvent` is the shape of the kubelet method that stores
one, so the modules that inject failures can record events without knowing the kubelet.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from airflow_gpupool.testing.pods.pod_status import now_timestamp


class RecordPodEvent(Protocol):
    """Record a core/v1 event about a pod (see :func:`pod_event` for the arguments)."""

    async def __call__(
        self,
        pod: dict[str, Any],
        kind: str,
        reason: str,
        message: str,
        component: str,
        host: str | None = None,
    ) -> None: ...


def pod_event(
    pod: dict[str, Any],
    kind: str,
    reason: str,
    message: str,
    component: str,
    host: str | None = None,
) -> dict[str, Any]:
    """Return a core/v1 Event object about a pod.

    :param pod: the pod (its metadata is enough)
    :param kind: ``Normal`` or ``Warning``
    :param reason: e.g. ``Scheduled``
    :param message: human text
    :param component: ``kubelet``, ``default-scheduler``...
    :param host: the node, for kubelet events
    """
    meta = pod["metadata"]
    now = now_timestamp()
    source = {"component": component, **({"host": host} if host else {})}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
            "namespace": meta.get("namespace"),
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": message,
        "type": kind,
        "source": source,
        "reportingComponent": component,
        "reportingInstance": host or component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
