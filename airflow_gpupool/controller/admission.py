"""What the gatekeeper writes to a gated pod it admits or refuses (pure): the admission patch, its Events.

Kept apart from the pass (:mod:`~airflow_gpupool.controller.gatekeeper`), which decides what to
admit; this module only says how a decision is written to the pod.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_gpupool.controller.events import pod_event
from airflow_gpupool.labels import (
    ANNOTATION_PREFIX,
    GPU_RESOURCE,
    GPUS_ANNOTATION,
    HOSTNAME_LABEL,
    NODE_ANNOTATION,
    RESERVATION_LABEL,
    SCHEDULING_GATE,
)

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Grant

__all__ = ["GPU_TOLERATION", "admission_patch", "gatekeeper_event"]

_SOURCE = "gpupool-gatekeeper"
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def admission_patch(pod: Mapping[str, Any], reservation_id: str, grant: Grant) -> list[dict[str, Any]]:
    """Return the JSON patch that pins a gated pod to its grant and removes our gate (pure).

    Only what Kubernetes allows on a gated pod: labels and annotations, a ``nodeSelector`` entry,
    an added toleration, gates removed. JSON patch (not a merge patch) so the gate list is set
    exactly, whichever merge strategy the server would apply. Only the keys it sets are written
    (a map the pod lacks is added whole), so labels or annotations another writer changes after
    the gatekeeper listed the pod are kept.

    :param pod: the gated pod
    :param reservation_id: its reservation
    :param grant: the grant
    """
    spec, meta = pod.get("spec") or {}, (pod.get("metadata") or {})
    where = (
        f"{grant.mig_slice} ({grant.mig_profile})"
        if grant.mig_slice
        else ",".join(map(str, grant.gpu_indices))
    )
    ops = [
        *_set_keys(meta, "/metadata", "labels", {RESERVATION_LABEL: reservation_id}),
        *_set_keys(
            meta,
            "/metadata",
            "annotations",
            {
                f"{ANNOTATION_PREFIX}reservation-id": reservation_id,
                NODE_ANNOTATION: grant.node,
                GPUS_ANNOTATION: where,
            },
        ),
        *_set_keys(spec, "/spec", "nodeSelector", {HOSTNAME_LABEL: grant.node}),
    ]
    tolerations = spec.get("tolerations")
    if not tolerations:
        ops.append({"op": "add", "path": "/spec/tolerations", "value": [GPU_TOLERATION]})
    elif not any(t.get("key") == GPU_RESOURCE for t in tolerations):
        ops.append({"op": "add", "path": "/spec/tolerations/-", "value": GPU_TOLERATION})
    rest = [g for g in spec.get("schedulingGates") or [] if g.get("name") != SCHEDULING_GATE]
    ops.append(
        {"op": "replace", "path": "/spec/schedulingGates", "value": rest}
        if rest
        else {"op": "remove", "path": "/spec/schedulingGates"}
    )
    return ops


def _set_keys(
    parent: Mapping[str, Any], parent_path: str, field_name: str, values: Mapping[str, str]
) -> list[dict[str, Any]]:
    """Return JSON patch ops setting ``values`` in the map ``parent[field_name]``: the keys that differ,
    or the whole map when the pod has none."""
    current = parent.get(field_name)
    path = f"{parent_path}/{field_name}"
    if not current:
        return [{"op": "add", "path": path, "value": dict(values)}]
    return [
        {"op": "add", "path": f"{path}/{_pointer(key)}", "value": value}
        for key, value in values.items()
        if current.get(key) != value
    ]


def _pointer(key: str) -> str:
    """Escape a map key as one JSON pointer segment (RFC 6901): ``gpupool.io/x`` is ``gpupool.io~1x``."""
    return key.replace("~", "~0").replace("/", "~1")


def gatekeeper_event(pod: Mapping[str, Any], kind: str, reason: str, message: str) -> dict[str, Any]:
    """Return the gatekeeper's Event about ``pod``, stamped now (see :func:`pod_event`)."""
    now = time.time()
    return pod_event(
        pod,
        kind=kind,
        reason=reason,
        message=message,
        component=_SOURCE,
        now=now,
        suffix=f"gatekeeper-{int(now * 1e6):x}",
    )
