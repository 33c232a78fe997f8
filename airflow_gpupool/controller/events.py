"""The Kubernetes Event the controller leaves on a pod it acts on (pure): one shape for every writer."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

__all__ = ["pod_event"]


def pod_event(
    pod: Mapping[str, Any], *, kind: str, reason: str, message: str, component: str, now: float, suffix: str
) -> dict[str, Any]:
    """Return a ``v1`` Event about ``pod`` (pure), stamped at ``now``.

    :param pod: the pod, as a dict
    :param kind: the Event's ``type``: ``Normal`` or ``Warning``
    :param reason: the Event's short, CamelCase reason
    :param message: what happened, for people
    :param component: the reporting component
    :param now: epoch seconds
    :param suffix: makes the Event's name (``<pod>.<suffix>``) unique among the pod's Events
    """
    meta = pod.get("metadata") or {}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta.get('name')}.{suffix}"},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": meta.get("namespace", "default"),
            "name": meta.get("name"),
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
