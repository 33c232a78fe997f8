"""Pods as Airflow builds them for the gatekeeper's tests, and the Events the controller leaves on them."""

from __future__ import annotations

from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client import models as k8s_models

from airflow_gpupool.executor_hook import pod_mutation_hook
from airflow_gpupool.testing import KubernetesEmulatorServer


def create_hooked_pod(
    core: Any,
    name: str,
    limits: dict[str, str],
    *,
    dag_id: str = "legacy",
    duration: str = "0.3",
    env: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    priority_class: str | None = None,
    **annotations: str,
) -> dict[str, Any]:
    """Build a pod as KubernetesPodOperator would (labels), run the hook on it, create it.

    :param duration: the seconds the emulator runs it
    :param env: the container's environment
    :param node_selector: the pod's ``nodeSelector``
    :param priority_class: the pod's ``priorityClassName``
    """
    pod = k8s_models.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=k8s_models.V1ObjectMeta(
            name=name,
            labels={"dag_id": dag_id, "task_id": name, "run_id": "manual__1", "try_number": "1"},
            annotations={"gpupool.emulator/duration-seconds": duration, **annotations},
        ),
        spec=k8s_models.V1PodSpec(
            restart_policy="Never",
            node_selector=node_selector,
            priority_class_name=priority_class,
            containers=[
                k8s_models.V1Container(
                    name="base",
                    image="train:1",
                    env=[k8s_models.V1EnvVar(name=k, value=v) for k, v in (env or {}).items()] or None,
                    resources=k8s_models.V1ResourceRequirements(limits=limits),
                )
            ],
        ),
    )
    pod_mutation_hook(pod)
    created = core.create_namespaced_pod("default", ApiClient().sanitize_for_serialization(pod))
    return dict(ApiClient().sanitize_for_serialization(created))


def reasons(k8s: KubernetesEmulatorServer, name: str) -> list[str]:
    """Return the reasons of the Events on pod ``name``, oldest first."""
    return [e["reason"] for e in k8s.events() if e["involvedObject"]["name"] == name]


def messages(k8s: KubernetesEmulatorServer, name: str, reason: str) -> list[str]:
    """Return the messages of the Events of ``reason`` on pod ``name``, oldest first."""
    return [
        e["message"] for e in k8s.events() if e["involvedObject"]["name"] == name and e["reason"] == reason
    ]


def create_priority_class(core: Any, name: str, value: int) -> None:
    """Create a scheduling.k8s.io/v1 PriorityClass through the API, as a cluster admin would."""
    from kubernetes.client import SchedulingV1Api

    body = k8s_models.V1PriorityClass(metadata=k8s_models.V1ObjectMeta(name=name), value=value)
    SchedulingV1Api(core.api_client).create_priority_class(body)
