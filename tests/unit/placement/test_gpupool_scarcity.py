"""``gpupool``'s scarcity term: work that fits anywhere keeps off the nodes only some work can use."""

from __future__ import annotations

import numpy as np

from airflow_gpupool.placement import (
    Assignment,
    ClusterSnapshot,
    GpuState,
    NodeState,
    TypicalShape,
    get_policy,
)
from airflow_gpupool.placement.fgd import GpuPoolPolicy
from airflow_gpupool.resources import GpuRequest


def node(name: str, model: str, gpus: int = 4, cpu: int = 40000) -> NodeState:
    return NodeState(name, cpu, 262144, tuple(GpuState(i, model, 16384) for i in range(gpus)))


#: Half the work is a quarter of a T4 (only the T4 node has them); half a quarter GPU of any model.
SHAPES = (
    TypicalShape(2000, 250, 1, frozenset({"T4"}), 0.5),
    TypicalShape(2000, 250, 1, frozenset(), 0.5),
)
CLUSTER = ClusterSnapshot(tuple([node("t4", "T4"), *(node(f"g{i}", "G2") for i in range(3))]))
#: CPU-only work that leaves any node too little CPU for all its GPUs (8 CPU milli per GPU milli).
ANYWHERE = GpuRequest(cpu_milli=16000)


def _pick(seed: int, **options: float) -> str:
    verdict = get_policy("gpupool", typical_shapes=SHAPES, seed=seed, **options).place(CLUSTER, ANYWHERE)
    assert isinstance(verdict, Assignment)
    return verdict.node


def test_the_pressure_marks_the_nodes_constrained_work_needs() -> None:
    policy = get_policy("gpupool", typical_shapes=SHAPES, seed=1)
    assert isinstance(policy, GpuPoolPolicy)
    policy.sync(CLUSTER)

    assert policy.node_pressure().tolist() == [1.0, 0.0, 0.0, 0.0]


def test_work_that_fits_anywhere_keeps_off_the_needed_node() -> None:
    # It grows no node's fragmentation and strands as much GPU on each node, so without the
    # term the seeded node order decides and some seeds pick the T4 node.
    blind = {_pick(seed, scarce_weight=0) for seed in range(12)}
    scarce = {_pick(seed) for seed in range(12)}

    assert "t4" in blind
    assert "t4" not in scarce


def test_constrained_work_still_goes_to_the_needed_node() -> None:
    verdict = get_policy("gpupool", typical_shapes=SHAPES).place(
        CLUSTER, GpuRequest(gpus=1, gpu_models=frozenset({"T4"}))
    )
    assert isinstance(verdict, Assignment) and verdict.node == "t4"


def test_shapes_that_fit_everywhere_add_no_pressure() -> None:
    policy = get_policy("gpupool", typical_shapes=(TypicalShape(2000, 250, 1, frozenset(), 1.0),))
    assert isinstance(policy, GpuPoolPolicy)
    policy.sync(CLUSTER)
    assert np.all(policy.node_pressure() == 0)


#: Three 8-GPU nodes with 96 cores and one with 128: only that one hosts 8 GPUs with 120 cores,
#: a request too rare to be among the typical shapes (all 1-GPU here).
BIG = ClusterSnapshot(
    tuple(
        [node("big", "G3", gpus=8, cpu=128000), *(node(f"g{i}", "G2", gpus=8, cpu=96000) for i in range(3))]
    )
)
ONE_GPU = (TypicalShape(12000, 1000, 1, frozenset(), 1.0),)


def _pick_big(seed: int, **options: float) -> str:
    request = GpuRequest(gpus=1, cpu_milli=16000)
    verdict = get_policy("gpupool", typical_shapes=ONE_GPU, seed=seed, **options).place(BIG, request)
    assert isinstance(verdict, Assignment)
    return verdict.node


def test_the_only_node_for_a_whole_node_request_is_kept_for_it() -> None:
    # CPU-heavy 1-GPU work strands nothing on the CPU-rich node, so the typical shapes alone send it there.
    blind = {_pick_big(seed, whole_node_weight=0) for seed in range(12)}
    kept = {_pick_big(seed) for seed in range(12)}

    assert "big" in blind
    assert "big" not in kept


def test_the_whole_node_pressure_marks_the_biggest_kind_of_node() -> None:
    policy = get_policy("gpupool", typical_shapes=ONE_GPU)
    assert isinstance(policy, GpuPoolPolicy)
    policy.sync(BIG)

    assert policy.node_pressure().tolist() == [1.0, 0.0, 0.0, 0.0]
