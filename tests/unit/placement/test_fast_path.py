"""The fast path (best choice per node kept per request shape) decides exactly as the reference scoring.

Random clusters evolve by random grants and releases; both paths see the same snapshots and
must return the same verdict every time: same node, GPUs, MIG slice, or both no fit.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from airflow_gpupool.placement import (
    Assignment,
    ClusterSnapshot,
    GpuState,
    NodeState,
    TypicalShape,
    get_policy,
)
from airflow_gpupool.placement.accounting import allocate, deallocate
from airflow_gpupool.placement.frag import shape_key, typical_shapes
from airflow_gpupool.placement.policy import policy_names
from airflow_gpupool.placement.verdict import NoFit
from airflow_gpupool.resources import GpuRequest, WorkloadClass

MODELS = ("A100", "T4", "G2")


def _cluster(rng: random.Random, size: int) -> list[NodeState]:
    nodes = []
    for i in range(size):
        model = rng.choice(MODELS)
        gpus = rng.choice((0, 1, 2, 4, 8))
        mig = model == "A100" and rng.random() < 0.2
        nodes.append(
            NodeState(
                f"n{i:03d}",
                rng.choice((16000, 32000, 64000, 96000)),
                rng.choice((65536, 262144)),
                tuple(
                    GpuState(
                        k,
                        model,
                        16384 if model == "T4" else 40960,
                        free_milli=0 if mig else 1000,
                        mig_free=((f"n{i}-g{k}-a", "1g.10gb"), (f"n{i}-g{k}-b", "3g.40gb")) if mig else (),
                        partitioned=mig,
                    )
                    for k in range(gpus)
                ),
                labels=(("zone", rng.choice("ab")),),
            )
        )
    return nodes


def _request(rng: random.Random) -> GpuRequest:
    cpu = rng.choice((500, 2000, 8000, 24000))
    memory = rng.choice((1024, 8192, 65536))
    pick = rng.random()
    extra: dict[str, object] = {}
    if rng.random() < 0.2:
        extra["gpu_models"] = frozenset(rng.sample(MODELS, rng.choice((1, 2))))
    if rng.random() < 0.1:
        extra["node_labels"] = (("zone", "a"),)
    if rng.random() < 0.2:
        extra["workload_class"] = rng.choice((WorkloadClass.TRAINING, WorkloadClass.INFERENCE))
    if pick < 0.15:
        return GpuRequest(cpu_milli=cpu, memory_mib=memory, **extra)  # type: ignore[arg-type]
    if pick < 0.55:
        milli = rng.choice((100, 250, 460, 500, 750))
        memory_gpu = rng.choice((None, 4096))
        return GpuRequest(
            cpu_milli=cpu, memory_mib=memory, gpu_milli=milli, gpu_memory_mib=memory_gpu, **extra
        )  # type: ignore[arg-type]
    if pick < 0.65:
        extra.pop("gpu_models", None)
        return GpuRequest(
            cpu_milli=cpu, memory_mib=memory, mig_profile=rng.choice(("1g.10gb", "3g.40gb")), **extra
        )  # type: ignore[arg-type]
    return GpuRequest(cpu_milli=cpu, memory_mib=memory, gpus=rng.choice((1, 1, 2, 4, 8)), **extra)  # type: ignore[arg-type]


def _replicated(rng: random.Random, kinds: int, copies: int) -> list[NodeState]:
    """Return ``copies`` nodes of each of ``kinds`` random nodes: many nodes in the same state."""
    base = _cluster(rng, kinds)
    return [
        replace(
            node,
            name=f"{node.name}-c{c}",
            gpus=tuple(
                replace(g, mig_free=tuple((f"{s}-c{c}", p) for s, p in g.mig_free)) for g in node.gpus
            ),
        )
        for c in range(copies)
        for node in base
    ]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("layout", ["random", "replicated"])
def test_fast_and_reference_decisions_are_identical_on_random_snapshots(seed: int, layout: str) -> None:
    rng = random.Random(seed)
    # Replicated: the fast path scores one node per state and copies its choice to the others.
    nodes = _cluster(rng, rng.choice((5, 40, 120))) if layout == "random" else _replicated(rng, 4, 50)
    requests = [_request(rng) for _ in range(60)]
    shapes = typical_shapes([shape_key(r) for r in requests]) if seed % 2 else None
    fast = get_policy("gpupool", seed=seed, typical_shapes=shapes, fast=True)
    slow = get_policy("gpupool", seed=seed, typical_shapes=shapes, fast=False)
    running: list[tuple[int, GpuRequest, Assignment]] = []
    placed = 0

    for step in range(400):
        snapshot = ClusterSnapshot(tuple(nodes))
        if running and rng.random() < 0.35:  # a release: capacity comes back on one node
            i, request, assignment = running.pop(rng.randrange(len(running)))
            nodes[i] = deallocate(nodes[i], request, assignment, nodes[i].classes)
            continue
        request = rng.choice(requests)
        reference = slow.place(snapshot, request)
        verdict = fast.place(snapshot, request)
        assert verdict == reference, f"step {step}: {request}"
        if isinstance(verdict, Assignment):
            i = next(k for k, n in enumerate(nodes) if n.name == verdict.node)
            nodes[i] = allocate(nodes[i], request, verdict)
            running.append((i, request, verdict))
            placed += 1

    assert placed > 20  # the run exercised real decisions, not only no-fits


def test_the_fast_path_follows_an_inventory_change() -> None:
    rng = random.Random(7)
    nodes = _cluster(rng, 30)
    fast = get_policy("gpupool", fast=True, typical_shapes=(TypicalShape(2000, 500, 1, frozenset(), 1.0),))
    slow = get_policy("gpupool", fast=False, typical_shapes=(TypicalShape(2000, 500, 1, frozenset(), 1.0),))
    request = GpuRequest(gpu_milli=500)
    assert fast.place(ClusterSnapshot(tuple(nodes)), request) == slow.place(
        ClusterSnapshot(tuple(nodes)), request
    )

    fewer = ClusterSnapshot(tuple(nodes[5:]))  # nodes left the inventory

    assert fast.place(fewer, request) == slow.place(fewer, request)


@pytest.mark.parametrize("request_", [GpuRequest(gpus=1), GpuRequest(gpus=0), GpuRequest(gpu_milli=250)])
def test_no_node_to_place_on_is_no_fit_not_an_error(request_: GpuRequest) -> None:
    # Every node skipped or held (a pass that avoids them all) leaves an empty snapshot.
    for name in policy_names():
        assert isinstance(get_policy(name).place(ClusterSnapshot(()), request_), NoFit), name
