"""Scalable pools read from Cluster Autoscaler's node groups on Cluster API: its size and scale-from-zero annotations."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_gpupool.controller.autoscale.cluster_api import (
    CAPACITY_PREFIX,
    MAX_SIZE_ANNOTATION,
    MIN_SIZE_ANNOTATION,
    pools_from_node_groups,
)
from airflow_gpupool.controller.autoscale.karpenter import SHAPE_ANNOTATION

A100 = "NVIDIA-A100-SXM4-80GB"
GFD = f"nvidia.com/gpu.product={A100},nvidia.com/gpu.memory=81920"


def group(
    name: str = "gpu", kind: str = "MachineDeployment", owner: str | None = None, **annotations: str
) -> dict[str, Any]:
    """A node group: both size annotations, 4 A100s named by the labels annotation, unless overridden."""
    found = {
        MIN_SIZE_ANNOTATION: "0",
        MAX_SIZE_ANNOTATION: "5",
        f"{CAPACITY_PREFIX}cpu": "48",
        f"{CAPACITY_PREFIX}memory": "512Gi",
        f"{CAPACITY_PREFIX}gpu-type": "nvidia.com/gpu",
        f"{CAPACITY_PREFIX}gpu-count": "4",
        f"{CAPACITY_PREFIX}labels": f"{GFD},node-group=gpu",
    }
    for key, value in annotations.items():
        full = {"min": MIN_SIZE_ANNOTATION, "max": MAX_SIZE_ANNOTATION}.get(
            key, f"{CAPACITY_PREFIX}{key.replace('_', '-')}"
        )
        if value == "":
            found.pop(full, None)
        else:
            found[full] = value
    meta: dict[str, Any] = {"name": name, "namespace": "capi", "annotations": found}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner, "name": "md"}]
    return {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": kind, "metadata": meta}


def test_a_node_group_states_its_node() -> None:
    (pool,) = pools_from_node_groups([group()])
    assert (pool.name, pool.gpu_model, pool.gpus, pool.gpu_memory_mib, pool.cpu, pool.memory) == (
        "gpu",
        A100,
        4,
        81920,
        "48",
        "512Gi",
    )
    # The scale-up's pods select what the template node carries: the labels annotation, no more.
    assert dict(pool.labels) == {
        "nvidia.com/gpu.product": A100,
        "nvidia.com/gpu.memory": "81920",
        "node-group": "gpu",
    }


def test_the_shape_annotation_gives_the_model_and_memory() -> None:
    shape = {"gpu_model": A100, "gpus": 2, "gpu_memory_mib": 40960, "mig": {"1g.10gb": 7}}
    (pool,) = pools_from_node_groups([_with_shape(group(labels="node-group=mig", gpu_count=""), shape)])
    assert (pool.gpus, pool.gpu_memory_mib, pool.mig) == (2, 40960, (("1g.10gb", 7),))
    assert dict(pool.labels) == {"node-group": "mig"}


def _with_shape(obj: dict[str, Any], shape: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["annotations"][SHAPE_ANNOTATION] = json.dumps(shape)
    return obj


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(group(min="", max=""), id="no size annotations: not a node group"),
        pytest.param(group(max=""), id="only one size annotation"),
        pytest.param(group(max="0"), id="max size 0: never scales up"),
        pytest.param(group(max="five"), id="max size not an integer"),
        pytest.param(
            group(kind="MachineSet", owner="MachineDeployment"), id="a MachineSet its deployment scales"
        ),
        pytest.param(group(gpu_type="amd.com/gpu"), id="another device plugin's resource"),
        pytest.param(group(gpu_count=""), id="no GPU count"),
        pytest.param(group(gpu_count="four"), id="a GPU count not an integer"),
        pytest.param(group(labels="node-group=gpu"), id="no GFD model or memory"),
        pytest.param(group(labels="node-group"), id="labels not key=value"),
        pytest.param(group(cpu="lots"), id="a CPU that is no quantity"),
    ],
)
def test_groups_that_are_no_scalable_gpu_pool_are_skipped(obj: dict[str, Any]) -> None:
    assert pools_from_node_groups([obj]) == ()


def test_a_machine_set_of_its_own_is_a_node_group() -> None:
    (pool,) = pools_from_node_groups([group("ms-gpu", kind="MachineSet")])
    assert pool.name == "ms-gpu"
