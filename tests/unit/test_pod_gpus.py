"""What GPUs a pod holds, read as the device plugins allocate them (airflow_gpupool.pod_gpus)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_gpupool.pod_gpus import GpuUse, external_pod, gpu_use


def pod(
    limits: dict[str, Any] | None = None,
    *,
    requests: dict[str, Any] | None = None,
    init: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    node: str | None = "n1",
    phase: str = "Running",
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    spec: dict[str, Any] = {"containers": [{"name": "a", "resources": resources}]}
    if init is not None:
        spec["initContainers"] = [{"name": "i", "resources": {"limits": init}}]
    if node:
        spec["nodeName"] = node
    meta = {
        "name": "p",
        "namespace": "ml",
        "uid": "u1",
        "annotations": annotations or {},
        "labels": labels or {},
    }
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (pod({"nvidia.com/gpu": "2"}), GpuUse(whole=2)),
        (pod(requests={"nvidia.com/gpu": 1}), GpuUse(whole=1)),
        (pod({"nvidia.com/mig-1g.10gb": "2"}), GpuUse(mig=(("1g.10gb", 2),))),
        (
            pod({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30", "nvidia.com/gpumem": "8000"}),
            GpuUse(shared=1, share_milli=300, share_memory_mib=8000),
        ),
        (pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}), GpuUse(shared=1, share_memory_mib=4000)),
        (pod({}, annotations={"gpu-fraction": "0.5"}), GpuUse(shared=1, share_milli=500)),
        (pod({}, annotations={"gpu-memory": "2000"}), GpuUse(shared=1, share_memory_mib=2000)),
        (pod({}, annotations={"gpu-fraction": "1"}), GpuUse(whole=1)),
        (pod({"cpu": "2"}), GpuUse()),
        # Kubernetes counts the larger of the containers' sum and the largest init container.
        (pod({"nvidia.com/gpu": "1"}, init={"nvidia.com/gpu": "3"}), GpuUse(whole=3)),
    ],
)
def test_what_a_pod_holds(given: dict[str, Any], expected: GpuUse) -> None:
    assert gpu_use(given) == expected


def test_hamis_allocation_names_the_gpus() -> None:
    annotations = {"hami.io/vgpu-devices-allocated": "GPU-aaaa-1111,NVIDIA,8000,30:;"}
    use = gpu_use(pod({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}, annotations=annotations))
    assert use.devices == ("GPU-aaaa-1111",)


@pytest.mark.parametrize(
    ("limits", "annotations", "names"),
    [
        ({"nvidia.com/gpu": "two"}, {}, "'two' is not a quantity"),
        ({"nvidia.com/gpu": "-1"}, {}, "'-1' is not a quantity"),
        ({"nvidia.com/gpu": "1.5"}, {}, "not a whole, non-negative number"),
        ({"nvidia.com/mig-big": "1"}, {}, "'big' is not a MIG profile name"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}, {}, "not a percentage"),
        ({}, {"gpu-fraction": "lots"}, "'lots' is not a number"),
        ({}, {"gpu-fraction": "2"}, "not a fraction of a GPU"),
    ],
)
def test_unreadable_quantities_say_why(
    limits: dict[str, str], annotations: dict[str, str], names: str
) -> None:
    use = gpu_use(pod(limits, annotations=annotations))
    assert use.unreadable is not None and names in use.unreadable
    assert use.any  # held conservatively, never ignored


def test_only_live_scheduled_pods_count_and_placeholders_never() -> None:
    assert external_pod(pod({"nvidia.com/gpu": "1"}, node=None)) is None  # not scheduled yet
    assert external_pod(pod({"nvidia.com/gpu": "1"}, phase="Succeeded")) is None
    assert external_pod(pod({"nvidia.com/gpu": "1"}, labels={"gpupool.io/scale-up-for": "r1"})) is None
    terminating = pod({"nvidia.com/gpu": "1"})
    terminating["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    found = external_pod(terminating)
    assert found is not None and (found.key, found.node, found.use) == ("ml/p", "n1", GpuUse(whole=1))


def test_the_pods_grant_labels_are_read() -> None:
    labels = {"gpupool.io/reservation-id": "gp-1", "gpupool.io/gang-reservation": "gp-0"}
    found = external_pod(pod({"nvidia.com/gpu": "1"}, labels=labels))
    assert found is not None and (found.reservation_id, found.gang_reservation) == ("gp-1", "gp-0")
