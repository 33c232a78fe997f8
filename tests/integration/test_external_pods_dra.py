"""A pod this project did not make whose GPUs come from a DRA ResourceClaim, counted on its claim's devices (SQLite and PostgreSQL).

The emulator stores ResourceClaims as sent; the test writes the claim's ``status.allocation`` and
``status.reservedFor`` as NVIDIA's DRA driver and the scheduler would.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from airflow_gpupool.controller.external_pods import ExternalPodCounter
from airflow_gpupool.inventory.sync import sync_inventory
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.integration.test_external_pods import COUNTED_WITHIN, external_gpus, wait_for

DRA = ("resource.k8s.io", "v1")


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    with KubernetesEmulatorServer(nodes=[gpu_node("gpu-a", gpus=4)], default_duration_seconds=600) as server:
        yield server


@pytest.fixture
def core(emulator: KubernetesEmulatorServer) -> Any:
    emulator.reset()
    return client.CoreV1Api(config.new_client_from_config(emulator.kubeconfig_path))


@pytest.fixture
def counted(ledger: Ledger, core: Any) -> Iterator[ExternalPodCounter]:
    sync_inventory(ledger, core)
    counter = ExternalPodCounter(ledger, core)
    counter.start()
    wait_for(lambda: counter.watch.stats.lists >= 1, "the first list")
    yield counter
    counter.stop()


def claimed_pod(name: str, claim: str) -> dict[str, Any]:
    container = {"name": "main", "image": "vllm:1", "resources": {"claims": [{"name": "gpu"}]}}
    spec = {
        "restartPolicy": "Never",
        "nodeName": "gpu-a",
        "containers": [container],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def make_claim(core: Any, name: str) -> str:
    """Create a claim (its name made unique: the emulator's reset keeps ResourceClaims); return its name."""
    name = f"{name}-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
    }
    client.CustomObjectsApi(core.api_client).create_namespaced_custom_object(
        *DRA, "default", "resourceclaims", body
    )
    return name


def allocate(core: Any, name: str, pod: dict[str, Any], *devices: str) -> None:
    results = [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-a", "device": d} for d in devices]
    meta = pod["metadata"]
    status = {
        "allocation": {"devices": {"results": results}},
        "reservedFor": [{"resource": "pods", "name": meta["name"], "uid": meta["uid"]}],
    }
    client.CustomObjectsApi(core.api_client).patch_namespaced_custom_object_status(
        *DRA, "default", "resourceclaims", name, {"status": status}
    )


def test_a_pod_with_an_allocated_claim_is_held_on_its_devices_and_released_once_gone(
    ledger: Ledger, core: Any, counted: ExternalPodCounter, emulator: KubernetesEmulatorServer
) -> None:
    claim = make_claim(core, "vllm-gpu")
    pod = core.api_client.sanitize_for_serialization(
        core.create_namespaced_pod("default", claimed_pod("vllm", claim))
    )
    time.sleep(0.5)  # the pod's events are read, its claim is not allocated: not counted yet
    assert external_gpus(ledger) == {}

    allocate(core, claim, pod, "gpu-3", "gpu-1")
    allocated = time.monotonic()
    # The pod's next change (its status, as the kubelet runs it) reads the claim again.
    core.patch_namespaced_pod("vllm", "default", {"metadata": {"labels": {"allocated": "yes"}}})
    wait_for(lambda: external_gpus(ledger), "the claimed pod counted")
    assert counted.written_at["default/vllm"] - allocated < COUNTED_WITHIN
    assert external_gpus(ledger) == {"external:default/vllm": [("gpu-a", 1), ("gpu-a", 3)]}
    grant = ledger.reserve(GpuRequest(gpus=2), "train").grant
    assert grant is not None and grant.gpu_indices == (0, 2)  # the claim's GPUs are not granted

    core.delete_namespaced_pod("vllm", "default", grace_period_seconds=0)
    wait_for(lambda: not external_gpus(ledger), "the claimed pod released")
    assert ledger.check_invariants() == []


def test_a_relist_reads_every_claim_in_one_list(
    ledger: Ledger, core: Any, emulator: KubernetesEmulatorServer
) -> None:
    sync_inventory(ledger, core)
    for name in ("a", "b"):
        claim = make_claim(core, f"{name}-gpu")
        pod = core.api_client.sanitize_for_serialization(
            core.create_namespaced_pod("default", claimed_pod(name, claim))
        )
        allocate(core, claim, pod, "gpu-0" if name == "a" else "gpu-2")
    counter = ExternalPodCounter(ledger, core)
    counter.count_once()
    assert external_gpus(ledger) == {
        "external:default/a": [("gpu-a", 0)],
        "external:default/b": [("gpu-a", 2)],
    }
    lists = [
        r
        for r in emulator.requests
        if r.method == "GET" and r.path == "/apis/resource.k8s.io/v1/resourceclaims"
    ]
    assert len(lists) == 1 and counter.claims.reads == 1  # one list, no read per pod


def test_a_claim_kept_for_one_pod_is_read_again_for_the_next(
    ledger: Ledger, core: Any, counted: ExternalPodCounter
) -> None:
    claim = make_claim(core, "shared-gpu")
    first = core.api_client.sanitize_for_serialization(
        core.create_namespaced_pod("default", claimed_pod("first", claim))
    )
    allocate(core, claim, first, "gpu-1")
    core.patch_namespaced_pod("first", "default", {"metadata": {"labels": {"allocated": "yes"}}})
    wait_for(lambda: external_gpus(ledger), "the first pod counted")
    core.delete_namespaced_pod("first", "default", grace_period_seconds=0)
    wait_for(lambda: not external_gpus(ledger), "the first pod released")
    client.CustomObjectsApi(core.api_client).patch_namespaced_custom_object_status(
        *DRA, "default", "resourceclaims", claim, {"status": {"reservedFor": []}}
    )  # the first pod gone, its reservation goes (the allocation stays until the next pod's)

    # The claim, deallocated and allocated anew to the next pod on other devices: the kept copy
    # (reserved for the first pod) must not answer for it.
    second = core.api_client.sanitize_for_serialization(
        core.create_namespaced_pod("default", claimed_pod("second", claim))
    )
    allocate(core, claim, second, "gpu-2")
    core.patch_namespaced_pod("second", "default", {"metadata": {"labels": {"allocated": "yes"}}})
    wait_for(lambda: external_gpus(ledger), "the second pod counted")
    assert external_gpus(ledger) == {"external:default/second": [("gpu-a", 2)]}
    assert counted.watch.stats.lists == 1, counted.watch.stats  # read at the pod's event, not at a relist
