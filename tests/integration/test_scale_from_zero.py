"""Scale from zero, end to end on the emulator (issue 36, item 4): a cluster with no GPU node at all.

The ledger refuses at once a request that no node of its inventory could ever take; a request
that only a new node of a scalable pool fits must wait instead, for the autoscaler. The
controller stores the pools' empty nodes in the ledger, so the reserve of another process (a
second ledger here, as the worker's) sees them. Then the round trip: wait → ProvisioningRequest →
the provisioner's node → inventory sync → grant → the pod runs → the node empties → removed, and
nothing the scale-up made is left behind. A request no pool fits is still refused at once, naming
the pool's node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from airflow_gpupool.controller.autoscale.pools import ScalablePool
from airflow_gpupool.controller.autoscale.step import Autoscaler, AutoscaleSettings
from airflow_gpupool.controller.leader import LeaderElector, LeaseSettings
from airflow_gpupool.controller.run import ControllerIntervals, GpuPoolController
from airflow_gpupool.exceptions import NoCapacityError
from airflow_gpupool.inventory.sync import core_v1_api
from airflow_gpupool.labels import SCALE_UP_LABEL
from airflow_gpupool.ledger import Ledger, LedgerScalablePools, ReservationState
from airflow_gpupool.resources import GangSpec, GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, ScalableNodePool, cpu_node

PRODUCT = "NVIDIA-A100-SXM4-80GB"
POOL = ScalablePool("burst", gpu_model=PRODUCT, gpus=8, gpu_memory_mib=81920, cpu="96", memory="1024Gi")
EMULATED = ScalableNodePool("burst", {"gpus": 8, "product": PRODUCT}, delay_seconds=0.3, idle_seconds=1.0)
GROUP = ("autoscaling.x-k8s.io", "v1", "default", "provisioningrequests")


@pytest.fixture
def k8s() -> Iterator[KubernetesEmulatorServer]:
    with KubernetesEmulatorServer(
        nodes=[cpu_node("cpu-0")], default_duration_seconds=0.3, scalable_pools=[EMULATED]
    ) as server:
        yield server


@pytest.fixture
def core(k8s: KubernetesEmulatorServer) -> Any:
    return core_v1_api(k8s.kubeconfig_path)


@pytest.fixture
def controller(ledger: Ledger, core: Any) -> GpuPoolController:
    """A leading controller whose every step is due at each pass (no pod watch: the test's pod is ours)."""
    leases = client.CoordinationV1Api(core.api_client)
    elector = LeaderElector(leases, LeaseSettings("default", "one", lease_duration=60))
    settings = AutoscaleSettings(pools=(POOL,), namespace="default")
    tiny = 0.01
    return GpuPoolController(
        ledger,
        core,
        elector,
        ControllerIntervals(tiny, tiny, tiny, autoscale=tiny, forecast=60),
        count_external_pods=False,
        autoscaler=Autoscaler(ledger, core, settings),
    )


def wait_for(
    check: Callable[[], Any], timeout: float = 10.0, between: Callable[[], Any] = lambda: None
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        between()
        time.sleep(0.05)
    raise AssertionError(f"not reached in {timeout}s: {check}")


def left_behind(core: Any) -> list[str]:
    """Every ProvisioningRequest, PodTemplate and placeholder pod a scale-up made."""
    found = [
        f"podtemplate/{t.metadata.name}"
        for t in core.list_pod_template_for_all_namespaces(label_selector=SCALE_UP_LABEL).items
    ]
    found += [
        f"pod/{p.metadata.name}"
        for p in core.list_pod_for_all_namespaces(label_selector=SCALE_UP_LABEL).items
    ]
    listed = client.CustomObjectsApi(core.api_client).list_namespaced_custom_object(
        *GROUP, label_selector=SCALE_UP_LABEL
    )
    return found + [f"provisioningrequest/{o['metadata']['name']}" for o in listed["items"]]


def gpu_nodes(k8s: KubernetesEmulatorServer) -> list[str]:
    return [n["metadata"]["name"] for n in k8s.nodes() if n["metadata"]["name"].startswith("burst-")]


def test_without_a_scalable_pool_a_request_for_gpus_is_refused_at_once(
    ledger: Ledger, controller: GpuPoolController
) -> None:
    controller.autoscaler = None  # no pool declared: nothing is stored
    controller.run_pass()
    assert not ledger.snapshot().nodes  # inventory sync keeps GPU nodes only
    with pytest.raises(NoCapacityError):
        ledger.reserve(GpuRequest(gpus=4), "train", reservation_id="refused")


def test_round_trip_from_zero_gpu_nodes(
    ledger: Ledger,
    make_ledger: Callable[..., Ledger],
    controller: GpuPoolController,
    core: Any,
    k8s: KubernetesEmulatorServer,
) -> None:
    first = controller.run_pass()  # sync (no GPU node), and the autoscale step stores the pool
    assert first.errors == [] and gpu_nodes(k8s) == []
    assert [s.name for s in LedgerScalablePools(ledger).get()] == ["burst"]

    worker = make_ledger()  # another process's ledger: it learns the pool from the database alone
    waiting = worker.reserve(GpuRequest(gpus=4), "train", reservation_id="train-0")
    assert waiting.state is ReservationState.WAITING
    why = worker.explain("train-0")
    assert "waits for the autoscaler to add a node of scalable pool burst" in why

    asked = controller.run_pass()
    assert asked.autoscaled is not None and asked.autoscaled.created == ["train-0"]
    (template,) = core.list_pod_template_for_all_namespaces(label_selector=SCALE_UP_LABEL).items
    assert template.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "4"
    assert sorted(k.split("/")[0] for k in left_behind(core)) == ["podtemplate", "provisioningrequest"]

    (new,) = wait_for(lambda: gpu_nodes(k8s))
    # The next passes sync the new node, grant the request, and end the scale-up it no longer needs.
    wait_for(lambda: worker.get("train-0").state is ReservationState.GRANTED, 10, controller.run_pass)
    grant = worker.get("train-0").grant
    assert grant is not None and grant.node == new
    wait_for(lambda: not left_behind(core), 5, controller.run_pass)

    pod = {
        "metadata": {"name": "train-0", "labels": {"gpupool.io/reservation-id": "train-0"}},
        "spec": {
            "nodeName": new,
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}}],
        },
    }
    core.create_namespaced_pod("default", pod)
    k8s.wait_for_pod("train-0", ("Running",), timeout=5)
    k8s.wait_for_pod("train-0", timeout=5)  # Succeeded
    worker.release("train-0")
    wait_for(lambda: not gpu_nodes(k8s), timeout=10)  # idle past 1 s: the provisioner removes it
    wait_for(lambda: not ledger.snapshot().nodes, 5, controller.run_pass)
    assert left_behind(core) == []
    assert worker.get("train-0").state is ReservationState.RELEASED


@pytest.mark.parametrize(
    ("request_", "waits"),
    [
        pytest.param(GpuRequest(gpus=8), True, id="a whole pool node"),
        pytest.param(GpuRequest(gpus=4, gang=GangSpec(3, 3)), True, id="a gang over new nodes"),
        pytest.param(GpuRequest(gpus=16), False, id="more GPUs than a pool node has"),
        pytest.param(GpuRequest(gpus=1, gpu_models=frozenset({"H100"})), False, id="a model no pool has"),
    ],
)
def test_only_what_a_pool_node_fits_waits(
    ledger: Ledger, controller: GpuPoolController, request_: GpuRequest, waits: bool
) -> None:
    controller.run_pass()
    if waits:
        assert ledger.reserve(request_, "x", reservation_id="r").state is ReservationState.WAITING
        return
    with pytest.raises(NoCapacityError) as refused:
        ledger.reserve(request_, "x", reservation_id="r")
    # The reason names the pool's node: the inventory has none.
    assert "burst-empty" in str(refused.value)
    assert ledger.get_or_none("r") is None  # refused: never queued
