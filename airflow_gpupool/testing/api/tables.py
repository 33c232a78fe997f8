"""Server-side printing: ``meta.k8s.io/v1`` ``Table`` answers for ``kubectl get``.

``kubectl get`` asks for ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` and prints the
columns the server chose; a plain list would print only names. The columns here are the ones
the real API server prints for pods, nodes, events, namespaces and leases (priority 1 columns are
the extra ones of ``-o wide``), computed from the same fields, so what ``kubectl get pods -o wide``
shows against the emulator reads as it would against a cluster.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping
from typing import Any

Row = list[Any]
Column = tuple[str, str, int]  # name, type, priority (1: -o wide only)


def wants_table(accept: str | None) -> bool:
    """Return whether an ``Accept`` header asks for a ``Table`` (and not for aggregated discovery).

    :param accept: the header
    """
    return bool(accept) and "as=Table" in str(accept)


def _age(timestamp: str | None, now: datetime.datetime) -> str:
    """Return a Kubernetes-style age (``42s``, ``5m3s``, ``3h``, ``2d``) since a timestamp.

    :param timestamp: RFC 3339, as in ``creationTimestamp``
    :param now: the current time
    """
    if not timestamp:
        return "<unknown>"
    then = datetime.datetime.fromisoformat(str(timestamp).replace("Z", "+00:00"))
    seconds = max(0, int((now - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    return f"{hours}h" if hours < 48 else f"{hours // 24}d"


def _pod_status(pod: Mapping[str, Any]) -> str:
    """Return the STATUS column of a pod as ``kubectl`` computes it.

    :param pod: the pod
    """
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    reason = status.get("reason") or status.get("phase") or "Pending"
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if state.get("waiting", {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif "terminated" in state:
            term = state["terminated"]
            reason = term.get("reason") or ("Completed" if term.get("exitCode") == 0 else "Error")
    return str(reason)


def _pod_row(pod: Mapping[str, Any], now: datetime.datetime) -> Row:
    """Return a pod's cells.

    :param pod: the pod
    :param now: the current time
    """
    status, spec = pod.get("status") or {}, pod.get("spec") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for cs in statuses if cs.get("ready"))
    restarts = sum(int(cs.get("restartCount") or 0) for cs in statuses)
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(spec.get('containers') or [])}",
        _pod_status(pod),
        restarts,
        _age(pod["metadata"].get("creationTimestamp"), now),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        "<none>",
    ]


def _node_row(node: Mapping[str, Any], now: datetime.datetime) -> Row:
    """Return a node's cells.

    :param node: the node
    :param now: the current time
    """
    status, meta = node.get("status") or {}, node["metadata"]
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    state = "Ready" if ready else "NotReady"
    if (node.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    prefix = "node-role.kubernetes.io/"
    roles = sorted(k[len(prefix) :] for k in meta.get("labels") or {} if k.startswith(prefix))
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    info = status.get("nodeInfo") or {}
    return [
        meta["name"],
        state,
        ",".join(roles) or "<none>",
        _age(meta.get("creationTimestamp"), now),
        info.get("kubeletVersion", ""),
        addresses.get("InternalIP") or "<none>",
        addresses.get("ExternalIP") or "<none>",
        info.get("osImage", ""),
        info.get("kernelVersion", ""),
        info.get("containerRuntimeVersion", ""),
    ]


def _event_row(event: Mapping[str, Any], now: datetime.datetime) -> Row:
    """Return an event's cells.

    :param event: the event
    :param now: the current time
    """
    involved = event.get("involvedObject") or {}
    last = event.get("lastTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp")
    return [
        _age(last, now),
        event.get("type", ""),
        event.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        event.get("message", ""),
    ]


def _lease_row(lease: Mapping[str, Any], now: datetime.datetime) -> Row:
    """Return a lease's cells.

    :param lease: the lease
    :param now: the current time
    """
    holder = (lease.get("spec") or {}).get("holderIdentity") or "<none>"
    return [lease["metadata"]["name"], holder, _age(lease["metadata"].get("creationTimestamp"), now)]


def _plain_row(obj: Mapping[str, Any], now: datetime.datetime) -> Row:
    """Return NAME and AGE (namespaces, and any other kind).

    :param obj: the object
    :param now: the current time
    """
    phase = (obj.get("status") or {}).get("phase") or "Active"
    return [obj["metadata"]["name"], phase, _age(obj["metadata"].get("creationTimestamp"), now)]


_PRINTERS: dict[str, tuple[list[Column], Callable[[Mapping[str, Any], datetime.datetime], Row]]] = {
    "pods": (
        [
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "integer", 0),
            ("Age", "string", 0),
            ("IP", "string", 1),
            ("Node", "string", 1),
            ("Nominated Node", "string", 1),
            ("Readiness Gates", "string", 1),
        ],
        _pod_row,
    ),
    "nodes": (
        [
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Roles", "string", 0),
            ("Age", "string", 0),
            ("Version", "string", 0),
            ("Internal-IP", "string", 1),
            ("External-IP", "string", 1),
            ("OS-Image", "string", 1),
            ("Kernel-Version", "string", 1),
            ("Container-Runtime", "string", 1),
        ],
        _node_row,
    ),
    "events": (
        [
            ("Last Seen", "string", 0),
            ("Type", "string", 0),
            ("Reason", "string", 0),
            ("Object", "string", 0),
            ("Message", "string", 0),
        ],
        _event_row,
    ),
    "leases": ([("Name", "string", 0), ("Holder", "string", 0), ("Age", "string", 0)], _lease_row),
}
_PLAIN: tuple[list[Column], Callable[[Mapping[str, Any], datetime.datetime], Row]] = (
    [("Name", "string", 0), ("Status", "string", 0), ("Age", "string", 0)],
    _plain_row,
)


def _row_object(obj: Mapping[str, Any], include: str) -> dict[str, Any] | None:
    """Return what a row carries of its object, as ``includeObject`` asks.

    :param obj: the object
    :param include: ``None``, ``Metadata`` (the default) or ``Object``
    """
    if include == "None":
        return None
    if include == "Object":
        return dict(obj)
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata", {}),
    }


def table(
    plural: str,
    objects: Iterable[Mapping[str, Any]],
    *,
    resource_version: str,
    include_object: str | None = None,
    now: datetime.datetime | None = None,
) -> dict[str, Any]:
    """Return a ``meta.k8s.io/v1`` ``Table`` of objects.

    :param plural: the resource's plural name (picks the columns)
    :param objects: the objects, in order
    :param resource_version: the list's ``resourceVersion``
    :param include_object: the request's ``includeObject`` parameter
    :param now: the current time (ages are measured from it)
    """
    now = now or datetime.datetime.now(tz=datetime.UTC)
    columns, printer = _PRINTERS.get(plural, _PLAIN)
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": printer(obj, now)}
        carried = _row_object(obj, include_object or "Metadata")
        if carried is not None:
            row["object"] = carried
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [
            {
                "name": name,
                "type": kind,
                "format": "name" if name == "Name" else "",
                "description": "",
                "priority": priority,
            }
            for name, kind, priority in columns
        ],
        "rows": rows,
    }
