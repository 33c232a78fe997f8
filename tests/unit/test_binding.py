"""Slice bindings: the pod changes of each strategy, and which requests each can express."""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_gpupool.binding import PodBinding, SliceFacts, binding_for
from airflow_gpupool.exceptions import ConfigurationError, UnverifiedGpuUuidError
from airflow_gpupool.resources import GpuRequest

WHOLE2 = SliceFacts(
    gpus=2, gpu_uuids=("GPU-a", "GPU-b"), milli_per_gpu=1000, gpu_memory_mib=81920, mig_profile=None
)
VERIFIED2 = replace(WHOLE2, gpu_uuids_verified=True)
QUARTER = SliceFacts(gpus=1, gpu_uuids=("GPU-a",), milli_per_gpu=250, gpu_memory_mib=10240, mig_profile=None)
MIG = SliceFacts(gpus=0, gpu_uuids=("GPU-a",), milli_per_gpu=143, gpu_memory_mib=10240, mig_profile="1g.10gb")


@pytest.mark.parametrize(
    ("name", "request_", "facts", "expected"),
    [
        pytest.param(
            "whole", GpuRequest(gpus=2), WHOLE2, PodBinding(limits={"nvidia.com/gpu": "2"}), id="whole"
        ),
        pytest.param(
            "mig",
            GpuRequest(mig_profile="1g.10gb"),
            MIG,
            PodBinding(limits={"nvidia.com/mig-1g.10gb": "1"}),
            id="mig",
        ),
        pytest.param(
            "mig", GpuRequest(gpus=2), WHOLE2, PodBinding(limits={"nvidia.com/gpu": "2"}), id="mig-pool-whole"
        ),
        pytest.param(
            "hami",
            GpuRequest(gpu_milli=250),
            QUARTER,
            PodBinding(
                limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "25"}
            ),
            id="hami-fraction",
        ),
        pytest.param(
            "kai",
            GpuRequest(gpu_milli=250),
            QUARTER,
            PodBinding(annotations={"gpu-fraction": "0.25"}, scheduler_name="kai-scheduler"),
            id="kai-fraction",
        ),
        pytest.param(
            "device",
            GpuRequest(gpus=2),
            VERIFIED2,
            PodBinding(env={"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}),
            id="device",
        ),
    ],
)
def test_binding_pod_changes(
    name: str, request_: GpuRequest, facts: SliceFacts, expected: PodBinding
) -> None:
    assert binding_for(request_, name, "test").bind(facts) == expected


@pytest.mark.parametrize(
    ("name", "request_"),
    [
        pytest.param("whole", GpuRequest(gpu_milli=500), id="whole-cannot-share"),
        pytest.param("hami", GpuRequest(mig_profile="1g.10gb"), id="hami-no-mig"),
        pytest.param("device", GpuRequest(mig_profile="1g.10gb"), id="device-no-mig"),
    ],
)
def test_binding_refuses_what_it_cannot_express(name: str, request_: GpuRequest) -> None:
    with pytest.raises(ConfigurationError, match=f"binding '{name}' cannot express"):
        binding_for(request_, name, "test")


def test_unknown_binding_lists_the_choices() -> None:
    with pytest.raises(
        ConfigurationError, match=r"choose one of \['device', 'dra', 'hami', 'kai', 'mig', 'whole'\]"
    ):
        binding_for(GpuRequest(gpus=1), "nvlink", "test")


def test_device_binding_refuses_unverified_uuids() -> None:
    binding = binding_for(GpuRequest(gpus=2), "device", "test")
    with pytest.raises(UnverifiedGpuUuidError, match="gpupool agent run") as caught:
        binding.bind(WHOLE2)
    assert caught.value.uuids == ("GPU-a", "GPU-b")


def test_device_binding_without_gpus_needs_no_verified_uuid() -> None:
    facts = replace(WHOLE2, gpus=0, gpu_uuids=())
    assert binding_for(GpuRequest(), "device", "test").bind(facts) == PodBinding(
        env={"NVIDIA_VISIBLE_DEVICES": "void"}
    )


# -- dra: a ResourceClaim selecting the granted devices by the UUIDs NVIDIA's DRA driver publishes ---


def claim_request(binding: PodBinding) -> dict[str, object]:
    assert binding.resource_claim is not None and binding.limits == {}
    (request,) = binding.resource_claim["devices"]["requests"]
    assert request["name"] == "gpu"
    return dict(request["exactly"])


def test_dra_selects_the_granted_gpus_by_uuid() -> None:
    exactly = claim_request(binding_for(GpuRequest(gpus=2), "dra", "t").bind(VERIFIED2))
    assert exactly == {
        "deviceClassName": "gpu.nvidia.com",
        "allocationMode": "ExactCount",
        "count": 2,
        "selectors": [
            {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].uuid in ["GPU-a", "GPU-b"]'}}
        ],
    }


def test_dra_selects_a_mig_device_by_its_uuid_when_the_inventory_knows_it() -> None:
    facts = replace(MIG, gpu_uuids_verified=True, mig_slice="MIG-1f2e3d4c-0000-1111-2222-333344445555")
    exactly = claim_request(binding_for(GpuRequest(mig_profile="1g.10gb"), "dra", "t").bind(facts))
    assert exactly["deviceClassName"] == "mig.nvidia.com" and exactly["count"] == 1
    assert exactly["selectors"] == [
        {
            "cel": {
                "expression": 'device.attributes["gpu.nvidia.com"].uuid == "MIG-1f2e3d4c-0000-1111-2222-333344445555"'
            }
        }
    ]


def test_dra_selects_a_mig_device_of_the_granted_profile_on_the_granted_gpu() -> None:
    facts = replace(MIG, gpu_uuids_verified=True, mig_slice="mig-1g.10gb-3")  # the inventory's own id
    exactly = claim_request(binding_for(GpuRequest(mig_profile="1g.10gb"), "dra", "t").bind(facts))
    expression = (
        'device.attributes["gpu.nvidia.com"].parentUUID == "GPU-a" && '
        'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    )
    assert exactly["selectors"] == [{"cel": {"expression": expression}}]


def test_dra_refuses_uuids_no_agent_reported() -> None:
    with pytest.raises(UnverifiedGpuUuidError, match="a ResourceClaim's CEL selector cannot select them"):
        binding_for(GpuRequest(gpus=2), "dra", "t").bind(WHOLE2)


def test_dra_cannot_express_a_fraction() -> None:
    with pytest.raises(ConfigurationError, match="binding 'dra' cannot express a fraction"):
        binding_for(GpuRequest(gpu_milli=250), "dra", "task t")


def test_dra_without_gpus_claims_nothing() -> None:
    none = SliceFacts(gpus=0, gpu_uuids=(), milli_per_gpu=0, gpu_memory_mib=0, mig_profile=None)
    assert binding_for(GpuRequest(gpus=0), "dra", "t").bind(none) == PodBinding()
