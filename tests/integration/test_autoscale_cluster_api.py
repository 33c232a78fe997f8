"""Cluster Autoscaler's node groups on Cluster API are discovered as scalable pools, end to end on the emulator.

A MachineDeployment with Cluster Autoscaler's size annotations and its scale-from-zero capacity
annotations (GPU count and type, CPU, memory, the labels its nodes carry) is a pool: the
controller's step stores its empty node, a request only it fits waits, the step asks for a node
with a ProvisioningRequest whose pods select the group's labels, the emulator's provisioner adds
the node, and the request is granted there. No GPU node exists at the start.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from airflow_gpupool.controller.autoscale.cluster_api import (
    CAPACITY_PREFIX,
    MAX_SIZE_ANNOTATION,
    MIN_SIZE_ANNOTATION,
)
from airflow_gpupool.controller.autoscale.step import Autoscaler, AutoscaleSettings
from airflow_gpupool.inventory.sync import core_v1_api, sync_inventory
from airflow_gpupool.labels import SCALE_UP_LABEL
from airflow_gpupool.ledger import Ledger, LedgerScalablePools, ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, ScalableNodePool, cpu_node

PRODUCT = "NVIDIA-A100-SXM4-80GB"
LABELS = {"nvidia.com/gpu.product": PRODUCT, "nvidia.com/gpu.memory": "81920", "node-group": "gpu-md"}
GROUP = ("autoscaling.x-k8s.io", "v1", "default", "provisioningrequests")


def machine_deployment(name: str, max_size: str = "4") -> dict[str, Any]:
    annotations = {
        MIN_SIZE_ANNOTATION: "0",
        MAX_SIZE_ANNOTATION: max_size,
        f"{CAPACITY_PREFIX}cpu": "96",
        f"{CAPACITY_PREFIX}memory": "1024Gi",
        f"{CAPACITY_PREFIX}gpu-type": "nvidia.com/gpu",
        f"{CAPACITY_PREFIX}gpu-count": "4",
        f"{CAPACITY_PREFIX}labels": ",".join(f"{k}={v}" for k, v in LABELS.items()),
    }
    return {
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "MachineDeployment",
        "metadata": {"name": name, "namespace": "capi", "annotations": annotations},
        "spec": {"clusterName": "gpu", "replicas": 0},
    }


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


def test_a_cluster_api_node_group_is_discovered_and_scaled_from_zero(ledger: Ledger) -> None:
    emulated = ScalableNodePool("gpu-md", {"gpus": 4, "product": PRODUCT, "labels": LABELS}, 0.3, 1.0)
    with KubernetesEmulatorServer(
        nodes=[cpu_node("cpu-0")], scalable_pools=[emulated], unserved_groups=()
    ) as k8s:
        core = core_v1_api(k8s.kubeconfig_path)
        custom = client.CustomObjectsApi(core.api_client)
        for name, max_size in (("gpu-md", "4"), ("frozen", "0")):  # max 0: Cluster Autoscaler never grows it
            custom.create_namespaced_custom_object(
                "cluster.x-k8s.io",
                "v1beta1",
                "capi",
                "machinedeployments",
                machine_deployment(name, max_size),
            )
        step = Autoscaler(ledger, core, AutoscaleSettings(namespace="default", discover_cluster_api=True))

        assert step().created == []  # nothing waits yet; the group's empty node is stored
        (shape,) = LedgerScalablePools(ledger).get()
        assert (shape.name, shape.source, len(shape.node.gpus)) == ("gpu-md", "cluster-api", 4)
        assert (
            ledger.reserve(GpuRequest(gpus=4), "train", reservation_id="capi-1").state
            is ReservationState.WAITING
        )

        assert step().created == ["capi-1"]
        (template,) = core.list_pod_template_for_all_namespaces(label_selector=SCALE_UP_LABEL).items
        assert template.template.spec.node_selector == LABELS
        (new,) = wait_for(
            lambda: [
                n["metadata"]["name"] for n in k8s.nodes() if n["metadata"]["name"].startswith("gpu-md-")
            ]
        )
        sync_inventory(ledger, core)
        wait_for(lambda: ledger.get("capi-1").state is ReservationState.GRANTED, 5, ledger.reap)
        assert ledger.get("capi-1").grant.node == new  # type: ignore[union-attr]
        assert step().deleted == ["capi-1"]
        listed = custom.list_namespaced_custom_object(*GROUP, label_selector=SCALE_UP_LABEL)
        assert listed["items"] == []


def test_without_discovery_the_node_group_is_not_a_pool(ledger: Ledger) -> None:
    with KubernetesEmulatorServer(nodes=[cpu_node("cpu-0")], unserved_groups=()) as k8s:
        core = core_v1_api(k8s.kubeconfig_path)
        client.CustomObjectsApi(core.api_client).create_namespaced_custom_object(
            "cluster.x-k8s.io", "v1beta1", "capi", "machinedeployments", machine_deployment("gpu-md")
        )
        result = Autoscaler(ledger, core, AutoscaleSettings(namespace="default"))()
        assert (result.method, result.created) == (None, [])
        assert LedgerScalablePools(ledger).get() == []
