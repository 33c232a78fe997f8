"""ProvisioningRequests as the API server checks them and as Cluster Autoscaler reports on them (pure).

A ``ProvisioningRequest`` (``autoscaling.x-k8s.io/v1``, Cluster Autoscaler's CRD) asks for
capacity for ``count`` pods of each of its ``podSets``, each pod shaped by a ``PodTemplate`` of the
same namespace named in ``podTemplateRef``. The CRD's schema refuses a request without a
``provisioningClassName``, without pod sets, with a count below 1 or a template without a name,
and its ``spec`` is immutable: :func:`check_create` and :func:`check_update` answer 422 as the API
server does. Progress is reported in ``status.conditions`` (``metav1.Condition``):
``Accepted``, then ``Provisioned`` (``True`` once the capacity exists) or ``Failed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_gpupool.testing.api.gates import KubernetesInvalid
from airflow_gpupool.testing.api.storage import now_iso

__all__ = [
    "ACCEPTED",
    "BEST_EFFORT_ATOMIC",
    "CHECK_CAPACITY",
    "FAILED",
    "PROVISIONED",
    "check_create",
    "check_update",
    "has_condition",
    "set_condition",
]

BEST_EFFORT_ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
CHECK_CAPACITY = "check-capacity.autoscaling.x-k8s.io"
ACCEPTED, PROVISIONED, FAILED = "Accepted", "Provisioned", "Failed"
_MAX_POD_SETS = 32


def check_create(obj: Mapping[str, Any]) -> None:
    """Refuse a ProvisioningRequest the CRD's schema refuses.

    :param obj: the request as sent
    :raises KubernetesInvalid: a 422 naming the field
    """
    name = str((obj.get("metadata") or {}).get("name") or (obj.get("metadata") or {}).get("generateName"))
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise KubernetesInvalid("ProvisioningRequest", name, "spec: Required value")
    if not isinstance(spec.get("provisioningClassName"), str) or not spec["provisioningClassName"]:
        raise KubernetesInvalid("ProvisioningRequest", name, "spec.provisioningClassName: Required value")
    pod_sets = spec.get("podSets")
    if not isinstance(pod_sets, list) or not 1 <= len(pod_sets) <= _MAX_POD_SETS:
        raise KubernetesInvalid(
            "ProvisioningRequest", name, f"spec.podSets: Invalid value: must have 1 to {_MAX_POD_SETS} items"
        )
    for index, pod_set in enumerate(pod_sets):
        where = f"spec.podSets[{index}]"
        count = pod_set.get("count") if isinstance(pod_set, Mapping) else None
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise KubernetesInvalid(
                "ProvisioningRequest", name, f"{where}.count: Invalid value: {count!r}: should be at least 1"
            )
        ref = pod_set.get("podTemplateRef") if isinstance(pod_set, Mapping) else None
        if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str) or not ref["name"]:
            raise KubernetesInvalid(
                "ProvisioningRequest", name, f"{where}.podTemplateRef.name: Required value"
            )


def check_update(current: Mapping[str, Any], updated: Mapping[str, Any]) -> None:
    """Refuse a change of a ProvisioningRequest's ``spec`` (immutable, as the CRD's rule says).

    :param current: the stored request
    :param updated: the request after the change
    :raises KubernetesInvalid: the spec changed
    """
    if current.get("spec") != updated.get("spec"):
        name = str((current.get("metadata") or {}).get("name"))
        raise KubernetesInvalid("ProvisioningRequest", name, "spec: Invalid value: Value is immutable")


def has_condition(obj: Mapping[str, Any], kind: str) -> bool:
    """Return whether a request's condition ``kind`` is ``True``.

    :param obj: the request
    :param kind: ``Accepted``, ``Provisioned`` or ``Failed``
    """
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def set_condition(obj: dict[str, Any], kind: str, status: bool, reason: str, message: str) -> None:
    """Set one condition in place, its transition time changed only when its status changes.

    :param obj: the request, changed in place
    :param kind: the condition type
    :param status: its truth
    :param reason: a CamelCase reason
    :param message: a human message
    """
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    value = "True" if status else "False"
    old = next((c for c in conditions if c.get("type") == kind), None)
    new = {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "observedGeneration": (obj.get("metadata") or {}).get("generation", 1),
        "lastTransitionTime": old["lastTransitionTime"]
        if old is not None and old.get("status") == value
        else now_iso(),
    }
    obj["status"]["conditions"] = [c for c in conditions if c.get("type") != kind] + [new]
