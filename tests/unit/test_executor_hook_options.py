"""The executor hook and a pod's own options: a PriorityClass as its priority, a checkpoint on SIGTERM (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client import models as k8s

from airflow_gpupool.executor_hook import REFUSED, decide, pod_mutation_hook
from airflow_gpupool.labels import (
    BINDING_ANNOTATION,
    CHECKPOINT_ON_SIGTERM_KEY,
    PRIORITY_CLASS_ANNOTATION,
    PRIORITY_KEY,
    REQUEST_ANNOTATION,
)

CKPT_ENV = [{"name": "GPUPOOL_CHECKPOINT_DIR", "value": "s3://ckpt/run"}]


def gpu_pod(
    *,
    priority_class: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "base", "env": env or [], "resources": {"limits": {"nvidia.com/gpu": 1}}}]
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"metadata": {"name": "p", "labels": labels or {}, "annotations": annotations or {}}, "spec": spec}


def test_a_pod_that_names_a_priority_class_is_marked_for_the_gatekeeper() -> None:
    decision = decide(gpu_pod(priority_class="team-high"))
    assert decision.annotations[PRIORITY_CLASS_ANNOTATION] == "team-high"
    assert PRIORITY_KEY not in decision.annotations  # the gatekeeper reads the class's value
    assert json.loads(decision.annotations[REQUEST_ANNOTATION])["priority"] == 0


@pytest.mark.parametrize(
    "p",
    [
        pytest.param(gpu_pod(priority_class="team-high", labels={PRIORITY_KEY: "7"}), id="label"),
        pytest.param(gpu_pod(priority_class="team-high", annotations={PRIORITY_KEY: "7"}), id="annotation"),
        pytest.param(
            gpu_pod(priority_class="team-high", annotations={REQUEST_ANNOTATION: '{"priority": 7}'}),
            id="request",
        ),
    ],
)
def test_a_gpupool_priority_the_pod_sets_wins_over_its_class(p: dict[str, Any]) -> None:
    decision = decide(p)
    assert PRIORITY_CLASS_ANNOTATION not in decision.annotations
    assert decision.annotations[PRIORITY_KEY] == "7"
    assert json.loads(decision.annotations[REQUEST_ANNOTATION])["priority"] == 7


def test_the_class_mark_survives_the_hook_applied_twice() -> None:
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="p"),
        spec=k8s.V1PodSpec(
            priority_class_name="team-high",
            containers=[
                k8s.V1Container(
                    name="base", resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"})
                )
            ],
        ),
    )
    pod_mutation_hook(pod)
    once = dict(pod.metadata.annotations)
    pod_mutation_hook(pod)  # Airflow may apply it twice: the request it wrote is not the pod's own
    assert pod.metadata.annotations == once
    assert once[PRIORITY_CLASS_ANNOTATION] == "team-high" and PRIORITY_KEY not in once
    assert decide(ApiClient().sanitize_for_serialization(pod)).annotations[PRIORITY_CLASS_ANNOTATION]


@pytest.mark.parametrize(
    "p",
    [
        pytest.param(gpu_pod(annotations={CHECKPOINT_ON_SIGTERM_KEY: "true"}, env=CKPT_ENV), id="annotation"),
        pytest.param(gpu_pod(labels={CHECKPOINT_ON_SIGTERM_KEY: "true"}, env=CKPT_ENV), id="label"),
        pytest.param(
            gpu_pod(annotations={REQUEST_ANNOTATION: '{"checkpoint_on_sigterm": true}'}, env=CKPT_ENV),
            id="in the request",
        ),
    ],
)
def test_a_pod_that_promises_a_checkpoint_on_sigterm_says_so_in_its_request(p: dict[str, Any]) -> None:
    decision = decide(p)
    assert decision.annotations[BINDING_ANNOTATION] == "whole"
    assert json.loads(decision.annotations[REQUEST_ANNOTATION])["checkpoint_on_sigterm"] is True


def test_without_a_promise_the_request_says_nothing_of_sigterm() -> None:
    decision = decide(gpu_pod(annotations={CHECKPOINT_ON_SIGTERM_KEY: "false"}, env=CKPT_ENV))
    assert "checkpoint_on_sigterm" not in json.loads(decision.annotations[REQUEST_ANNOTATION])


@pytest.mark.parametrize(
    ("p", "named"),
    [
        pytest.param(
            gpu_pod(annotations={CHECKPOINT_ON_SIGTERM_KEY: "true"}),
            "checkpoint_on_sigterm",
            id="no checkpoint dir",
        ),
        pytest.param(
            gpu_pod(annotations={REQUEST_ANNOTATION: '{"checkpoint_on_sigterm": true}'}),
            "checkpoint_on_sigterm",
            id="no checkpoint dir, in the request",
        ),
        pytest.param(
            gpu_pod(annotations={CHECKPOINT_ON_SIGTERM_KEY: "sure"}, env=CKPT_ENV),
            CHECKPOINT_ON_SIGTERM_KEY,
            id="not a flag",
        ),
    ],
)
def test_a_broken_sigterm_promise_is_refused_with_the_reason(p: dict[str, Any], named: str) -> None:
    binding = decide(p).annotations[BINDING_ANNOTATION]
    assert binding.startswith(f"{REFUSED}: ") and named in binding
