"""The ledger priority of a gated pod that takes it from its PriorityClass (the pod's own ``spec.priority`` first)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_gpupool.controller.priority_classes import PodPriorities, ResolvedPriority, ledger_priority
from airflow_gpupool.labels import PRIORITY_CLASS_ANNOTATION
from airflow_gpupool.resources import MAX_ABS_PRIORITY


@pytest.mark.parametrize(
    ("kubernetes", "ledger"),
    [
        pytest.param(0, 0, id="zero"),
        pytest.param(1000, 1000, id="as it is"),
        pytest.param(-50, -50, id="negative"),
        pytest.param(MAX_ABS_PRIORITY, MAX_ABS_PRIORITY, id="the top"),
        pytest.param(2_000_001_000, MAX_ABS_PRIORITY, id="system-node-critical, clamped"),
        pytest.param(-2_147_483_648, -MAX_ABS_PRIORITY, id="the lowest, clamped"),
    ],
)
def test_a_kubernetes_priority_is_the_ledger_priority_clamped(kubernetes: int, ledger: int) -> None:
    assert ledger_priority(kubernetes) == ledger


def pod(priority_class: str | None, priority: Any = None) -> dict[str, Any]:
    annotations = {PRIORITY_CLASS_ANNOTATION: priority_class} if priority_class else {}
    spec = {"priorityClassName": priority_class, "priority": priority} if priority is not None else {}
    return {"metadata": {"annotations": annotations}, "spec": spec}


class NoApi:
    """A pass that must not read a class: any attribute of its API client fails the test."""

    @property
    def api_client(self) -> Any:
        raise AssertionError("the PriorityClass was read although the pod carries its priority")


def test_the_pods_own_spec_priority_is_used_without_reading_the_class() -> None:
    priorities = PodPriorities(NoApi())
    assert priorities.resolve(pod("team-high", 5000)) == ResolvedPriority(5000)
    assert priorities.resolve(pod(None)) == ResolvedPriority(None)  # no mark: the request's own


def test_a_spec_priority_that_is_not_an_integer_is_not_taken() -> None:
    with pytest.raises(AssertionError, match="was read"):
        PodPriorities(NoApi()).resolve(pod("team-high", True))


def test_gpupool_s_own_workload_classes_leave_the_request_s_priority() -> None:
    # They order GpuPodOperator's pods for the kube-scheduler; by value (100000) they would be urgent.
    priorities = PodPriorities(NoApi())
    assert priorities.resolve(pod("gpupool-training", 100000)) == ResolvedPriority(None)
    assert priorities.resolve(pod("gpupool-inference")) == ResolvedPriority(None)
