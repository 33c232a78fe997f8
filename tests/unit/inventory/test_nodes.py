"""node_from_kubernetes: core/v1 Node objects (as the device plugin and GFD label them) to inventory."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_gpupool.exceptions import InvalidInventoryError
from airflow_gpupool.inventory import node_from_kubernetes
from airflow_gpupool.resources import NodeHealth, NodeInventory

A100 = "NVIDIA-A100-SXM4-80GB"


def k8s_node(
    name: str = "n1",
    *,
    gpus: int | str | None = None,
    mig: dict[str, Any] | None = None,
    labels: dict[str, Any] | None = None,
    taints: list[dict[str, Any]] | None = None,
    unschedulable: bool = False,
    ready: str | None = "True",
    cpu: Any = "64",
    memory: Any = "512Gi",
) -> dict[str, Any]:
    """Build a Node dict: ``k8s_node("n1", gpus=8, labels={...}, mig={"1g.10gb": 7})``."""
    allocatable: dict[str, Any] = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = str(gpus)
    allocatable.update({f"nvidia.com/mig-{p}": str(n) for p, n in (mig or {}).items()})
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": spec,
        "status": {"allocatable": allocatable, "conditions": conditions},
    }


def gfd(
    product: str = A100,
    memory: int | None = 81920,
    count: int | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    labels = {"nvidia.com/gpu.product": product, **(extra or {})}
    if memory is not None:
        labels["nvidia.com/gpu.memory"] = str(memory)
    if count is not None:
        labels["nvidia.com/gpu.count"] = str(count)
    return labels


def layout(node: NodeInventory) -> list[tuple[str, ...]]:
    """Each GPU as its MIG profiles; a whole GPU is ``()``."""
    return [tuple(s.profile for s in g.mig_slices) for g in node.gpus]


def convert(obj: Any, **options: Any) -> NodeInventory:
    node = node_from_kubernetes(obj, **options)
    assert node is not None
    return node


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(k8s_node(gpus=8, labels=gfd(count=8)), [()] * 8, id="whole-gpus"),
        pytest.param(
            k8s_node(
                gpus=0, mig={"1g.10gb": 7}, labels=gfd(count=1, extra={"nvidia.com/mig.strategy": "mixed"})
            ),
            [("1g.10gb",) * 7],
            id="mig-only",
        ),
        pytest.param(
            k8s_node(gpus=7, mig={"3g.40gb": 2}, labels=gfd(count=8)),
            [()] * 7 + [("3g.40gb", "3g.40gb")],
            id="mixed-node",
        ),
        pytest.param(
            # The emulator (and some device plugins) count the partitioned GPU in nvidia.com/gpu too.
            k8s_node(gpus=8, mig={"1g.10gb": 7}, labels=gfd(count=8)),
            [()] * 7 + [("1g.10gb",) * 7],
            id="count-label-caps-whole",
        ),
        pytest.param(
            k8s_node(gpus=2, mig={"1g.5gb": 8}, labels=gfd(count=None)),
            [(), (), ("1g.5gb",) * 7, ("1g.5gb",)],
            id="no-count-label-packs",
        ),
        pytest.param(
            k8s_node(mig={"1g.10gb": 1, "3g.40gb": 2, "2g.20gb": 2}, labels=gfd(count=2)),
            [("3g.40gb", "3g.40gb", "1g.10gb"), ("2g.20gb", "2g.20gb")],
            id="biggest-first",
        ),
        pytest.param(k8s_node(gpus=7, labels=gfd(count=8)), [()] * 7, id="unhealthy-gpu-withdrawn"),
        pytest.param(
            k8s_node(gpus=3, mig={"1g.12gb": 7}, labels=gfd(count=4)), [()] * 3, id="unknown-profile-ignored"
        ),
    ],
)
def test_gpu_layout(obj: dict[str, Any], expected: list[tuple[str, ...]]) -> None:
    node = convert(obj)
    assert layout(node) == expected
    assert [g.uuid for g in node.gpus] == [f"n1-gpu{i}" for i in range(len(expected))]
    assert {g.model for g in node.gpus} == {A100}


def test_mig_slice_ids_are_stable_per_profile() -> None:
    node = convert(k8s_node(gpus=0, mig={"3g.40gb": 2, "1g.10gb": 2}, labels=gfd(count=2)))
    assert [[s.slice_id for s in g.mig_slices] for g in node.gpus] == [
        ["mig-3g.40gb-0", "mig-3g.40gb-1", "mig-1g.10gb-0"],
        ["mig-1g.10gb-1"],
    ]


def test_single_strategy_reads_mig_devices_as_slices() -> None:
    labels = gfd(
        product="NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        memory=4864,
        count=7,
        extra={"nvidia.com/mig.strategy": "single"},
    )
    node = convert(k8s_node(gpus=7, labels=labels))
    assert layout(node) == [("1g.5gb",) * 7]
    assert (node.gpus[0].model, node.gpus[0].memory_mib) == ("NVIDIA-A100-SXM4-40GB", 40960)


@pytest.mark.parametrize(
    ("labels", "mig", "memory_mib"),
    [
        pytest.param(gfd(memory=81559), None, 81559, id="gfd-label"),
        pytest.param(gfd(product="NVIDIA-H100-80GB-HBM3", memory=None), None, 81920, id="from-product"),
        pytest.param(gfd(product="Tesla-T4", memory=None), None, 16384, id="default"),
        pytest.param(gfd(product="Tesla-T4", memory=None), {"1g.18gb": 7}, 141 * 1024, id="from-mig-family"),
        pytest.param({}, None, 16384, id="no-gfd"),
    ],
)
def test_gpu_memory(labels: dict[str, str], mig: dict[str, int] | None, memory_mib: int) -> None:
    node = convert(k8s_node(gpus=1 if mig is None else 0, mig=mig, labels=labels))
    assert {g.memory_mib for g in node.gpus} == {memory_mib}


def test_no_product_label_is_unknown_model() -> None:
    assert convert(k8s_node(gpus=1)).gpus[0].model == "unknown"


@pytest.mark.parametrize(
    ("obj", "health"),
    [
        pytest.param(k8s_node(gpus=1), NodeHealth.HEALTHY, id="ready"),
        pytest.param(k8s_node(gpus=1, ready=None), NodeHealth.HEALTHY, id="no-conditions"),
        pytest.param(k8s_node(gpus=1, unschedulable=True), NodeHealth.CORDONED, id="cordoned"),
        pytest.param(
            k8s_node(gpus=1, taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
            NodeHealth.HEALTHY,
            id="gpu-taint-tolerated",
        ),
        pytest.param(
            k8s_node(gpus=1, taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]),
            NodeHealth.CORDONED,
            id="other-noschedule-taint",
        ),
        pytest.param(
            k8s_node(gpus=1, taints=[{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoExecute"}]),
            NodeHealth.CORDONED,
            id="noexecute-taint",
        ),
        pytest.param(
            k8s_node(gpus=1, taints=[{"key": "dedicated", "effect": "PreferNoSchedule"}]),
            NodeHealth.HEALTHY,
            id="soft-taint",
        ),
        pytest.param(k8s_node(gpus=1, ready="False"), NodeHealth.QUARANTINED, id="not-ready"),
        pytest.param(k8s_node(gpus=1, ready="Unknown"), NodeHealth.QUARANTINED, id="ready-unknown"),
        pytest.param(
            k8s_node(gpus=1, taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]),
            NodeHealth.QUARANTINED,
            id="unreachable-taint",
        ),
        pytest.param(
            k8s_node(gpus=1, ready="False", unschedulable=True), NodeHealth.QUARANTINED, id="not-ready-wins"
        ),
    ],
)
def test_health(obj: dict[str, Any], health: NodeHealth) -> None:
    assert convert(obj).health is health


def test_tolerated_taints_option() -> None:
    obj = k8s_node(gpus=1, taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}])
    tolerated = {"nvidia.com/gpu", "dedicated"}
    assert convert(obj, tolerated_taints=tolerated).health is NodeHealth.HEALTHY


@pytest.mark.parametrize(
    ("labels", "pool"),
    [
        pytest.param({"gpupool.io/pool": "a100"}, "a100", id="gpupool"),
        pytest.param({"cloud.google.com/gke-nodepool": "gpu-pool"}, "gpu-pool", id="gke"),
        pytest.param({"eks.amazonaws.com/nodegroup": "ng-1"}, "ng-1", id="eks"),
        pytest.param({"kubernetes.azure.com/agentpool": "gpunp"}, "gpunp", id="aks"),
        pytest.param({"karpenter.sh/nodepool": "gpu"}, "gpu", id="karpenter"),
        pytest.param(
            {"gpupool.io/pool": "ours", "cloud.google.com/gke-nodepool": "gke"}, "ours", id="ours-first"
        ),
        pytest.param({"gpupool.io/pool": "", "karpenter.sh/nodepool": "gpu"}, "gpu", id="empty-skipped"),
        pytest.param({}, "default", id="default"),
    ],
)
def test_node_pool(labels: dict[str, str], pool: str) -> None:
    assert convert(k8s_node(gpus=1, labels=labels)).node_pool == pool


def test_labels_copied_but_gfd_timestamp() -> None:
    labels = gfd(extra={"nvidia.com/gfd.timestamp": "1735000000", "topology.kubernetes.io/zone": "z1"})
    node = convert(k8s_node(gpus=1, labels=labels))
    expected = {"kubernetes.io/hostname": "n1", **labels}
    del expected["nvidia.com/gfd.timestamp"]
    assert dict(node.labels) == expected


@pytest.mark.parametrize(
    ("cpu", "memory", "cpu_milli", "memory_mib"),
    [
        pytest.param("64", "512Gi", 64000, 524288, id="cores-gi"),
        pytest.param("63500m", "263784356Ki", 63500, 257601, id="milli-ki"),
        pytest.param("0.5", "1G", 500, 953, id="fraction-decimal"),
        pytest.param(8, 1073741824, 8000, 1024, id="numbers"),
    ],
)
def test_cpu_and_memory(cpu: Any, memory: Any, cpu_milli: int, memory_mib: int) -> None:
    node = convert(k8s_node(gpus=1, cpu=cpu, memory=memory))
    assert (node.cpu_milli, node.memory_mib) == (cpu_milli, memory_mib)


def test_cpu_nodes_skipped_unless_kept() -> None:
    obj = k8s_node(gpus=None)
    assert node_from_kubernetes(obj) is None
    assert node_from_kubernetes(k8s_node(gpus=0)) is None
    kept = convert(obj, keep_cpu_nodes=True)
    assert (kept.gpus, kept.cpu_milli) == ((), 64000)


def test_v1node_object() -> None:
    from kubernetes.client import ApiClient

    obj = k8s_node(gpus=2, labels=gfd(count=2, extra={"gpupool.io/pool": "a100"}), unschedulable=True)
    v1 = ApiClient()._ApiClient__deserialize(obj, "V1Node")
    assert convert(v1) == convert(obj)


def _without(obj: dict[str, Any], *path: str) -> dict[str, Any]:
    target = obj
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return obj


def _with(obj: dict[str, Any], value: Any, *path: str) -> dict[str, Any]:
    target = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return obj


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        pytest.param("gpu-a", "node", id="not-a-node"),
        pytest.param(_without(k8s_node(gpus=1), "metadata", "name"), "node metadata.name", id="no-name"),
        pytest.param(_with(k8s_node(gpus=1), ["x"], "metadata"), "node metadata", id="metadata-list"),
        pytest.param(
            _with(k8s_node(gpus=1), "a=b", "metadata", "labels"), "node n1 metadata.labels", id="labels-str"
        ),
        pytest.param(
            k8s_node(gpus=1, labels={"zone": 3}), "node n1 metadata.labels['zone']", id="label-value-not-str"
        ),
        pytest.param(
            k8s_node(gpus=1, labels={"bad key!": "x"}), "node n1 labels['bad key!']", id="label-key"
        ),
        pytest.param(_with(k8s_node(gpus=1), "Ready", "status"), "node n1 status", id="status-str"),
        pytest.param(
            _with(k8s_node(gpus=1), ["8"], "status", "allocatable"),
            "node n1 status.allocatable",
            id="allocatable-list",
        ),
        pytest.param(k8s_node(gpus="eight"), "node n1 status.allocatable['nvidia.com/gpu']", id="gpu-count"),
        pytest.param(k8s_node(gpus="-1"), "node n1 status.allocatable['nvidia.com/gpu']", id="gpu-negative"),
        pytest.param(
            k8s_node(mig={"1g.10gb": "7.5"}),
            "node n1 status.allocatable['nvidia.com/mig-1g.10gb']",
            id="mig-count",
        ),
        pytest.param(k8s_node(gpus=1, cpu="lots"), "node n1 status.allocatable.cpu", id="cpu"),
        pytest.param(k8s_node(gpus=1, memory="12 parsecs"), "node n1 status.allocatable.memory", id="memory"),
        pytest.param(
            k8s_node(gpus=1, labels=gfd(memory=None, extra={"nvidia.com/gpu.memory": "big"})),
            "node n1 metadata.labels['nvidia.com/gpu.memory']",
            id="gfd-memory",
        ),
        pytest.param(
            k8s_node(gpus=1, labels={"nvidia.com/gpu.count": "x"}),
            "node n1 metadata.labels['nvidia.com/gpu.count']",
            id="gfd-count",
        ),
        pytest.param(
            k8s_node(gpus=1, labels={"nvidia.com/gpu.product": "A100 (SXM4)"}),
            "node n1 gpu model",
            id="product",
        ),
        pytest.param(
            _with(k8s_node(gpus=1), {"key": "x"}, "spec", "taints"), "node n1 spec.taints", id="taints"
        ),
        pytest.param(
            _with(k8s_node(gpus=1), "Ready", "status", "conditions"),
            "node n1 status.conditions",
            id="conditions",
        ),
        pytest.param(k8s_node(gpus=1, cpu="20000000"), "node n1 cpu_milli", id="cpu-out-of-range"),
    ],
)
def test_malformed_nodes_name_node_and_field(obj: Any, field: str) -> None:
    with pytest.raises(InvalidInventoryError) as caught:
        node_from_kubernetes(obj)
    assert caught.value.field == field
