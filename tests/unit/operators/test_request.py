"""The operator's request, built without I/O from its arguments and ``container_resources``."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import models as k8s

from airflow_gpupool.exceptions import InvalidInventoryError, InvalidRequestError
from airflow_gpupool.operators.request import (
    REQUEST_FIELDS,
    build_request,
    check_checkpoint_on_sigterm,
    check_seconds,
    requested_cpu_milli,
    requested_memory_mib,
    templated,
)
from airflow_gpupool.resources import GpuRequest

DEFAULTS: dict[str, Any] = {
    "gpus": 0,
    "gpu_milli": None,
    "gpu_memory_mib": None,
    "mig_profile": None,
    "gpu_models": (),
    "node_labels": None,
    "prefer_node_labels": None,
    "priority": 0,
    "team": "default",
}


def resources(**requests: Any) -> k8s.V1ResourceRequirements:
    return k8s.V1ResourceRequirements(requests=requests)


@pytest.mark.parametrize(
    ("cpu", "milli"),
    [("4", 4000), ("500m", 500), ("0.1", 100), (2, 2000), ("1.5", 1500)],
)
def test_cpu_quantities(cpu: Any, milli: int) -> None:
    assert requested_cpu_milli(resources(cpu=cpu)) == milli


@pytest.mark.parametrize(
    ("memory", "mib"),
    [("16Gi", 16384), ("512Mi", 512), ("1G", 953), (2 * 1024 * 1024, 2)],
)
def test_memory_quantities(memory: Any, mib: int) -> None:
    assert requested_memory_mib(resources(memory=memory)) == mib


def test_defaults_when_container_resources_say_nothing() -> None:
    assert (requested_cpu_milli(None), requested_memory_mib(resources())) == (1000, 1024)


def test_bad_quantities_name_the_field() -> None:
    with pytest.raises(InvalidRequestError) as cpu:
        requested_cpu_milli(resources(cpu="four"))
    assert cpu.value.field == "container_resources.requests.cpu"
    with pytest.raises(InvalidInventoryError, match="memory quantity") as memory:
        requested_memory_mib(resources(memory="lots"))
    assert memory.value.field == "container_resources.requests.memory"


def test_build_request_renders_text_fields() -> None:
    fields = {
        **DEFAULTS,
        "gpus": " 2 ",
        "gpu_models": "A100,H100",
        "node_labels": {"zone": "a"},
        "prefer_node_labels": {"gpupool.io/dataset-cache": "imagenet"},
    }
    request = build_request(fields, workload_class="training", preemptible=True, container_resources=None)
    assert request == GpuRequest(
        gpus=2,
        gpu_models=frozenset({"A100", "H100"}),
        node_labels=(("zone", "a"),),
        prefer_node_labels=(("gpupool.io/dataset-cache", "imagenet"),),
        workload_class="training",  # type: ignore[arg-type]
        preemptible=True,
    )
    assert set(fields) == set(REQUEST_FIELDS)


def test_templates_are_found_anywhere_inside_a_value() -> None:
    assert templated("{{ params.gpus }}") and templated({"zone": "{% if x %}a{% endif %}"})
    assert templated(["A100", "{{ var.value.model }}"]) and not templated({"zone": "a", "n": 1})


@pytest.mark.parametrize("value", [0, -1, True, "30", float("nan")])
def test_bad_seconds_name_the_argument(value: Any) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check_seconds("lease_ttl", value)
    assert caught.value.field == "lease_ttl"


def test_checkpoint_on_sigterm_goes_into_the_request() -> None:
    def build(**kwargs: Any) -> GpuRequest:
        return build_request(
            {**DEFAULTS, "gpus": 1},
            workload_class="training",
            preemptible=True,
            container_resources=None,
            **kwargs,
        )

    assert build(checkpoint_on_sigterm=True).checkpoint_on_sigterm is True
    assert build().checkpoint_on_sigterm is False


@pytest.mark.parametrize(
    ("value", "checkpoint_dir", "expected"),
    [
        pytest.param(
            True, None, "False without a checkpoint_dir (there is nowhere to write one)", id="no-dir"
        ),
        pytest.param("yes", "s3://ckpt/run", "True or False", id="not-a-bool"),
        pytest.param(1, "s3://ckpt/run", "True or False", id="an-int"),
    ],
)
def test_bad_checkpoint_on_sigterm_names_the_argument(value: Any, checkpoint_dir: Any, expected: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check_checkpoint_on_sigterm(value, checkpoint_dir)
    assert (caught.value.field, caught.value.value, caught.value.expected) == (
        "checkpoint_on_sigterm",
        value,
        expected,
    )


def test_checkpoint_on_sigterm_with_a_checkpoint_dir_or_off_is_accepted() -> None:
    check_checkpoint_on_sigterm(True, "{{ var.value.ckpt }}/{{ run_id }}")  # templated: rendered later
    check_checkpoint_on_sigterm(False, None)
