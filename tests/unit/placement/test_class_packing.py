"""The default policy keeps each exclusive class together: inference joins the inference node, training avoids it.

Training and inference never share a node, so a policy that spread inference tests over both
nodes of a small pool would lock 2-GPU training out of both (the three-teams scenario,
benchmarks/README.md "Class packing"). The default policy's fit tie-break already sends a
request to the node its class holds; these cases pin that, on the fast path and the reference.
"""

from __future__ import annotations

import pytest

from airflow_gpupool.placement import (
    DEFAULT_POLICY,
    Assignment,
    ClusterSnapshot,
    GpuState,
    NodeState,
    get_policy,
)
from airflow_gpupool.resources import GpuRequest, WorkloadClass

INFERENCE = frozenset({WorkloadClass.INFERENCE.value})
TRAINING = frozenset({WorkloadClass.TRAINING.value})


def node(
    name: str,
    gpus: int = 4,
    model: str = "A100",
    free: tuple[int, ...] = (),
    classes: frozenset[str] = frozenset(),
) -> NodeState:
    frees = free or (1000,) * gpus
    return NodeState(
        name,
        64000,
        262144,
        tuple(
            GpuState(i, model, 40960, free_milli=f, free_memory_mib=40960 * f // 1000)
            for i, f in enumerate(frees)
        ),
        classes=classes,
    )


def inference(gpu_milli: int | None = None, gpus: int = 0) -> GpuRequest:
    """Return a request of class inference (a test of half a GPU by default)."""
    return GpuRequest(
        gpus=gpus, gpu_milli=gpu_milli or (None if gpus else 500), workload_class=WorkloadClass.INFERENCE
    )


def training(gpus: int = 2) -> GpuRequest:
    return GpuRequest(gpus=gpus, workload_class=WorkloadClass.TRAINING)


# (id, nodes, request, node it must land on)
CASES = [
    (
        "inference joins the inference node",
        [node("n1", free=(500, 1000, 1000, 1000), classes=INFERENCE), node("n2")],
        inference(),
        "n1",
    ),
    (
        "inference joins the inference node listed second",
        [node("n1"), node("n2", free=(500, 1000, 1000, 1000), classes=INFERENCE)],
        inference(),
        "n2",
    ),
    (
        "inference joins a fuller inference node",
        [node("n1", free=(500, 0, 0, 1000), classes=INFERENCE), node("n2")],
        inference(),
        "n1",
    ),
    (
        "a whole-GPU inference request joins the inference node",
        [node("n1", free=(500, 1000, 1000, 1000), classes=INFERENCE), node("n2")],
        inference(gpus=1),
        "n1",
    ),
    (
        "training avoids the inference node",
        [node("n1", free=(500, 1000, 1000, 1000), classes=INFERENCE), node("n2")],
        training(),
        "n2",
    ),
    (
        "training joins the training node",
        [node("n1"), node("n2", free=(0, 0, 1000, 1000), classes=TRAINING)],
        training(),
        "n2",
    ),
    (
        "inference avoids the training node",
        [node("n1", free=(0, 0, 1000, 1000), classes=TRAINING), node("n2")],
        inference(),
        "n2",
    ),
]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])
@pytest.mark.parametrize(("nodes", "request_", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_default_policy_keeps_classes_together(
    nodes: list[NodeState], request_: GpuRequest, expected: str, fast: bool
) -> None:
    for seed in (0, 1, 2, 3):  # the seeded node order breaks ties: no seed may decide these
        verdict = get_policy(DEFAULT_POLICY, seed=seed, fast=fast).place(
            ClusterSnapshot(tuple(nodes)), request_
        )
        assert isinstance(verdict, Assignment), verdict
        assert verdict.node == expected, f"seed {seed}"
