"""The spot rule on the gatekeeper path: what a pod gated by the executor hook is reserved on (pure).

Each case is a pod as KubernetesPodOperator builds it, through the hook's own decision
(:func:`~airflow_gpupool.executor_hook.decide`), then the gatekeeper's capacity rule.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_gpupool.controller.capacity import GatedCapacity, checkpointed
from airflow_gpupool.executor_hook import decide
from airflow_gpupool.labels import CAPACITY_TYPE_LABEL, PRIORITY_KEY, REQUEST_ANNOTATION
from airflow_gpupool.resources import GpuRequest

CHEAP_SPOT = GatedCapacity(urgent_priority=100, price_ratio=0.3)
TRAINING = {REQUEST_ANNOTATION: json.dumps({"workload_class": "training", "preemptible": True})}
CKPT_ENV = [{"name": "GPUPOOL_CHECKPOINT_DIR", "value": "s3://ckpt/train"}]


def gpu_pod(
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    env: list[dict[str, Any]] | None = None,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "base", "env": env or [], "resources": {"limits": {"nvidia.com/gpu": 1}}}]
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"metadata": {"name": "p", "labels": labels or {}, "annotations": annotations or {}}, "spec": spec}


def admitted_request(pod: dict[str, Any], rule: GatedCapacity = CHEAP_SPOT) -> GpuRequest:
    """Return the request the gatekeeper reserves for ``pod`` once the hook gated it."""
    decision = decide(pod)
    assert decision.gate, decision.annotations
    hooked = {**pod, "metadata": {**pod["metadata"], "annotations": dict(decision.annotations)}}
    return rule.apply(GpuRequest.from_dict(json.loads(decision.annotations[REQUEST_ANNOTATION])), hooked)


ON_DEMAND = {"required": {CAPACITY_TYPE_LABEL: "on-demand"}, "preferred": {}}
PREFERS_SPOT = {"required": {}, "preferred": {CAPACITY_TYPE_LABEL: "spot"}}
EITHER = {"required": {}, "preferred": {}}

CASES = [
    pytest.param(
        gpu_pod(labels={PRIORITY_KEY: "100"}), CHEAP_SPOT, ON_DEMAND, id="urgent by its priority label"
    ),
    pytest.param(
        gpu_pod(annotations={PRIORITY_KEY: "250"}), CHEAP_SPOT, ON_DEMAND, id="urgent by annotation"
    ),
    pytest.param(
        gpu_pod(annotations={REQUEST_ANNOTATION: '{"workload_class": "inference"}'}),
        CHEAP_SPOT,
        ON_DEMAND,
        id="inference is urgent",
    ),
    pytest.param(
        gpu_pod(annotations={PRIORITY_KEY: "100"}),
        GatedCapacity(urgent_priority=500, price_ratio=0.3),
        EITHER,
        id="under a higher urgent_priority",
    ),
    pytest.param(
        gpu_pod(annotations=TRAINING, env=CKPT_ENV), CHEAP_SPOT, PREFERS_SPOT, id="checkpointed training"
    ),
    pytest.param(
        gpu_pod(annotations=TRAINING, env=CKPT_ENV),
        GatedCapacity(urgent_priority=100, price_ratio=0.5),
        EITHER,
        id="spot not cheap enough for a run of unknown length",
    ),
    pytest.param(
        gpu_pod(annotations=TRAINING, env=CKPT_ENV),
        GatedCapacity(urgent_priority=100, price_ratio=None),
        EITHER,
        id="spot price unknown",
    ),
    pytest.param(gpu_pod(annotations=TRAINING), CHEAP_SPOT, EITHER, id="training without checkpoints"),
    pytest.param(gpu_pod(), CHEAP_SPOT, EITHER, id="plain batch"),
    pytest.param(
        gpu_pod(labels={PRIORITY_KEY: "100"}, node_selector={CAPACITY_TYPE_LABEL: "spot"}),
        CHEAP_SPOT,
        {"required": {CAPACITY_TYPE_LABEL: "spot"}, "preferred": {}},
        id="urgent but its nodeSelector asks for spot",
    ),
    pytest.param(
        gpu_pod(labels={PRIORITY_KEY: "100"}, node_selector={"karpenter.sh/capacity-type": "spot"}),
        CHEAP_SPOT,
        {"required": {"karpenter.sh/capacity-type": "spot"}, "preferred": {}},
        id="urgent but its nodeSelector asks for Karpenter's spot",
    ),
    pytest.param(
        gpu_pod(annotations=TRAINING, env=CKPT_ENV, node_selector={"cloud.google.com/gke-spot": "true"}),
        CHEAP_SPOT,
        {"required": {"cloud.google.com/gke-spot": "true"}, "preferred": {}},
        id="training that chose GKE spot itself",
    ),
]


@pytest.mark.parametrize(("pod", "rule", "expected"), CASES)
def test_the_default_rule_on_a_gated_pod(pod: dict[str, Any], rule: GatedCapacity, expected: Any) -> None:
    request = admitted_request(pod, rule)
    assert dict(request.node_labels) == expected["required"]
    assert dict(request.prefer_node_labels) == expected["preferred"]


def test_a_checkpoint_location_from_a_secret_counts_and_another_variable_does_not() -> None:
    from_secret = [
        {"name": "GPUPOOL_CHECKPOINT_DIR", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    ]
    assert checkpointed(gpu_pod(env=from_secret))
    assert not checkpointed(gpu_pod(env=[{"name": "CHECKPOINT_DIR", "value": "/ckpt"}]))
    assert not checkpointed(gpu_pod(env=[{"name": "GPUPOOL_CHECKPOINT_DIR", "value": ""}]))


def test_the_options_are_read_once_from_the_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__URGENT_PRIORITY", "40")
    monkeypatch.setenv("AIRFLOW__GPUPOOL__SPOT_PRICE_RATIO", "0.25")
    assert GatedCapacity.from_settings() == GatedCapacity(urgent_priority=40, price_ratio=0.25)


def test_a_pod_group_is_checkpointed_only_when_every_pod_is() -> None:
    training = GpuRequest.from_dict({"gpus": 1, "workload_class": "training", "preemptible": True})
    with_dir, without = gpu_pod(env=CKPT_ENV), gpu_pod()
    assert dict(CHEAP_SPOT.apply(training, with_dir, with_dir).prefer_node_labels) == {
        CAPACITY_TYPE_LABEL: "spot"
    }
    assert CHEAP_SPOT.apply(training, with_dir, without).prefer_node_labels == ()
    urgent = GpuRequest.from_dict({"gpus": 1, "priority": 100})
    assert dict(CHEAP_SPOT.apply(urgent, with_dir, without).node_labels) == {CAPACITY_TYPE_LABEL: "on-demand"}
