"""Scalable pools discovered from Cluster Autoscaler's node groups on Cluster API (``cluster.x-k8s.io``).

On its ``clusterapi`` provider, Cluster Autoscaler treats a ``MachineDeployment`` or ``MachineSet``
(one that no MachineDeployment owns) as a node group when it carries both size annotations,
``cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size`` and ``...-max-size``. To scale a
group from zero it builds the node it would add from the scale-from-zero annotations its
documentation lists: ``capacity.cluster-autoscaler.kubernetes.io/cpu``, ``/memory``,
``/gpu-type`` (the device plugin's resource, ``nvidia.com/gpu``), ``/gpu-count`` and ``/labels``
(``key=value,key=value``, the labels the node will carry). The same annotations say here what
one empty node of the group is:

* GPUs: ``gpu-count`` of ``gpu-type`` ``nvidia.com/gpu`` (another type is not a GPU pool here);
* the GPU model and memory: the GPU Feature Discovery labels the ``labels`` annotation lists
  (``nvidia.com/gpu.product``, ``nvidia.com/gpu.memory``), or the whole shape from the
  ``gpupool.io/node-shape`` annotation, as on a Karpenter NodePool;
* CPU and memory: the ``cpu`` and ``memory`` annotations.

A group whose max size is 0, or that states no GPU shape, is skipped (logged once per name). The
scale-up's pods select the ``labels`` annotation's labels: the labels Cluster Autoscaler's
template node has, so its simulation places them there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_gpupool.controller.autoscale.karpenter import SHAPE_ANNOTATION, node_shape
from airflow_gpupool.controller.autoscale.pools import ScalablePool, parse_scalable_pools
from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.labels import COUNT_LABEL, GPU_RESOURCE

__all__ = [
    "CAPACITY_PREFIX",
    "GROUP",
    "MAX_SIZE_ANNOTATION",
    "MIN_SIZE_ANNOTATION",
    "list_node_groups",
    "pools_from_node_groups",
]

log = logging.getLogger(__name__)

GROUP, VERSION = "cluster.x-k8s.io", "v1beta1"
MACHINE_DEPLOYMENTS, MACHINE_SETS = "machinedeployments", "machinesets"
MIN_SIZE_ANNOTATION = f"{GROUP}/cluster-api-autoscaler-node-group-min-size"
MAX_SIZE_ANNOTATION = f"{GROUP}/cluster-api-autoscaler-node-group-max-size"
CAPACITY_PREFIX = "capacity.cluster-autoscaler.kubernetes.io/"
_SKIPPED: set[str] = set()


def list_node_groups(custom_objects_api: Any) -> list[dict[str, Any]]:
    """Return the cluster's MachineDeployments and MachineSets, every namespace.

    :param custom_objects_api: a ``kubernetes.client.CustomObjectsApi``
    """
    deployments = custom_objects_api.list_cluster_custom_object(GROUP, VERSION, MACHINE_DEPLOYMENTS)
    sets = custom_objects_api.list_cluster_custom_object(GROUP, VERSION, MACHINE_SETS)
    return [*deployments.get("items", []), *sets.get("items", [])]


def pools_from_node_groups(objects: Iterable[Mapping[str, Any]]) -> tuple[ScalablePool, ...]:
    """Return the scalable pools the node groups among ``objects`` declare.

    :param objects: MachineDeployments and MachineSets (the API's JSON)
    """
    out: list[ScalablePool] = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name"))
        if not _is_node_group(obj):
            continue
        annotations = meta.get("annotations") or {}
        why, entry = _entry(annotations)
        if entry is None:
            _skip(name, why)
            continue
        try:
            out += parse_scalable_pools(json.dumps({name: entry}))
        except ConfigurationError as e:
            _skip(name, str(e))
    return tuple(out)


def _is_node_group(obj: Mapping[str, Any]) -> bool:
    """Whether Cluster Autoscaler scales ``obj``: both size annotations, a max above 0, no owning MachineDeployment."""
    meta = obj.get("metadata") or {}
    owners = meta.get("ownerReferences") or []
    if obj.get("kind") == "MachineSet" and any(o.get("kind") == "MachineDeployment" for o in owners):
        return False  # its MachineDeployment is the node group
    annotations = meta.get("annotations") or {}
    if MIN_SIZE_ANNOTATION not in annotations or MAX_SIZE_ANNOTATION not in annotations:
        return False
    try:
        return int(annotations[MAX_SIZE_ANNOTATION]) > 0
    except ValueError:
        _skip(
            str(meta.get("name")),
            f"{MAX_SIZE_ANNOTATION}: {annotations[MAX_SIZE_ANNOTATION]!r} is not an integer",
        )
        return False


def _entry(annotations: Mapping[str, str]) -> tuple[str, dict[str, Any] | None]:
    """Return a ``[gpupool] scalable_node_pools`` entry read from the annotations, or why there is none."""
    labels = _labels(annotations.get(f"{CAPACITY_PREFIX}labels", ""))
    if labels is None:
        return f"{CAPACITY_PREFIX}labels is not key=value,key=value", None
    gpu_type = annotations.get(f"{CAPACITY_PREFIX}gpu-type", GPU_RESOURCE)
    count = annotations.get(f"{CAPACITY_PREFIX}gpu-count")
    pinned = dict(labels)  # what GFD will label the node; the count is the annotation's
    if SHAPE_ANNOTATION not in annotations:
        if gpu_type != GPU_RESOURCE or count is None:
            return f"no {GPU_RESOURCE} in {CAPACITY_PREFIX}gpu-type and gpu-count", None
        pinned[COUNT_LABEL] = count
    shape = node_shape(annotations, pinned)
    if shape is None:
        return (
            f"no GPU model and memory ({SHAPE_ANNOTATION}, or the GFD labels in {CAPACITY_PREFIX}labels)",
            None,
        )
    for key in ("cpu", "memory"):
        if f"{CAPACITY_PREFIX}{key}" in annotations:
            shape.setdefault(key, annotations[f"{CAPACITY_PREFIX}{key}"])
    return "", {**shape, "labels": {**shape.get("labels", {}), **labels}}


def _labels(text: str) -> dict[str, str] | None:
    """Parse ``key=value,key=value`` (Cluster Autoscaler's labels annotation); None when malformed."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key:
            return None
        out[key.strip()] = value.strip()
    return out


def _skip(name: str, why: str) -> None:
    if name not in _SKIPPED:
        _SKIPPED.add(name)
        log.info("Cluster API node group %s is not a scalable GPU pool here: %s", name, why)
