"""Fuzz: GpuPodOperator's arguments at DAG parse time give a valid request or a typed error, never a traceback."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpupool.exceptions import GpuPoolError
from airflow_gpupool.resources import GpuRequest

ODD = st.none() | st.booleans() | st.integers(-3, 2000) | st.floats() | st.text(max_size=5)
ARGS = st.fixed_dictionaries(
    {},
    optional={
        "gpus": st.integers(-2, 10) | ODD,
        "gpu_milli": st.integers(-5, 1500) | ODD,
        "gpu_memory_mib": st.integers(-5, 10**6) | ODD,
        "mig_profile": st.sampled_from(["1g.10gb", "3g.40gb", "9g.9gb"]) | ODD,
        "gpu_models": st.lists(st.sampled_from(["A100", "T4", ""]) | ODD, max_size=2) | ODD,
        "node_labels": st.dictionaries(st.text(max_size=3), ODD, max_size=2) | ODD,
        "prefer_node_labels": st.dictionaries(st.text(max_size=3), ODD, max_size=2) | ODD,
        "priority": st.integers(-10, 10) | ODD,
        "team": st.sampled_from(["vision", ""]) | ODD,
        "workload_class": st.sampled_from(["training", "inference", "batch", "gaming"]) | ODD,
        "reservation_timeout": st.floats() | ODD,
        "lease_ttl": st.floats() | ODD,
        "keep_checkpoints": ODD,
        "log_tail_lines": st.integers(-20, 100) | ODD,
        "binding": st.sampled_from(["whole", "mig", "hami", "nvlink"]) | ODD,
        "gpu_admission": st.sampled_from(["task", "run", "dag"]) | ODD,
        "container_resources": st.fixed_dictionaries(
            {"requests": st.fixed_dictionaries({}, optional={"cpu": ODD, "memory": ODD}) | ODD}
        ),
    },
)


@settings(max_examples=300, deadline=None)
@given(args=ARGS)
def test_any_arguments_give_a_valid_request_or_a_typed_error(args: dict[str, Any]) -> None:
    from airflow_gpupool.operators import GpuPodOperator

    try:
        op = GpuPodOperator(task_id="fuzz", image="train:1", **args)
    except GpuPoolError as e:
        assert isinstance(e, ValueError), f"a bad argument is a ValueError too: {e!r}"
        return
    if "{{" in repr(args):
        return  # a template: checked once rendered
    request = op.gpu_request()
    assert isinstance(request, GpuRequest)
    assert request.gpus >= 0 and request.cpu_milli >= 0 and request.memory_mib >= 0
    for name in ("reservation_timeout", "lease_ttl"):
        value = args.get(name)
        assert value is None or 0 < value < float("inf")
    assert isinstance(op.log_tail_lines, int) and op.log_tail_lines >= 1
