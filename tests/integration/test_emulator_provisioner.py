"""The emulator's node provisioner answers ProvisioningRequests and unschedulable pods as Cluster Autoscaler does."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, config

from airflow_gpupool.testing import KubernetesEmulatorServer, ScalableNodePool, gpu_node

BURST = ScalableNodePool("burst", {"gpus": 8}, delay_seconds=0.3, idle_seconds=0.8, max_nodes=2)
GROUP = ("autoscaling.x-k8s.io", "v1", "default", "provisioningrequests")
BEST_EFFORT = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"


@pytest.fixture
def k8s() -> Iterator[KubernetesEmulatorServer]:
    with KubernetesEmulatorServer(nodes=[gpu_node("gpu-a-0", gpus=2)], scalable_pools=[BURST]) as server:
        yield server


@pytest.fixture
def api(k8s: KubernetesEmulatorServer) -> Any:
    return config.new_client_from_config(config_file=k8s.kubeconfig_path)


def wait_for(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.05)
    raise AssertionError(f"not reached in {timeout}s")


def container(gpus: int) -> dict[str, Any]:
    return {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}


def ask(api: Any, name: str, gpus: int, count: int, klass: str = BEST_EFFORT, template: bool = True) -> None:
    if template:
        body = {"metadata": {"name": name}, "template": {"spec": {"containers": [container(gpus)]}}}
        client.CoreV1Api(api).create_namespaced_pod_template("default", body)
    spec = {"provisioningClassName": klass, "podSets": [{"count": count, "podTemplateRef": {"name": name}}]}
    body = {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {"name": name},
        "spec": spec,
    }
    client.CustomObjectsApi(api).create_namespaced_custom_object(*GROUP, body)


def conditions(api: Any, name: str) -> dict[str, tuple[str, str]]:
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(*GROUP, name)
    return {c["type"]: (c["status"], c["reason"]) for c in (obj.get("status") or {}).get("conditions", [])}


def burst(k8s: KubernetesEmulatorServer) -> list[str]:
    return sorted(n["metadata"]["name"] for n in k8s.nodes() if n["metadata"]["name"].startswith("burst-"))


def test_a_request_gets_its_nodes_after_the_delay_then_they_go_when_idle(
    k8s: KubernetesEmulatorServer, api: Any
) -> None:
    ask(api, "three", gpus=4, count=3)  # two pods a node: two nodes
    wait_for(lambda: "Accepted" in conditions(api, "three"))
    assert burst(k8s) == []  # not before the delay
    wait_for(lambda: conditions(api, "three").get("Provisioned") == ("True", "CapacityIsProvisioned"))
    assert len(burst(k8s)) == 2
    assert all(
        n["metadata"]["labels"]["gpupool.io/pool"] == "burst"
        for n in k8s.nodes()
        if n["metadata"]["name"].startswith("burst-")
    )
    wait_for(lambda: not burst(k8s), timeout=5)


def test_a_busy_node_stays(k8s: KubernetesEmulatorServer, api: Any) -> None:
    ask(api, "one", gpus=8, count=1)
    (node,) = wait_for(lambda: burst(k8s))
    k8s.configure_pod(name="worker", duration_seconds=2.0)
    pod = {"metadata": {"name": "worker"}, "spec": {"nodeName": node, "containers": [container(8)]}}
    client.CoreV1Api(api).create_namespaced_pod("default", pod)
    time.sleep(1.5)  # past the idle time, but the pod runs
    assert burst(k8s) == [node]
    k8s.wait_for_pod("worker", timeout=5)
    wait_for(lambda: not burst(k8s), timeout=5)


FAILED = {
    "no template": (dict(gpus=1, count=1, template=False), "PodTemplateNotFound"),
    "no pool fits": (dict(gpus=16, count=1), "NoNodePoolFits"),
    "more nodes than the pool adds": (dict(gpus=8, count=3), "MaxNodesReached"),
}


@pytest.mark.parametrize("case", FAILED, ids=list(FAILED))
def test_a_request_that_cannot_be_met_fails(k8s: KubernetesEmulatorServer, api: Any, case: str) -> None:
    arguments, reason = FAILED[case]
    ask(api, "bad", **arguments)  # type: ignore[arg-type]
    assert wait_for(lambda: conditions(api, "bad").get("Failed")) == ("True", reason)
    assert burst(k8s) == []


def test_check_capacity_adds_nothing(k8s: KubernetesEmulatorServer, api: Any) -> None:
    ask(api, "fits", gpus=2, count=1, klass="check-capacity.autoscaling.x-k8s.io")
    assert wait_for(lambda: conditions(api, "fits").get("Provisioned")) == ("True", "CapacityIsFound")
    ask(api, "big", gpus=8, count=1, klass="check-capacity.autoscaling.x-k8s.io")
    wait_for(lambda: "Accepted" in conditions(api, "big"))
    time.sleep(0.5)
    assert "Provisioned" not in conditions(api, "big") and burst(k8s) == []


def test_the_spec_cannot_change(api: Any) -> None:
    ask(api, "fixed", gpus=1, count=1)
    patch = {"spec": {"podSets": [{"count": 5, "podTemplateRef": {"name": "fixed"}}]}}
    with pytest.raises(client.ApiException) as refused:
        client.CustomObjectsApi(api).patch_namespaced_custom_object(*GROUP, "fixed", patch)
    assert refused.value.status == 422 and "immutable" in refused.value.body


def placeholder(api: Any, name: str, priority: int) -> None:
    pc = {"metadata": {"name": f"p{priority + 1000}"}, "value": priority}
    try:
        client.SchedulingV1Api(api).create_priority_class(pc)
    except client.ApiException:
        pass
    pod = {
        "metadata": {"name": name},
        "spec": {"priorityClassName": f"p{priority + 1000}", "containers": [container(4)]},
    }
    client.CoreV1Api(api).create_namespaced_pod("default", pod)


def test_unschedulable_pods_get_a_node_expendable_ones_do_not(
    k8s: KubernetesEmulatorServer, api: Any
) -> None:
    placeholder(api, "expendable", -100)
    time.sleep(0.8)
    assert burst(k8s) == []  # below Cluster Autoscaler's cutoff: no node for it
    client.CoreV1Api(api).delete_namespaced_pod("expendable", "default", grace_period_seconds=0)
    placeholder(api, "hold-a", -1)
    placeholder(api, "hold-b", -1)
    (node,) = wait_for(lambda: burst(k8s))  # both fit one node
    wait_for(
        lambda: all((k8s.pod(n) or {}).get("spec", {}).get("nodeName") == node for n in ("hold-a", "hold-b"))
    )
    time.sleep(1.2)
    assert burst(k8s) == [node]  # placeholders above the cutoff keep it
    for name in ("hold-a", "hold-b"):
        client.CoreV1Api(api).delete_namespaced_pod(name, "default", grace_period_seconds=0)
    wait_for(lambda: not burst(k8s))


def test_the_default_cluster_serves_provisioning_requests_not_karpenter(api: Any) -> None:
    groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
    assert "autoscaling.x-k8s.io" in groups and "karpenter.sh" not in groups
    with pytest.raises(client.ApiException) as missing:
        client.CustomObjectsApi(api).list_cluster_custom_object("karpenter.sh", "v1", "nodepools")
    assert missing.value.status == 404
