"""Scalable pools discovered from Karpenter ``NodePool`` objects (``karpenter.sh/v1``).

Karpenter labels every node it makes ``karpenter.sh/nodepool: <name>`` and scales up for pending
pods, so a NodePool is a scalable pool whose scale-ups are placeholder pods selecting that label.
A NodePool says which instances it may launch, not one node's GPU shape, so the shape is read:

1. from the annotation ``gpupool.io/node-shape``: the JSON of one ``[gpupool] scalable_node_pools``
   entry (``{"gpu_model": ..., "gpus": 8, "gpu_memory_mib": 81920, "cpu": "96", ...}``); else
2. from the GPU Feature Discovery labels its template pins, as ``spec.template.metadata.labels``
   or single-valued ``In`` requirements: ``nvidia.com/gpu.product``, ``nvidia.com/gpu.count`` and
   ``nvidia.com/gpu.memory``.

A NodePool that says neither is not a GPU pool here and is skipped (logged once per name). The
template's labels, with ``karpenter.sh/nodepool``, are what the scale-up's pods select.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_gpupool.controller.autoscale.pools import ScalablePool, parse_scalable_pools
from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.labels import COUNT_LABEL, MEMORY_LABEL, PRODUCT_LABEL

__all__ = ["NODE_POOL_LABEL", "SHAPE_ANNOTATION", "list_node_pools", "node_shape", "pools_from_node_pools"]

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "karpenter.sh", "v1", "nodepools"
NODE_POOL_LABEL = "karpenter.sh/nodepool"
SHAPE_ANNOTATION = "gpupool.io/node-shape"
_SKIPPED: set[str] = set()


def list_node_pools(custom_objects_api: Any) -> list[dict[str, Any]]:
    """Return the cluster's Karpenter NodePools.

    :param custom_objects_api: a ``kubernetes.client.CustomObjectsApi``
    """
    listed = custom_objects_api.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    return list(listed.get("items", []))


def pools_from_node_pools(node_pools: Iterable[Mapping[str, Any]]) -> tuple[ScalablePool, ...]:
    """Return the scalable pools some NodePools declare, skipping those without a GPU shape.

    :param node_pools: NodePool objects (the API's JSON)
    """
    out: list[ScalablePool] = []
    for node_pool in node_pools:
        meta = node_pool.get("metadata") or {}
        name = str(meta.get("name"))
        template = ((node_pool.get("spec") or {}).get("template")) or {}
        labels = {**((template.get("metadata") or {}).get("labels") or {}), NODE_POOL_LABEL: name}
        shape = node_shape(
            meta.get("annotations") or {}, labels, (template.get("spec") or {}).get("requirements") or []
        )
        if shape is None:
            if name not in _SKIPPED:
                _SKIPPED.add(name)
                log.info(
                    "Karpenter NodePool %s states no GPU shape (%s or GFD labels): not scalable here",
                    name,
                    SHAPE_ANNOTATION,
                )
            continue
        entry = {**shape, "labels": {**shape.get("labels", {}), **labels}}
        try:
            out += parse_scalable_pools(json.dumps({name: entry}))
        except ConfigurationError as e:
            log.warning("Karpenter NodePool %s skipped: %s", name, e)
    return tuple(out)


def node_shape(
    annotations: Mapping[str, str],
    labels: Mapping[str, str],
    requirements: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any] | None:
    """Return a pool entry read from the annotation or from the GFD labels the template pins; None: neither.

    :param annotations: the object's annotations (:data:`SHAPE_ANNOTATION`)
    :param labels: the labels its nodes carry
    :param requirements: Karpenter's node requirements (a single-valued ``In`` pins a label)
    """
    if SHAPE_ANNOTATION in annotations:
        try:
            shape = json.loads(annotations[SHAPE_ANNOTATION])
        except json.JSONDecodeError:
            return None
        return dict(shape) if isinstance(shape, dict) else None
    pinned = dict(labels)
    for requirement in requirements:
        values = requirement.get("values") or []
        if requirement.get("operator") == "In" and len(values) == 1:
            pinned.setdefault(str(requirement.get("key")), str(values[0]))
    if not all(k in pinned for k in (PRODUCT_LABEL, COUNT_LABEL, MEMORY_LABEL)):
        return None
    try:
        return {
            "gpu_model": pinned[PRODUCT_LABEL],
            "gpus": int(pinned[COUNT_LABEL]),
            "gpu_memory_mib": int(pinned[MEMORY_LABEL]),
        }
    except ValueError:
        return None
