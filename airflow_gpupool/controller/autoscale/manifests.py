"""The objects a scale-up creates, built from the request they are sized as (pure).

Each carries :data:`~airflow_gpupool.labels.SCALE_UP_LABEL` naming its reservation, so the
controller finds them again on every pass, after a restart too, without keeping state.

* A ``ProvisioningRequest`` (``autoscaling.x-k8s.io/v1``) with one pod set: ``count`` pods of a
  ``PodTemplate`` of the same name. Cluster Autoscaler reads the template's requests, node
  selector and tolerations to choose the node group.
* Or, where ProvisioningRequest is not served, ``count`` placeholder pods of the same shape at a
  negative priority (:func:`placeholder_priority_class`), as cluster-autoscaler's
  overprovisioning does: the autoscaler scales up for them, and any real pod preempts them.

The pods ask for what the request needs of a node: its CPU and memory, and ``nvidia.com/gpu``
(whole GPUs; one for a fraction) or one ``nvidia.com/mig-<profile>`` slice; they select the
pool's labels and the request's node labels, and tolerate the GPU taint.
"""

from __future__ import annotations

import hashlib
from typing import Any

from airflow_gpupool.labels import CAPACITY_TYPE_LABEL, GPU_RESOURCE, MIG_RESOURCE_PREFIX, SCALE_UP_LABEL
from airflow_gpupool.resources import GpuKind, GpuRequest

__all__ = [
    "BEST_EFFORT_ATOMIC",
    "CHECK_CAPACITY",
    "PAUSE_IMAGE",
    "PLACEHOLDER_PRIORITY",
    "object_name",
    "placeholder_pods",
    "placeholder_priority_class",
    "pod_spec",
    "pod_template",
    "provisioning_request",
]

BEST_EFFORT_ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
CHECK_CAPACITY = "check-capacity.autoscaling.x-k8s.io"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
#: Below every real pod, above Cluster Autoscaler's expendable cutoff (-10), which it does not
#: scale up for: the value its overprovisioning example uses.
PLACEHOLDER_PRIORITY = -1
_MANAGED = {"app.kubernetes.io/managed-by": "airflow-gpupool"}


def object_name(key: str) -> str:
    """Return the name of a reservation's scale-up objects: a DNS label whatever the id holds.

    :param key: the reservation id
    """
    return f"gpupool-scale-up-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def labels(key: str) -> dict[str, str]:
    """Return the labels of a reservation's scale-up objects.

    :param key: the reservation id
    """
    return {SCALE_UP_LABEL: key, **_MANAGED}


def resources(request: GpuRequest) -> dict[str, str]:
    """Return what one pod of ``request`` asks of a node (requests and limits alike).

    :param request: the request
    """
    out = {"cpu": f"{request.cpu_milli}m", "memory": f"{request.memory_mib}Mi"}
    if request.kind is GpuKind.MIG:
        out[f"{MIG_RESOURCE_PREFIX}{request.mig_profile}"] = "1"
    elif request.kind in (GpuKind.WHOLE, GpuKind.FRACTION):
        out[GPU_RESOURCE] = str(request.gpus)
    return out


def pod_spec(request: GpuRequest, node_selector: dict[str, str]) -> dict[str, Any]:
    """Return the spec of one pod sized as ``request``.

    :param request: the request
    :param node_selector: the pool's labels
    """
    asked = resources(request)
    # The capacity type is the ledger's own label (stamped at sync), which no real node carries.
    wanted = {k: v for k, v in request.node_labels if k != CAPACITY_TYPE_LABEL}
    return {
        "containers": [
            {"name": "capacity", "image": PAUSE_IMAGE, "resources": {"requests": asked, "limits": asked}}
        ],
        "nodeSelector": {**node_selector, **wanted},
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 0,
    }


def pod_template(key: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Return the ``PodTemplate`` a ProvisioningRequest names.

    :param key: the reservation id
    :param namespace: its namespace (the ProvisioningRequest's)
    :param spec: the pod spec (:func:`pod_spec`)
    """
    meta = {"name": object_name(key), "namespace": namespace, "labels": labels(key)}
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": meta,
        "template": {"metadata": {"labels": labels(key)}, "spec": spec},
    }


def provisioning_request(key: str, namespace: str, count: int, provisioning_class: str) -> dict[str, Any]:
    """Return the ``ProvisioningRequest`` for ``count`` pods of the reservation's template.

    :param key: the reservation id
    :param namespace: its namespace
    :param count: pods (a gang's members)
    :param provisioning_class: ``best-effort-atomic-scale-up...`` or ``check-capacity...``
    """
    return {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {"name": object_name(key), "namespace": namespace, "labels": labels(key)},
        "spec": {
            "provisioningClassName": provisioning_class,
            "podSets": [{"count": count, "podTemplateRef": {"name": object_name(key)}}],
        },
    }


def placeholder_pods(
    key: str, namespace: str, count: int, spec: dict[str, Any], priority_class: str
) -> list[dict[str, Any]]:
    """Return ``count`` placeholder pods of the reservation's shape.

    :param key: the reservation id
    :param namespace: their namespace
    :param count: how many (a gang's members)
    :param spec: the pod spec (:func:`pod_spec`)
    :param priority_class: the negative PriorityClass they run at
    """
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{object_name(key)}-{index}",
                "namespace": namespace,
                "labels": labels(key),
            },
            "spec": {**spec, "priorityClassName": priority_class},
        }
        for index in range(count)
    ]


def placeholder_priority_class(name: str) -> dict[str, Any]:
    """Return the PriorityClass of placeholder pods (never preempting, below every real pod).

    :param name: its name
    """
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "labels": dict(_MANAGED)},
        "value": PLACEHOLDER_PRIORITY,
        "globalDefault": False,
        "preemptionPolicy": "Never",
        "description": "airflow-gpupool placeholder pods: capacity asked for waiting GPU requests",
    }
