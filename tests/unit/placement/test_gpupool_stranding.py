"""``gpupool``'s stranded-capacity term on tiny clusters: CPU goes where it strands the least GPU."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_gpupool.placement import (
    Assignment,
    ClusterSnapshot,
    GpuState,
    NodeState,
    TypicalShape,
    get_policy,
)
from airflow_gpupool.placement.fgd import GpuPoolPolicy, cpu_per_gpu_milli
from airflow_gpupool.placement.scored import find_candidates
from airflow_gpupool.resources import GpuRequest

#: One GPU shape asking 10 cores per GPU: r = 10 CPU milli per GPU milli.
SHAPES = (TypicalShape(10000, 1000, 1, frozenset(), 1.0),)


def node(name: str, cpu_free: int, gpus: int = 4, free: tuple[int, ...] = (), cpu: int = 64000) -> NodeState:
    frees = free or (1000,) * gpus
    return NodeState(
        name,
        cpu,
        262144,
        tuple(GpuState(i, "A100", 40960, free_milli=f) for i, f in enumerate(frees)),
        cpu_free=cpu_free,
    )


# (id, nodes, request, node the default gpupool picks whatever the tie-break seed)
CASES = [
    (
        # 4 free GPUs need 40 cores; "dense" has exactly 40, "spare" 64: 8 cores on "dense" strand 800 milli.
        "cpu-only-goes-where-cpu-is-spare",
        [node("dense", 40000), node("spare", 64000)],
        GpuRequest(cpu_milli=8000),
        "spare",
    ),
    (
        # A node with no free GPU strands nothing whatever CPU it loses.
        "cpu-only-prefers-node-without-free-gpus",
        [node("busy", 20000, free=(0, 0, 0, 0)), node("dense", 40000)],
        GpuRequest(cpu_milli=8000),
        "busy",
    ),
    (
        # A CPU-heavy 1-GPU pod (30 cores) strands 2 GPUs on "dense", none on "spare".
        "cpu-heavy-gpu-pod-goes-where-cpu-is-spare",
        [node("dense", 40000), node("spare", 200000, cpu=200000)],
        GpuRequest(gpus=1, cpu_milli=30000),
        "spare",
    ),
    (
        # A CPU-light 1-GPU pod strands nothing anywhere: the fuller node wins the band.
        "cpu-light-gpu-pod-best-fit",
        [node("full", 40000, free=(1000, 1000, 0, 0)), node("empty", 64000)],
        GpuRequest(gpus=1, cpu_milli=1000),
        "full",
    ),
]


@pytest.mark.parametrize(("nodes", "request_", "where"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_gpupool_strands_least_gpu_capacity(nodes, request_, where, seed):
    verdict = get_policy("gpupool", typical_shapes=SHAPES, seed=seed).place(
        ClusterSnapshot(tuple(nodes)), request_
    )
    assert isinstance(verdict, Assignment), verdict
    assert verdict.node == where


def test_without_the_term_cpu_only_pods_tie_like_fgd():
    # Neither node's fragmentation changes (the one shape still fits both), so FGD's band ties
    # and only the fit tie-break (fuller CPU first) decides: the wrong node.
    nodes = (node("dense", 40000), node("spare", 64000))
    verdict = get_policy("gpupool", typical_shapes=SHAPES, strand_weight=0.0).place(
        ClusterSnapshot(nodes), GpuRequest(cpu_milli=8000)
    )
    assert isinstance(verdict, Assignment)
    assert verdict.node == "dense"


@pytest.mark.parametrize(
    ("cpu_free", "free", "request_", "growth"),
    [
        (40000, (1000,) * 4, GpuRequest(cpu_milli=8000), 800.0),  # 8 cores feed 800 milli
        (64000, (1000,) * 4, GpuRequest(cpu_milli=8000), 0.0),  # 56 cores left still feed 4 GPUs
        (30000, (1000,) * 4, GpuRequest(cpu_milli=8000), 800.0),  # already short: every core strands more
        (40000, (1000,) * 4, GpuRequest(gpus=1, cpu_milli=10000), 0.0),  # takes a GPU with its own CPU
        (40000, (1000,) * 4, GpuRequest(gpus=1, cpu_milli=30000), 2000.0),  # 30 cores for 1 GPU strand 2
        (20000, (0, 0, 0, 0), GpuRequest(cpu_milli=8000), 0.0),  # no free GPU: nothing to strand
    ],
)
def test_stranded_growth(cpu_free, free, request_, growth):
    policy = get_policy("gpupool", typical_shapes=SHAPES)
    assert isinstance(policy, GpuPoolPolicy)
    policy.sync(ClusterSnapshot((node("n", cpu_free, free=free),)))
    cand = find_candidates(policy.table, request_)
    assert np.allclose(policy.stranded_growth(cand), growth)


def test_cpu_per_gpu_milli_by_frequency():
    shapes = (
        TypicalShape(10000, 1000, 1, frozenset(), 3.0),
        TypicalShape(4000, 500, 1, frozenset(), 1.0),
        TypicalShape(8000, 0, 0, frozenset(), 10.0),  # CPU-only: ignored
    )
    assert cpu_per_gpu_milli(shapes) == pytest.approx((3 * 10000 + 4000) / (3 * 1000 + 500))
    assert cpu_per_gpu_milli(shapes[2:]) == 0.0
