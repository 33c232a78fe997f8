"""Gang specs on requests: validation, the JSON round trip, and how a gang is described."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_gpupool.exceptions import InvalidGangError, InvalidRequestError
from airflow_gpupool.resources import GangSpec, GpuRequest


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"members": 0, "min_members": 0}, "gang members", id="no-members"),
        pytest.param({"members": 513, "min_members": 1}, "gang members", id="too-many"),
        pytest.param({"members": True, "min_members": 1}, "gang members", id="bool-members"),
        pytest.param({"members": 3, "min_members": 4}, "gang min_members", id="min-above-max"),
        pytest.param({"members": 3, "min_members": 0}, "gang min_members", id="min-zero"),
        pytest.param({"members": 3, "min_members": "2"}, "gang min_members", id="min-text"),
        pytest.param(
            {"members": 2, "min_members": 2, "topology_keys": ("bad key!",)},
            "gang topology_keys",
            id="bad-key",
        ),
        pytest.param(
            {"members": 2, "min_members": 2, "topology_keys": "zone"}, "gang topology_keys", id="key-not-list"
        ),
        pytest.param(
            {"members": 2, "min_members": 2, "topology_keys": ("zone", "zone")},
            "gang topology_keys",
            id="key-twice",
        ),
    ],
)
def test_bad_gang_spec_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidGangError) as caught:
        GangSpec(**kwargs)
    assert caught.value.field == field
    assert isinstance(caught.value, InvalidRequestError)


def test_a_request_takes_a_gang_as_spec_or_mapping_and_rejects_junk() -> None:
    spec = GangSpec(members=4, min_members=2, topology_keys=["topology.kubernetes.io/zone"])  # type: ignore[arg-type]
    assert spec.topology_keys == ("topology.kubernetes.io/zone",) and spec.elastic
    mapping: Any = {"members": 4, "min_members": 2, "topology_keys": ["topology.kubernetes.io/zone"]}
    as_mapping = GpuRequest(gpus=1, gang=mapping)
    assert as_mapping.gang == spec
    with pytest.raises(InvalidGangError, match="keys among"):
        GpuRequest(gpus=1, gang={"members": 2, "size": 2})  # type: ignore[arg-type]
    with pytest.raises(InvalidGangError):
        GpuRequest(gpus=1, gang=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_", "text"),
    [
        pytest.param(
            GpuRequest(gpus=1, gang=GangSpec(3, 3)), "gang of 3 × 1 GPU, 1000m CPU, 1024 MiB", id="fixed"
        ),
        pytest.param(
            GpuRequest(gpu_milli=500, gang=GangSpec(4, 2)),
            "gang of 2-4 × 0.5 GPU, 1000m CPU, 1024 MiB",
            id="elastic",
        ),
        pytest.param(GpuRequest(gpus=2), "2 GPU, 1000m CPU, 1024 MiB", id="single"),
    ],
)
def test_describe_says_gang_of_n(request_: GpuRequest, text: str) -> None:
    assert request_.describe() == text


def test_gang_round_trips_and_only_gangs_carry_the_key() -> None:
    request = GpuRequest(gpus=2, gang=GangSpec(members=4, min_members=2, topology_keys=("rack",)))
    data = request.to_dict()
    assert data["gang"] == {"members": 4, "min_members": 2, "topology_keys": ["rack"]}
    assert GpuRequest.from_dict(json.loads(json.dumps(data))) == request
    single = GpuRequest(gpus=2)
    assert "gang" not in single.to_dict()
    # The stored text of a request without a gang is what it was before gangs existed.
    assert json.dumps(single.to_dict(), sort_keys=True) == json.dumps(
        {
            "cpu_milli": 1000,
            "gpu_memory_mib": None,
            "gpu_milli": None,
            "gpu_models": [],
            "gpus": 2,
            "memory_mib": 1024,
            "mig_profile": None,
            "node_labels": {},
            "preemptible": False,
            "prefer_node_labels": {},
            "priority": 0,
            "team": "default",
            "workload_class": "batch",
        },
        sort_keys=True,
    )


def test_member_is_the_shape_without_the_gang() -> None:
    request = GpuRequest(gpus=1, cpu_milli=4000, gang=GangSpec(3, 3))
    assert request.member == GpuRequest(gpus=1, cpu_milli=4000)
    member = request.member
    assert member.member is member
    assert GangSpec.from_dict({"members": 3}) == GangSpec(3, 3)
