"""GpuPodOperator at DAG-parse time: validation without I/O, templating."""

from __future__ import annotations

import pytest

from airflow_gpupool.exceptions import ConfigurationError, InvalidRequestError
from airflow_gpupool.operators import GpuPodOperator
from airflow_gpupool.operators.escalation import Remedy
from airflow_gpupool.operators.failures import FailureClass


def op(**kwargs: object) -> GpuPodOperator:
    return GpuPodOperator(task_id="train", image="train:1", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "field"),
    [
        pytest.param(
            {"mig_profile": "2g.11gb"}, InvalidRequestError, "mig_profile", id="unknown-mig-profile"
        ),
        pytest.param({"gpu_milli": 500, "gpus": 2}, InvalidRequestError, "gpus", id="fraction-with-2-gpus"),
        pytest.param(
            {"gpus": 1, "gpu_memory_mib": -5}, InvalidRequestError, "gpu_memory_mib", id="negative-memory"
        ),
        pytest.param({"gpus": -1}, InvalidRequestError, "gpus", id="negative-gpus"),
        pytest.param(
            {"gpus": 1, "workload_class": "serving"}, InvalidRequestError, "workload_class", id="bad-class"
        ),
        pytest.param({"gpus": 1, "lease_ttl": 0}, InvalidRequestError, "lease_ttl", id="zero-ttl"),
        pytest.param(
            {"gpus": 1, "prefer_node_labels": ["zone"]},
            InvalidRequestError,
            "prefer_node_labels",
            id="preferred-labels-not-a-mapping",
        ),
        pytest.param(
            {"gpus": 1, "prefer_node_labels": {"zone": "not a label value!"}},
            InvalidRequestError,
            "prefer_node_labels['zone']",
            id="preferred-label-bad-value",
        ),
        pytest.param(
            {"gpus": 1, "preemptible": True, "checkpoint_on_sigterm": True},
            InvalidRequestError,
            "checkpoint_on_sigterm",
            id="checkpoint-on-sigterm-without-checkpoint-dir",
        ),
        pytest.param(
            {"gpus": 1, "checkpoint_on_sigterm": "yes", "checkpoint_dir": "s3://ckpt/run"},
            InvalidRequestError,
            "checkpoint_on_sigterm",
            id="checkpoint-on-sigterm-not-a-bool",
        ),
    ],
)
def test_bad_request_fails_at_parse_time(kwargs: dict, error: type[Exception], field: str) -> None:
    with pytest.raises(error) as info:
        op(**kwargs)
    assert info.value.field == field  # type: ignore[attr-defined]


def test_unknown_binding_fails_at_parse_time() -> None:
    with pytest.raises(ConfigurationError, match="unknown binding 'nvlink'"):
        op(gpus=1, binding="nvlink")


def test_binding_that_cannot_express_the_request_fails_at_parse_time() -> None:
    with pytest.raises(ConfigurationError, match="binding 'whole' cannot express a fraction"):
        op(gpu_milli=250, binding="whole")


def test_parse_does_no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_io(*args: object, **kwargs: object) -> None:
        raise AssertionError("the ledger was touched at parse time")

    monkeypatch.setattr("airflow_gpupool.ledger.ledger.Ledger.__init__", no_io)
    monkeypatch.setattr("airflow_gpupool.hooks.gpupool.GpuPoolHook.get_connection", no_io)
    task = op(gpu_milli=250, gpu_memory_mib=8192, gpu_models=["T4"], binding="hami", ledger_conn_id="pool_eu")
    assert task.gpu_request().describe() == "0.25 GPU (8192 MiB GPU memory) on T4, 1000m CPU, 1024 MiB"


def test_templated_request_is_checked_after_rendering() -> None:
    task = op(gpus="{{ params.gpus }}", gpu_models="A100|H100")
    assert "gpus" in task.template_fields
    task.gpus = "2"  # what rendering produces
    request = task.gpu_request()
    assert request.gpus == 2 and request.gpu_models == frozenset({"A100", "H100"})
    task.gpus = "two"
    with pytest.raises(InvalidRequestError, match="gpus"):
        task.gpu_request()


def test_container_resources_set_the_requested_cpu_and_memory() -> None:
    from kubernetes.client import models as k8s

    task = op(gpus=1, container_resources=k8s.V1ResourceRequirements(requests={"cpu": "4", "memory": "16Gi"}))
    request = task.gpu_request()
    assert (request.cpu_milli, request.memory_mib) == (4000, 16384)


def test_the_cpu_fallback_remedy_needs_cpu_fallback() -> None:
    with pytest.raises(ConfigurationError, match="needs the task's cpu_fallback=True"):
        op(gpus=1, escalation={"gpu_fault": "cpu_fallback"})
    assert op(gpus=1, cpu_fallback=True).escalation.remedy(FailureClass.GPU_FAULT) is Remedy.CPU_FALLBACK


def test_preferred_node_labels_go_into_the_request_and_may_be_templated() -> None:
    task = op(gpus=1, prefer_node_labels={"gpupool.io/dataset-cache": "imagenet"})
    assert task.gpu_request().prefer_node_labels == (("gpupool.io/dataset-cache", "imagenet"),)
    assert "prefer_node_labels" in task.template_fields
    templated = op(gpus=1, prefer_node_labels={"zone": "{{ params.zone }}"})  # checked once rendered
    templated.prefer_node_labels = {"zone": "not a label value!"}
    with pytest.raises(InvalidRequestError) as info:
        templated.gpu_request()
    assert info.value.field == "prefer_node_labels['zone']"


def test_checkpoint_on_sigterm_goes_into_the_request() -> None:
    task = op(gpus=1, preemptible=True, checkpoint_on_sigterm=True, checkpoint_dir="s3://ckpt/{{ run_id }}")
    assert task.gpu_request().checkpoint_on_sigterm is True
    assert op(gpus=1, preemptible=True).gpu_request().checkpoint_on_sigterm is False
