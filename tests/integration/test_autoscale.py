"""Waiting demand reaches the autoscaler, end to end on the emulator (issue 36, item 4).

A request that fits no current node waits; the controller's autoscale step asks for a node of a
scalable pool (a ProvisioningRequest, or placeholder pods where the cluster lacks the CRD); the
emulator's provisioner adds the node; inventory sync brings it to the ledger, which grants the
request; the step deletes what it made; the pod runs and ends; the idle node goes. Each exit path
(granted, cancelled, timed out, a controller restarted in between) leaves nothing behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from airflow_gpupool.controller.autoscale.pools import ScalablePool
from airflow_gpupool.controller.autoscale.step import Autoscaler, AutoscaleSettings
from airflow_gpupool.inventory.sync import core_v1_api, sync_inventory
from airflow_gpupool.labels import SCALE_UP_LABEL
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GangSpec, GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, ScalableNodePool, gpu_node
from tests.ledger_fixtures import FakeClock

PRODUCT = "NVIDIA-A100-SXM4-80GB"
POOL = ScalablePool("burst", gpu_model=PRODUCT, gpus=8, gpu_memory_mib=81920, cpu="96", memory="1024Gi")
EMULATED = ScalableNodePool("burst", {"gpus": 8, "product": PRODUCT}, delay_seconds=0.3, idle_seconds=1.0)
NO_PROVISIONING_REQUESTS = ("autoscaling.x-k8s.io",)
GROUP = ("autoscaling.x-k8s.io", "v1", "default", "provisioningrequests")


@pytest.fixture(params=["provisioning-request", "placeholder-pods"])
def method(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def k8s(method: str) -> Iterator[KubernetesEmulatorServer]:
    unserved = NO_PROVISIONING_REQUESTS if method == "placeholder-pods" else ()
    nodes = [gpu_node("gpu-a-0", gpus=8, product=PRODUCT)]
    with KubernetesEmulatorServer(
        nodes=nodes, default_duration_seconds=0.2, scalable_pools=[EMULATED], unserved_groups=unserved
    ) as server:
        yield server


@pytest.fixture
def core(k8s: KubernetesEmulatorServer) -> Any:
    return core_v1_api(k8s.kubeconfig_path)


@pytest.fixture
def full(ledger: Ledger, core: Any) -> Ledger:
    """The ledger of the emulated cluster, its one node wholly granted."""
    sync_inventory(ledger, core)
    filler = ledger.reserve(GpuRequest(gpus=8), "filler", reservation_id="filler")
    assert filler.state is ReservationState.GRANTED
    return ledger


@pytest.fixture
def autoscaler(full: Ledger, core: Any) -> Callable[[], Autoscaler]:
    return lambda: Autoscaler(full, core, AutoscaleSettings(pools=(POOL,), namespace="default"))


def wait_for(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not reached in {timeout}s: {check}")


def left_behind(core: Any) -> list[str]:
    """Return every ProvisioningRequest, PodTemplate and placeholder pod a scale-up made."""
    found = [
        f"podtemplate/{t.metadata.name}"
        for t in core.list_pod_template_for_all_namespaces(label_selector=SCALE_UP_LABEL).items
    ]
    found += [
        f"pod/{p.metadata.name}"
        for p in core.list_pod_for_all_namespaces(label_selector=SCALE_UP_LABEL).items
    ]
    try:
        listed = client.CustomObjectsApi(core.api_client).list_namespaced_custom_object(
            *GROUP, label_selector=SCALE_UP_LABEL
        )
        found += [f"provisioningrequest/{o['metadata']['name']}" for o in listed["items"]]
    except client.ApiException as e:
        assert e.status == 404  # the cluster serves no ProvisioningRequest
    return found


def burst_nodes(k8s: KubernetesEmulatorServer) -> list[str]:
    return [n["metadata"]["name"] for n in k8s.nodes() if n["metadata"]["name"].startswith("burst-")]


def test_round_trip(
    full: Ledger, core: Any, k8s: KubernetesEmulatorServer, autoscaler: Callable[[], Autoscaler], method: str
) -> None:
    waiting = full.reserve(GpuRequest(gpus=4), "train", reservation_id="train-1")
    assert waiting.state is ReservationState.WAITING
    step = autoscaler()

    first = step()
    assert (first.method, first.created) == (method, ["train-1"])
    again = step()  # idempotent: nothing more for the same waiting demand
    assert (again.created, again.kept, again.deleted) == ([], ["train-1"], [])
    made = left_behind(core)
    if method == "provisioning-request":
        assert sorted(k.split("/")[0] for k in made) == ["podtemplate", "provisioningrequest"]
        template = core.list_pod_template_for_all_namespaces(label_selector=SCALE_UP_LABEL).items[0]
        limits = template.template.spec.containers[0].resources.limits
        assert limits["nvidia.com/gpu"] == "4"
    else:
        assert [k.split("/")[0] for k in made] == ["pod"]
        pod = k8s.pods(label_selector=SCALE_UP_LABEL)[0]
        assert pod["spec"]["priority"] == -1
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"

    new = wait_for(lambda: burst_nodes(k8s))
    assert len(new) == 1
    sync_inventory(full, core)
    granted = wait_for(
        lambda: full.get("train-1").state is ReservationState.GRANTED or full.reap() and None, 5
    )
    assert granted
    grant = full.get("train-1").grant
    assert grant is not None and grant.node == new[0]

    ended = step()
    assert ended.deleted == ["train-1"] and ended.created == []
    wait_for(lambda: not left_behind(core))

    pod = {
        "metadata": {"name": "train-1", "labels": {"gpupool.io/reservation-id": "train-1"}},
        "spec": {
            "nodeName": new[0],
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}}],
        },
    }
    core.create_namespaced_pod("default", pod)
    k8s.wait_for_pod("train-1", ("Running",), timeout=5)
    k8s.wait_for_pod("train-1", timeout=5)
    full.release("train-1")
    wait_for(lambda: not burst_nodes(k8s), timeout=10)  # idle past 1 s: removed
    sync_inventory(full, core)
    assert [n.name for n in full.snapshot().nodes] == ["gpu-a-0"]


def test_a_gang_asks_once_for_all_members(
    full: Ledger, core: Any, k8s: KubernetesEmulatorServer, autoscaler: Callable[[], Autoscaler], method: str
) -> None:
    # The ledger refuses a request no node of its inventory could ever take: the gang fits gpu-a-0 once it is free.
    gang = full.reserve(GpuRequest(gpus=4, gang=GangSpec(2, 2)), "gang", reservation_id="gang-1")
    assert gang.state is ReservationState.WAITING
    result = autoscaler()()
    assert result.created == ["gang-1"]
    if method == "provisioning-request":
        listed = client.CustomObjectsApi(core.api_client).list_namespaced_custom_object(*GROUP)["items"]
        assert [o["spec"]["podSets"][0]["count"] for o in listed] == [2]
    else:
        assert len(k8s.pods(label_selector=f"{SCALE_UP_LABEL}=gang-1")) == 2
    assert len(wait_for(lambda: burst_nodes(k8s))) == 1  # both members fit one new node
    sync_inventory(full, core)
    wait_for(lambda: full.get("gang-1").state is ReservationState.GRANTED or full.reap() and None, 5)
    assert autoscaler()().deleted == ["gang-1"]
    wait_for(lambda: not left_behind(core))


def test_one_new_node_serves_two_small_requests(
    full: Ledger, core: Any, autoscaler: Callable[[], Autoscaler]
) -> None:
    full.reserve(GpuRequest(gpus=4), "a", reservation_id="small-a")
    full.reserve(GpuRequest(gpus=4), "b", reservation_id="small-b")
    assert autoscaler()().created == ["small-a"]  # small-b fits the node asked for small-a


@pytest.mark.parametrize("exit_path", ["cancelled", "timed out", "restart, then cancelled"])
def test_nothing_left_behind(
    full: Ledger,
    core: Any,
    clock: FakeClock,
    autoscaler: Callable[[], Autoscaler],
    exit_path: str,
) -> None:
    full.reserve(GpuRequest(gpus=4), "train", reservation_id="train-2", timeout=60)
    step = autoscaler()
    assert step().created == ["train-2"]
    assert left_behind(core)
    if exit_path == "timed out":
        clock.advance(61)
        full.reap()
    else:
        full.release("train-2", reason="cancelled")
    if exit_path.startswith("restart"):
        step = autoscaler()  # a new controller: no memory of what the last one made
    assert full.get("train-2").state is not ReservationState.WAITING
    assert step().deleted == ["train-2"]
    wait_for(lambda: not left_behind(core))


def node_pool(name: str) -> dict[str, Any]:
    """A Karpenter NodePool pinning an 8-GPU A100 shape through GFD label requirements."""
    requirements = [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": [PRODUCT]},
        {"key": "nvidia.com/gpu.count", "operator": "In", "values": ["8"]},
        {"key": "nvidia.com/gpu.memory", "operator": "In", "values": ["81920"]},
    ]
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"requirements": requirements, "nodeClassRef": {"name": "default"}}}},
    }


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_a_karpenter_node_pool_is_discovered_and_scaled_for(ledger: Ledger) -> None:
    karpenter_pool = ScalableNodePool(
        "gpu-burst",
        {"gpus": 8, "product": PRODUCT, "labels": {"karpenter.sh/nodepool": "gpu-burst"}},
        delay_seconds=0.3,
        idle_seconds=1.0,
    )
    with KubernetesEmulatorServer(
        nodes=[gpu_node("gpu-a-0", gpus=8, product=PRODUCT)],
        scalable_pools=[karpenter_pool],
        unserved_groups=NO_PROVISIONING_REQUESTS,  # a Karpenter cluster: NodePools, no ProvisioningRequest
    ) as k8s:
        core = core_v1_api(k8s.kubeconfig_path)
        custom = client.CustomObjectsApi(core.api_client)
        custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", node_pool("gpu-burst"))
        sync_inventory(ledger, core)
        ledger.reserve(GpuRequest(gpus=8), "filler", reservation_id="filler")
        ledger.reserve(GpuRequest(gpus=8), "train", reservation_id="train-k")
        step = Autoscaler(ledger, core, AutoscaleSettings(namespace="default", discover_karpenter=True))
        assert step().created == ["train-k"]
        (pod,) = k8s.pods(label_selector=SCALE_UP_LABEL)
        assert pod["spec"]["nodeSelector"]["karpenter.sh/nodepool"] == "gpu-burst"
        (new,) = wait_for(lambda: gpu_burst_nodes(k8s))
        sync_inventory(ledger, core)
        wait_for(lambda: ledger.get("train-k").state is ReservationState.GRANTED or ledger.reap() and None, 5)
        assert ledger.get("train-k").grant.node == new  # type: ignore[union-attr]
        assert step().deleted == ["train-k"]
        wait_for(lambda: not left_behind(core))


def test_without_discovery_a_karpenter_cluster_asks_for_nothing(ledger: Ledger) -> None:
    with KubernetesEmulatorServer(
        nodes=[gpu_node("gpu-a-0", gpus=8, product=PRODUCT)], unserved_groups=NO_PROVISIONING_REQUESTS
    ) as k8s:
        core = core_v1_api(k8s.kubeconfig_path)
        client.CustomObjectsApi(core.api_client).create_cluster_custom_object(
            "karpenter.sh", "v1", "nodepools", node_pool("gpu-burst")
        )
        sync_inventory(ledger, core)
        ledger.reserve(GpuRequest(gpus=8), "filler", reservation_id="filler")
        ledger.reserve(GpuRequest(gpus=8), "train", reservation_id="train-k")
        result = Autoscaler(ledger, core, AutoscaleSettings(namespace="default"))()
        assert (result.method, result.created) == (None, [])
        assert left_behind(core) == []


def gpu_burst_nodes(k8s: KubernetesEmulatorServer) -> list[str]:
    return [n["metadata"]["name"] for n in k8s.nodes() if n["metadata"]["name"].startswith("gpu-burst-")]
