"""The objects a scale-up creates are sized as the request: its CPU, memory and GPU part, its labels."""

from __future__ import annotations

import pytest

from airflow_gpupool.controller.autoscale import manifests
from airflow_gpupool.labels import SCALE_UP_LABEL
from airflow_gpupool.resources import GpuRequest

SIZES = {
    "whole GPUs": (GpuRequest(gpus=4, cpu_milli=8000, memory_mib=65536), {"nvidia.com/gpu": "4"}),
    "a fraction needs one GPU of the node": (GpuRequest(gpu_milli=250), {"nvidia.com/gpu": "1"}),
    "a MIG slice": (GpuRequest(mig_profile="1g.10gb"), {"nvidia.com/mig-1g.10gb": "1"}),
}


@pytest.mark.parametrize("case", SIZES, ids=list(SIZES))
def test_the_pod_is_sized_as_the_request(case: str) -> None:
    request, gpu = SIZES[case]
    spec = manifests.pod_spec(request, {"gpupool.io/pool": "burst"})
    resources = spec["containers"][0]["resources"]
    expected = {"cpu": f"{request.cpu_milli}m", "memory": f"{request.memory_mib}Mi", **gpu}
    assert resources == {"requests": expected, "limits": expected}


def test_the_pod_selects_the_pool_and_the_request_labels_but_not_the_ledger_own() -> None:
    request = GpuRequest(gpus=1, node_labels=(("zone", "b"), ("gpupool.io/capacity-type", "on-demand")))
    spec = manifests.pod_spec(request, {"gpupool.io/pool": "burst"})
    assert spec["nodeSelector"] == {"gpupool.io/pool": "burst", "zone": "b"}


def test_a_provisioning_request_names_its_template_and_reservation() -> None:
    spec = manifests.pod_spec(GpuRequest(gpus=8), {})
    template = manifests.pod_template("res-1", "gpu", spec)
    request = manifests.provisioning_request("res-1", "gpu", 3, manifests.CHECK_CAPACITY)
    assert request["spec"] == {
        "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
        "podSets": [{"count": 3, "podTemplateRef": {"name": template["metadata"]["name"]}}],
    }
    for obj in (template, request):
        assert obj["metadata"]["labels"][SCALE_UP_LABEL] == "res-1"
        assert obj["metadata"]["namespace"] == "gpu"


def test_placeholders_run_below_every_pod_but_above_the_expendable_cutoff() -> None:
    pods = manifests.placeholder_pods("res-1", "gpu", 2, manifests.pod_spec(GpuRequest(gpus=1), {}), "pc")
    assert len({p["metadata"]["name"] for p in pods}) == 2
    assert all(p["spec"]["priorityClassName"] == "pc" for p in pods)
    priority_class = manifests.placeholder_priority_class("pc")
    assert -10 <= priority_class["value"] < 0  # Cluster Autoscaler ignores pods below -10
    assert priority_class["preemptionPolicy"] == "Never"


def test_names_are_dns_labels_whatever_the_id() -> None:
    name = manifests.object_name("dag.task_Run:2026-12-06T10:00:00+00:00/1")
    assert len(name) <= 63 and name == name.lower() and name.replace("-", "").isalnum()
