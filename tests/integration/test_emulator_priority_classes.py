"""The emulator serves scheduling.k8s.io/v1 PriorityClasses and fills a new pod's priority from one."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_gpupool.testing import KubernetesEmulatorServer


def test_priority_classes_are_served_and_fill_a_new_pods_priority(
    k8s: KubernetesEmulatorServer, core: Any
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    scheduling = client.SchedulingV1Api(core.api_client)
    body = client.V1PriorityClass(
        metadata=client.V1ObjectMeta(name="team-high"), value=500, preemption_policy="Never"
    )
    scheduling.create_priority_class(body)
    assert scheduling.read_priority_class("team-high").value == 500
    with pytest.raises(ApiException) as missing:
        scheduling.read_priority_class("no-such-class")
    assert missing.value.status == 404

    def create(name: str, priority_class: str) -> Any:
        spec = {"priorityClassName": priority_class, "containers": [{"name": "main", "image": "x"}]}
        return core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": spec})

    named = create("named", "team-high")
    assert (named.spec.priority, named.spec.preemption_policy) == (500, "Never")
    assert create("unknown", "no-such-class").spec.priority is None  # a real API server refuses it

    k8s.reset()
    assert scheduling.list_priority_class().items == []
