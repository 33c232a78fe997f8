"""Fail-fast of a granted pod the scheduler cannot place: table tests on real client models."""

from __future__ import annotations

import pytest
from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import PodLaunchFailedException
from kubernetes.client import (
    V1Container,
    V1Node,
    V1NodeStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodCondition,
    V1PodSpec,
    V1PodStatus,
    V1ResourceRequirements,
)

from airflow_gpupool.operators.pod.unschedulable import UnschedulableWatch, never_fits, unschedulable_message

MESSAGE = "0/1 nodes are available: 1 Insufficient nvidia.com/gpucores."


def pod(*, unschedulable: bool = True, nominated: str | None = None, node_name: str | None = None) -> V1Pod:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "25", "cpu": "2"}
    conditions = [
        V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable", message=MESSAGE)
    ]
    return V1Pod(
        metadata=V1ObjectMeta(name="embed"),
        spec=V1PodSpec(
            containers=[V1Container(name="base", resources=V1ResourceRequirements(limits=limits))],
            node_name=node_name,
        ),
        status=V1PodStatus(
            phase="Pending", conditions=conditions if unschedulable else [], nominated_node_name=nominated
        ),
    )


def node(**allocatable: str) -> V1Node:
    return V1Node(metadata=V1ObjectMeta(name="t4-0"), status=V1NodeStatus(allocatable=allocatable))


HAMI = {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "30720", "nvidia.com/gpucores": "200"}


@pytest.mark.parametrize(
    ("the_node", "expected"),
    [
        pytest.param(node(**HAMI), None, id="fits-when-free"),
        pytest.param(
            node(**{"nvidia.com/gpu": "2"}),
            "node t4-0 advertises 0 nvidia.com/gpucores, the pod asks for 25",
            id="no-hami-resources",
        ),
        pytest.param(None, "its granted node is gone", id="node-gone"),
    ],
)
def test_never_fits(the_node: V1Node | None, expected: str | None) -> None:
    assert never_fits(pod(), the_node) == expected


def test_only_an_unschedulable_pending_pod_without_a_nomination_has_a_message() -> None:
    assert unschedulable_message(pod()) == MESSAGE
    assert unschedulable_message(pod(unschedulable=False)) is None
    assert unschedulable_message(pod(nominated="t4-0")) is None  # preemption under way: wait


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watch(pods: list[V1Pod], the_node: V1Node | None, clock: Clock) -> int:
    """Show ``pods`` to a watch one second apart (KPO's default check interval); return how many it saw."""
    judge = UnschedulableWatch(lambda: the_node, grace_seconds=30, clock=clock)
    for seen, read in enumerate(pods, start=1):
        judge.check(read)
        if read.spec.node_name:
            return seen
        clock.now += 1
    return len(pods)


def test_a_pod_that_can_never_fit_fails_at_the_first_look() -> None:
    clock = Clock()
    with pytest.raises(PodLaunchFailedException, match=r"Insufficient nvidia.com/gpucores.*advertises 0"):
        watch([pod()], node(**{"nvidia.com/gpu": "2"}), clock)
    assert clock.now == 0


def test_a_pod_that_may_fit_fails_after_the_grace() -> None:
    clock = Clock()
    with pytest.raises(PodLaunchFailedException, match="still unschedulable after 30 s"):
        watch([pod()] * 40, node(**HAMI), clock)
    assert clock.now == 30


def test_a_pod_scheduled_within_the_grace_is_left_to_start() -> None:
    clock = Clock()
    assert watch([pod(), pod(), pod(unschedulable=False, node_name="t4-0")], node(**HAMI), clock) == 3


def test_the_grace_starts_again_when_the_pod_was_schedulable_in_between() -> None:
    clock = Clock()
    pending = pod(unschedulable=False)
    # 29 s unschedulable, one read without the condition, then 29 s more: never 30 s in a row.
    assert (
        watch(
            [pod()] * 29 + [pending] + [pod()] * 29 + [pod(unschedulable=False, node_name="t4-0")],
            node(**HAMI),
            clock,
        )
        == 60
    )


def judged(pods: list[V1Pod], the_node: V1Node | None) -> UnschedulableWatch:
    """Show ``pods`` one second apart until the watch fails them; return the watch."""
    clock = Clock()
    judge = UnschedulableWatch(lambda: the_node, grace_seconds=30, clock=clock)
    with pytest.raises(PodLaunchFailedException):
        for read in pods:
            judge.check(read)
            clock.now += 1
    return judge


def with_message(message: str) -> V1Pod:
    unplaced = pod()
    unplaced.status.conditions[0].message = message
    return unplaced


@pytest.mark.parametrize(
    ("message", "books_wrong"),
    [
        pytest.param(MESSAGE, True, id="its-own-gpu-resource-held"),
        pytest.param("0/1 nodes are available: 1 Insufficient cpu.", False, id="cpu-short"),
        pytest.param("0/1 nodes are available: 1 node(s) had untolerated taint.", False, id="taint"),
    ],
)
def test_after_the_grace_only_a_held_gpu_resource_says_the_books_were_wrong(
    message: str, books_wrong: bool
) -> None:
    verdict = judged([with_message(message)] * 40, node(**HAMI)).verdict
    assert verdict is not None and verdict.books_wrong is books_wrong
    assert verdict.message == message and verdict.detail == "still unschedulable after 30 s"


def test_a_node_that_can_never_hold_the_pod_is_not_wrong_books() -> None:
    verdict = judged([pod()], node(**{"nvidia.com/gpu": "2"})).verdict
    assert verdict is not None and not verdict.books_wrong  # a resync cannot add a resource
