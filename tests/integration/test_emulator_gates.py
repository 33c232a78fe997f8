"""The emulator enforces Kubernetes' scheduling-gate rules: a gated pod waits, illegal patches are 422."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from airflow_gpupool.testing import KubernetesEmulatorServer

GATE = "gpupool.io/reservation"


@pytest.fixture
def core(k8s: KubernetesEmulatorServer) -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(k8s.kubeconfig_path))


def gated_pod(name: str, gates: tuple[str, ...] = (GATE,), **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "x"}},
        "spec": {
            "schedulingGates": [{"name": g} for g in gates],
            "containers": [
                {"name": "base", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ],
            **spec,
        },
    }


def scheduled_condition(k8s: KubernetesEmulatorServer, name: str) -> dict[str, Any] | None:
    pod = k8s.pod(name)
    assert pod is not None
    return next((c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), None)


def wait_gated(k8s: KubernetesEmulatorServer, name: str) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        condition = scheduled_condition(k8s, name)
        if condition is not None and condition.get("reason") == "SchedulingGated":
            return
        time.sleep(0.05)
    raise AssertionError(f"pod {name} never marked SchedulingGated: {k8s.pod(name)}")


def test_gated_pod_waits_then_runs_once_its_gates_are_removed(
    k8s: KubernetesEmulatorServer, core: Any
) -> None:
    core.create_namespaced_pod("default", gated_pod("g1", gates=(GATE, "other.io/gate")))
    wait_gated(k8s, "g1")
    time.sleep(0.3)  # several kubelet steps: still not scheduled
    pod = k8s.pod("g1")
    assert pod is not None
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    assert scheduled_condition(k8s, "g1") == {
        **(scheduled_condition(k8s, "g1") or {}),
        "status": "False",
        "reason": "SchedulingGated",
    }
    assert not [e for e in k8s.events() if e["reason"] == "Scheduled"]
    pin = [
        {
            "op": "add",
            "path": "/spec/affinity",
            "value": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": ["gpu-a100"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
        },
        {
            "op": "add",
            "path": "/spec/tolerations",
            "value": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
        {"op": "add", "path": "/metadata/annotations", "value": {"gpupool.io/node": "gpu-a100"}},
        {"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": "other.io/gate"}]},
    ]
    core.patch_namespaced_pod("g1", "default", pin)
    time.sleep(0.2)
    assert (k8s.pod("g1") or {})["status"]["phase"] == "Pending"  # one gate left
    core.patch_namespaced_pod("g1", "default", [{"op": "remove", "path": "/spec/schedulingGates"}])
    done = k8s.wait_for_pod("g1", timeout=10)
    assert done["status"]["phase"] == "Succeeded"
    assert done["spec"]["nodeName"] == "gpu-a100"


ILLEGAL_ON_GATED = [
    pytest.param(
        [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "new.io/gate"}}],
        "only deletion is allowed, but found new scheduling gate 'new.io/gate'",
        id="add a gate",
    ),
    pytest.param(
        [
            {
                "op": "replace",
                "path": "/spec/containers/0/resources",
                "value": {"limits": {"nvidia.com/gpu": "2"}},
            }
        ],
        "pod updates may not change fields other than",
        id="change resources",
    ),
    pytest.param(
        [{"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "A", "value": "1"}]}],
        "pod updates may not change fields other than",
        id="add env",
    ),
    pytest.param(
        [{"op": "replace", "path": "/spec/nodeSelector/zone", "value": "b"}],
        "only additions of key/value pairs",
        id="change a nodeSelector value",
    ),
    pytest.param(
        [{"op": "replace", "path": "/spec/schedulerName", "value": "kai-scheduler"}],
        "pod updates may not change fields other than",
        id="change the scheduler",
    ),
    pytest.param(
        [{"op": "add", "path": "/spec/nodeName", "value": "gpu-a100"}],
        "pod updates may not change fields other than",
        id="set nodeName",
    ),
]


@pytest.mark.parametrize(("patch", "message"), ILLEGAL_ON_GATED)
def test_illegal_updates_of_a_gated_pod_are_422(
    k8s: KubernetesEmulatorServer, core: Any, patch: list[dict[str, Any]], message: str
) -> None:
    core.create_namespaced_pod("default", gated_pod("g2", nodeSelector={"zone": "a"}))
    with pytest.raises(ApiException) as raised:
        core.patch_namespaced_pod("g2", "default", patch)
    assert raised.value.status == 422
    assert message in raised.value.body
    pod = k8s.pod("g2")
    assert pod is not None
    assert pod["spec"]["schedulingGates"] == [{"name": GATE}]  # unchanged
    assert pod["spec"]["nodeSelector"] == {"zone": "a"}


def test_legal_updates_of_a_gated_pod(k8s: KubernetesEmulatorServer, core: Any) -> None:
    core.create_namespaced_pod("default", gated_pod("g3", nodeSelector={"zone": "a"}))
    core.patch_namespaced_pod(
        "g3",
        "default",
        [
            {"op": "add", "path": "/spec/nodeSelector/kubernetes.io~1hostname", "value": "gpu-a100"},
            {"op": "add", "path": "/metadata/labels/gpupool.io~1reservation-id", "value": "gp-x"},
            {"op": "replace", "path": "/spec/containers/0/image", "value": "busybox:2"},
        ],
    )
    pod = k8s.pod("g3")
    assert pod is not None
    assert pod["spec"]["nodeSelector"] == {"zone": "a", "kubernetes.io/hostname": "gpu-a100"}
    assert pod["metadata"]["labels"]["gpupool.io/reservation-id"] == "gp-x"


def test_scheduled_pod_may_not_gain_a_gate_or_a_node_selector(
    k8s: KubernetesEmulatorServer, core: Any
) -> None:
    core.create_namespaced_pod("default", gated_pod("s1", gates=()))
    k8s.wait_for_pod("s1", phases={"Running", "Succeeded"})
    for patch, message in (
        (
            [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}],
            "only deletion is allowed",
        ),
        ([{"op": "add", "path": "/spec/nodeSelector", "value": {"zone": "a"}}], "may not change fields"),
    ):
        with pytest.raises(ApiException) as raised:
            core.patch_namespaced_pod("s1", "default", patch)
        assert raised.value.status == 422
        assert message in raised.value.body
    # Metadata stays mutable on any pod.
    core.patch_namespaced_pod("s1", "default", {"metadata": {"annotations": {"a": "b"}}})


def test_a_gated_pod_cannot_be_created_bound(k8s: KubernetesEmulatorServer, core: Any) -> None:
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_pod("default", gated_pod("b1", nodeName="gpu-a100"))
    assert raised.value.status == 422
    assert "cannot be set until all schedulingGates have been removed" in raised.value.body
    assert k8s.pod("b1") is None
