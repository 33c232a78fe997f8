"""The resource model: requests, nodes, GPUs and MIG slices validate themselves."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from airflow_gpupool.exceptions import InvalidInventoryError, InvalidRequestError
from airflow_gpupool.resources import (
    GpuDevice,
    GpuKind,
    GpuRequest,
    MigSlice,
    NodeHealth,
    NodeInventory,
    WorkloadClass,
)


def a100(index: int = 0, uuid: str | None = None, mig: tuple[str, ...] = ()) -> GpuDevice:
    slices = tuple(MigSlice(f"g{index}-m{k}", p) for k, p in enumerate(mig))
    return GpuDevice(index, uuid or f"GPU-{index}", "A100-SXM4-80GB", 81920, slices)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"gpus": "2"}, "gpus", id="gpus-str"),
        pytest.param({"gpus": True}, "gpus", id="gpus-bool"),
        pytest.param({"gpus": -1}, "gpus", id="gpus-negative"),
        pytest.param({"gpus": 65}, "gpus", id="gpus-huge"),
        pytest.param({"gpus": 1.0}, "gpus", id="gpus-float"),
        pytest.param({"cpu_milli": True}, "cpu_milli", id="cpu-bool"),
        pytest.param({"cpu_milli": 10_000_001}, "cpu_milli", id="cpu-huge"),
        pytest.param({"memory_mib": -1}, "memory_mib", id="memory-negative"),
        pytest.param({"priority": 1_000_001}, "priority", id="priority-huge"),
        pytest.param({"priority": -1_000_001}, "priority", id="priority-very-negative"),
        pytest.param({"gpu_milli": 0}, "gpu_milli", id="gpu-milli-zero"),
        pytest.param({"gpu_milli": 1000}, "gpu_milli", id="gpu-milli-whole-gpu"),
        pytest.param({"gpu_milli": "500"}, "gpu_milli", id="gpu-milli-str"),
        pytest.param({"gpu_milli": 500, "gpus": 2}, "gpus", id="fraction-with-two-gpus"),
        pytest.param({"gpu_milli": 500, "mig_profile": "1g.10gb"}, "mig_profile", id="fraction-and-mig"),
        pytest.param({"mig_profile": "9g.99gb"}, "mig_profile", id="unknown-mig-profile"),
        pytest.param({"mig_profile": "1g.10gb", "gpus": 2}, "gpus", id="mig-with-two-gpus"),
        pytest.param(
            {"mig_profile": "1g.10gb", "gpu_memory_mib": 1024}, "gpu_memory_mib", id="mig-and-gpu-memory"
        ),
        pytest.param({"gpu_memory_mib": 1024}, "gpu_memory_mib", id="gpu-memory-without-gpu"),
        pytest.param({"gpus": 1, "gpu_memory_mib": 0}, "gpu_memory_mib", id="gpu-memory-zero"),
        pytest.param({"gpus": 1, "gpu_memory_mib": 2 * 1024 * 1024}, "gpu_memory_mib", id="gpu-memory-huge"),
        pytest.param({"workload_class": "serving"}, "workload_class", id="unknown-workload-class"),
        pytest.param({"node_labels": {"Bad Key": "a"}}, "node_labels['Bad Key']", id="label-key-with-space"),
        pytest.param({"node_labels": {"-zone": "a"}}, "node_labels['-zone']", id="label-key-leading-dash"),
        pytest.param({"node_labels": {"zone": "a b"}}, "node_labels['zone']", id="label-value-with-space"),
        pytest.param({"node_labels": {"zone": "x" * 64}}, "node_labels['zone']", id="label-value-too-long"),
        pytest.param({"node_labels": 5}, "node_labels", id="labels-not-a-mapping"),
        pytest.param({"gpu_models": ["bad model!"]}, "gpu_models", id="bad-model-name"),
        pytest.param({"gpu_models": 3}, "gpu_models", id="models-not-a-list"),
        pytest.param({"team": ""}, "team", id="empty-team"),
        pytest.param({"preemptible": "yes"}, "preemptible", id="preemptible-str"),
        pytest.param({"checkpoint_on_sigterm": 1}, "checkpoint_on_sigterm", id="checkpoint-on-sigterm-int"),
    ],
)
def test_bad_request_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        GpuRequest(**kwargs)
    assert type(info.value) is InvalidRequestError
    assert info.value.field == field


def test_bad_workload_class_lists_the_allowed_values() -> None:
    with pytest.raises(InvalidRequestError) as info:
        GpuRequest(workload_class="serving")
    assert info.value.value == "serving"
    assert info.value.expected == "one of ['training', 'inference', 'batch']"
    assert (
        str(info.value)
        == "invalid workload_class='serving': expected one of ['training', 'inference', 'batch']"
    )


def test_unknown_mig_profile_lists_the_known_ones() -> None:
    with pytest.raises(InvalidRequestError) as info:
        GpuRequest(mig_profile="9g.99gb")
    assert "'1g.10gb'" in info.value.expected and "'7g.141gb'" in info.value.expected


def test_from_dict_rejects_unknown_keys() -> None:
    data = GpuRequest(gpus=1).to_dict() | {"gpu_count": 2}
    with pytest.raises(InvalidRequestError) as info:
        GpuRequest.from_dict(data)
    assert info.value.field == "request"
    assert info.value.value == ["gpu_count"]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        pytest.param(lambda: NodeInventory("bad name!", 1000, 1024), "node name", id="bad-node-name"),
        pytest.param(lambda: NodeInventory("", 1000, 1024), "node name", id="empty-node-name"),
        pytest.param(lambda: NodeInventory("n1", -1, 1024), "node n1 cpu_milli", id="negative-cpu"),
        pytest.param(lambda: NodeInventory("n1", True, 1024), "node n1 cpu_milli", id="bool-cpu"),
        pytest.param(lambda: NodeInventory("n1", 1000, "1Gi"), "node n1 memory_mib", id="str-memory"),
        pytest.param(lambda: NodeInventory("n1", 1000, 1024, health="broken"), "health", id="unknown-health"),
        pytest.param(
            lambda: NodeInventory("n1", 1000, 1024, node_pool="a pool"), "node_pool", id="bad-node-pool"
        ),
        pytest.param(
            lambda: NodeInventory("n1", 1000, 1024, labels={"a b": "x"}), "labels['a b']", id="bad-label-key"
        ),
        pytest.param(
            lambda: NodeInventory("n1", 1000, 1024, (a100(0, "GPU-a"), a100(0, "GPU-b"))),
            "node n1 gpu indices",
            id="duplicate-gpu-indices",
        ),
        pytest.param(
            lambda: NodeInventory("n1", 1000, 1024, (a100(0, "GPU-a"), a100(1, "GPU-a"))),
            "node n1 gpu uuids",
            id="duplicate-gpu-uuids",
        ),
        pytest.param(lambda: GpuDevice(0, "GPU-0", "A100", 0), "gpu memory_mib", id="gpu-memory-zero"),
        pytest.param(lambda: GpuDevice(0, "GPU 0", "A100", 1024), "gpu uuid", id="gpu-uuid-with-space"),
        pytest.param(lambda: GpuDevice(0, "GPU-0", "", 1024), "gpu model", id="empty-gpu-model"),
        pytest.param(
            lambda: a100(0, mig=("7g.80gb", "1g.10gb")), "gpu 0 mig_slices", id="eight-compute-slices"
        ),
        pytest.param(
            lambda: a100(2, mig=("3g.40gb", "3g.40gb", "2g.20gb")),
            "gpu 2 mig_slices",
            id="three-plus-three-plus-two",
        ),
        pytest.param(
            lambda: GpuDevice(
                0, "GPU-0", "A100", 81920, (MigSlice("s", "1g.10gb"), MigSlice("s", "1g.10gb"))
            ),
            "gpu 0 mig_slices",
            id="duplicate-slice-ids",
        ),
        pytest.param(lambda: MigSlice("s0", "5g.50gb"), "mig profile", id="unknown-slice-profile"),
        pytest.param(lambda: MigSlice("bad id!", "1g.10gb"), "mig slice id", id="bad-slice-id"),
    ],
)
def test_bad_inventory_names_the_field(build: Callable[[], object], field: str) -> None:
    with pytest.raises(InvalidInventoryError) as info:
        build()
    assert info.value.field == field


@pytest.mark.parametrize(
    ("request_", "kind", "gpus", "milli", "description"),
    [
        pytest.param(GpuRequest(), GpuKind.NONE, 0, 0, "no GPU, 1000m CPU, 1024 MiB", id="cpu-only"),
        pytest.param(
            GpuRequest(gpus=2), GpuKind.WHOLE, 2, 2000, "2 GPU, 1000m CPU, 1024 MiB", id="two-whole"
        ),
        pytest.param(
            GpuRequest(gpus=1, gpu_memory_mib=40960, gpu_models="A100|H100"),
            GpuKind.WHOLE,
            1,
            1000,
            "1 GPU (40960 MiB GPU memory) on A100|H100, 1000m CPU, 1024 MiB",
            id="whole-with-memory-and-models",
        ),
        pytest.param(
            GpuRequest(gpu_milli=250, cpu_milli=2000, memory_mib=8192),
            GpuKind.FRACTION,
            1,
            250,
            "0.25 GPU, 2000m CPU, 8192 MiB",
            id="quarter",
        ),
        pytest.param(
            GpuRequest(gpu_milli=500, gpus=1, gpu_memory_mib=20480),
            GpuKind.FRACTION,
            1,
            500,
            "0.5 GPU (20480 MiB GPU memory), 1000m CPU, 1024 MiB",
            id="half-with-memory",
        ),
        pytest.param(
            GpuRequest(mig_profile="3g.40gb", gpus=1),
            GpuKind.MIG,
            0,
            429,
            "MIG 3g.40gb, 1000m CPU, 1024 MiB",
            id="mig-3g",
        ),
        pytest.param(
            GpuRequest(mig_profile="1g.10gb"),
            GpuKind.MIG,
            0,
            143,
            "MIG 1g.10gb, 1000m CPU, 1024 MiB",
            id="mig-1g",
        ),
        pytest.param(
            GpuRequest(mig_profile="7g.141gb"),
            GpuKind.MIG,
            0,
            1000,
            "MIG 7g.141gb, 1000m CPU, 1024 MiB",
            id="mig-7g",
        ),
    ],
)
def test_request_shape(request_: GpuRequest, kind: GpuKind, gpus: int, milli: int, description: str) -> None:
    assert request_.kind is kind
    assert request_.gpus == gpus
    assert request_.total_gpu_milli == milli
    assert request_.describe() == description


def test_request_normalizes_constraints() -> None:
    request = GpuRequest(
        gpus=1,
        gpu_models=["T4", "A100", "T4"],
        node_labels={"zone": "b", "nvidia.com/gpu.product": "A100"},
        workload_class="training",
    )
    assert request.gpu_models == frozenset({"A100", "T4"})
    assert request.node_labels == (("nvidia.com/gpu.product", "A100"), ("zone", "b"))
    assert request.workload_class is WorkloadClass.TRAINING


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(GpuRequest(), id="cpu-only"),
        pytest.param(GpuRequest(gpus=3, gpu_memory_mib=40960, priority=-7, team="vision"), id="whole"),
        pytest.param(
            GpuRequest(gpu_milli=125, gpu_memory_mib=4096, workload_class="inference"), id="fraction"
        ),
        pytest.param(
            GpuRequest(
                mig_profile="2g.20gb",
                gpu_models=["A100-SXM4-80GB"],
                node_labels={"zone": "a"},
                preemptible=True,
            ),
            id="mig-with-constraints",
        ),
        pytest.param(
            GpuRequest(gpus=2, preemptible=True, preemption_grace_seconds=90, checkpoint_on_sigterm=True),
            id="checkpoints-on-sigterm",
        ),
    ],
)
def test_to_dict_round_trips(request_: GpuRequest) -> None:
    data = request_.to_dict()
    assert GpuRequest.from_dict(data) == request_
    # "gang" only on gangs (tests/unit/test_gang_spec.py), the preemption keys only when they are
    # not the defaults (tests/integration/ledger/test_preemption.py): other stored texts stay as they were.
    optional = {"gang", "preemption_grace_seconds", "preempts", "checkpoint_on_sigterm"}
    present = {k for k in optional if getattr(request_, k) != GpuRequest.__dataclass_fields__[k].default}
    assert set(data) == {f.name for f in dataclasses.fields(GpuRequest)} - optional | present
    assert isinstance(data["gpu_models"], list) and isinstance(data["node_labels"], dict)
    assert data["workload_class"] == request_.workload_class.value


def test_to_dict_is_primitive_values() -> None:
    request = GpuRequest(
        gpu_milli=500, gpu_models=["T4", "A100"], node_labels={"zone": "a"}, workload_class="inference"
    )
    assert request.to_dict() == {
        "cpu_milli": 1000,
        "memory_mib": 1024,
        "gpus": 1,
        "gpu_milli": 500,
        "gpu_memory_mib": None,
        "mig_profile": None,
        "gpu_models": ["A100", "T4"],
        "node_labels": {"zone": "a"},
        "workload_class": "inference",
        "priority": 0,
        "team": "default",
        "preemptible": False,
        "prefer_node_labels": {},
    }


@pytest.mark.parametrize(
    ("value", "attribute"),
    [
        pytest.param(GpuRequest(gpus=1), "gpus", id="request"),
        pytest.param(NodeInventory("n1", 1000, 1024), "cpu_milli", id="node"),
        pytest.param(a100(0), "memory_mib", id="gpu"),
        pytest.param(MigSlice("s0", "1g.10gb"), "profile", id="mig-slice"),
    ],
)
def test_values_are_immutable(value: object, attribute: str) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, attribute, 2)


def test_node_inventory_normalizes_fields() -> None:
    gpus = [a100(0), a100(1, mig=("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"))]
    node = NodeInventory("gpu-0", 64000, 524288, gpus, labels={"zone": "a"}, health="cordoned")  # type: ignore[arg-type]
    assert isinstance(node.gpus, tuple) and len(node.gpus) == 2
    assert node.labels == (("zone", "a"),)
    assert node.health is NodeHealth.CORDONED
    assert [s.profile for s in node.gpus[1].mig_slices] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
