"""Scalable pools read from Karpenter NodePools: the shape from the annotation or the GFD labels the template pins."""

from __future__ import annotations

import json
from typing import Any

from airflow_gpupool.controller.autoscale.karpenter import SHAPE_ANNOTATION, pools_from_node_pools

A100 = "NVIDIA-A100-SXM4-80GB"


def node_pool(
    name: str,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    requirements: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    template = {"metadata": {"labels": labels or {}}, "spec": {"requirements": requirements or []}}
    return {"metadata": {"name": name, "annotations": annotations or {}}, "spec": {"template": template}}


def test_the_shape_annotation_wins() -> None:
    shape = {"gpu_model": A100, "gpus": 4, "gpu_memory_mib": 81920, "cpu": "48"}
    (pool,) = pools_from_node_pools([node_pool("gpu", {SHAPE_ANNOTATION: json.dumps(shape)}, {"team": "ml"})])
    assert (pool.name, pool.gpu_model, pool.gpus, pool.cpu) == ("gpu", A100, 4, "48")
    assert dict(pool.labels) == {"team": "ml", "karpenter.sh/nodepool": "gpu"}


def test_gfd_labels_pinned_by_labels_or_single_valued_requirements() -> None:
    requirements = [
        {"key": "nvidia.com/gpu.count", "operator": "In", "values": ["8"]},
        {"key": "nvidia.com/gpu.memory", "operator": "In", "values": ["81920"]},
    ]
    (pool,) = pools_from_node_pools(
        [node_pool("gpu", labels={"nvidia.com/gpu.product": A100}, requirements=requirements)]
    )
    assert (pool.gpu_model, pool.gpus, pool.gpu_memory_mib) == (A100, 8, 81920)


def test_node_pools_without_a_gpu_shape_are_skipped() -> None:
    either = [{"key": "nvidia.com/gpu.count", "operator": "In", "values": ["4", "8"]}]
    pools = [
        node_pool("cpu"),
        node_pool(
            "two-counts",
            labels={"nvidia.com/gpu.product": A100, "nvidia.com/gpu.memory": "1"},
            requirements=either,
        ),
        node_pool("bad-json", {SHAPE_ANNOTATION: "{gpus"}),
        node_pool(
            "bad-shape", {SHAPE_ANNOTATION: json.dumps({"gpu_model": A100, "gpus": 0, "gpu_memory_mib": 1})}
        ),
    ]
    assert pools_from_node_pools(pools) == ()
