"""The rule of the autoscale step: a waiting request asks for a node only when it fits no current node but an empty node of a scalable pool."""

from __future__ import annotations

import pytest

from airflow_gpupool.controller.autoscale.demand import ScaleUp, Waiting, scale_ups
from airflow_gpupool.controller.autoscale.pools import ScalablePool, empty_node
from airflow_gpupool.controller.autoscale.step import waiting_demand
from airflow_gpupool.ledger import Reservation, ReservationState
from airflow_gpupool.placement import ClusterSnapshot, GpuState, NodeState
from airflow_gpupool.placement.pools import PoolBinding, PoolBindings
from airflow_gpupool.resources import GangSpec, GpuKind, GpuRequest

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
BURST = ScalablePool("burst", A100, 8, 81920, cpu="96", memory="1024Gi")
H100_POOL = ScalablePool("h100", H100, 4, 81920, cpu="64", memory="512Gi")
MIG_POOL = ScalablePool("mig", A100, 1, 81920, mig=(("1g.10gb", 7),))


def node(
    name: str, gpus: int, free: int, model: str = A100, labels: dict[str, str] | None = None
) -> NodeState:
    """A node of ``gpus`` GPUs, ``free`` of them unallocated."""
    states = tuple(GpuState(i, model, 81920, free_milli=1000 if i < free else 0) for i in range(gpus))
    return NodeState(name, 96_000, 1_048_576, states, labels=tuple(sorted((labels or {}).items())))


def pools(*chosen: ScalablePool) -> list[tuple[ScalablePool, NodeState]]:
    return [(p, empty_node(p)) for p in chosen]


def keys(result: list[ScaleUp]) -> list[tuple[str, str, int, int]]:
    return [(s.key, s.pool.name, s.count, s.nodes) for s in result]


FULL = ClusterSnapshot((node("gpu-a-0", 8, 0),))

CASES = {
    "fits a current node: no scale-up": (
        ClusterSnapshot((node("gpu-a-0", 8, 4),)),
        [Waiting("r1", GpuRequest(gpus=4))],
        pools(BURST),
        [],
    ),
    "fits no node but an empty burst node": (
        FULL,
        [Waiting("r1", GpuRequest(gpus=4))],
        pools(BURST),
        [("r1", "burst", 1, 1)],
    ),
    "fits no pool: no scale-up": (FULL, [Waiting("r1", GpuRequest(gpus=16))], pools(BURST), []),
    "a model only another pool has": (
        FULL,
        [Waiting("r1", GpuRequest(gpus=2, gpu_models=frozenset({H100})))],
        pools(BURST, H100_POOL),
        [("r1", "h100", 1, 1)],
    ),
    "a node label no pool carries": (
        FULL,
        [Waiting("r1", GpuRequest(gpus=1, node_labels=(("zone", "b"),)))],
        pools(BURST),
        [],
    ),
    "the first pool that fits wins": (
        FULL,
        [Waiting("r1", GpuRequest(gpus=2))],
        pools(H100_POOL, BURST),
        [("r1", "h100", 1, 1)],
    ),
    "a MIG slice asks the MIG pool": (
        FULL,
        [Waiting("r1", GpuRequest(mig_profile="1g.10gb"))],
        pools(BURST, MIG_POOL),
        [("r1", "mig", 1, 1)],
    ),
    "two requests one new node holds: one scale-up": (
        FULL,
        [Waiting("r1", GpuRequest(gpus=4)), Waiting("r2", GpuRequest(gpus=4))],
        pools(BURST),
        [("r1", "burst", 1, 1)],
    ),
    "three that two nodes hold: two scale-ups": (
        FULL,
        [Waiting(f"r{i}", GpuRequest(gpus=4)) for i in range(3)],
        pools(BURST),
        [("r0", "burst", 1, 1), ("r2", "burst", 1, 1)],
    ),
    "a CPU request never asks for a GPU node": (
        ClusterSnapshot(()),
        [Waiting("r1", GpuRequest(cpu_milli=500_000))],
        pools(BURST),
        [],
    ),
    "a gang the cluster cannot hold asks once for all members": (
        FULL,
        [Waiting("g1", GpuRequest(gpus=4, gang=GangSpec(3, 3)), 3)],
        pools(BURST),
        [("g1", "burst", 3, 2)],
    ),
    "a gang the cluster holds now: no scale-up": (
        ClusterSnapshot((node("gpu-a-0", 8, 8),)),
        [Waiting("g1", GpuRequest(gpus=4, gang=GangSpec(2, 2)), 2)],
        pools(BURST),
        [],
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_scale_ups(case: str) -> None:
    cluster, waiting, chosen, expected = CASES[case]
    assert keys(scale_ups(cluster, waiting, chosen)) == expected


def test_a_pool_whose_binding_cannot_express_the_request_is_not_asked() -> None:
    whole_only = PoolBindings(pools={"burst": PoolBinding("whole", frozenset({GpuKind.WHOLE}))})
    fraction = [Waiting("r1", GpuRequest(gpu_milli=500))]
    assert scale_ups(FULL, fraction, pools(BURST), whole_only) == []
    assert keys(scale_ups(FULL, fraction, pools(BURST))) == [("r1", "burst", 1, 1)]


def test_the_empty_node_is_read_as_inventory_sync_reads_a_node() -> None:
    empty = empty_node(BURST)
    assert (len(empty.gpus), empty.node_pool, empty.cpu_free) == (8, "burst", 96_000)
    assert ("gpupool.io/capacity-type", "on-demand") in empty.labels
    assert ("gpupool.io/capacity-type", "spot") in empty_node(BURST, frozenset({"burst"})).labels
    (mig_gpu,) = empty_node(MIG_POOL).gpus
    assert mig_gpu.partitioned and len(mig_gpu.mig_free) == 7


def _reservation(rid: str, request: GpuRequest, gang_id: str | None = None) -> Reservation:
    return Reservation(rid, "h", ReservationState.WAITING, request, 0.0, 60.0, gang_id=gang_id)


def test_waiting_demand_keys_a_gang_by_its_leader_and_asks_its_minimum() -> None:
    elastic = GpuRequest(gpus=2, gang=GangSpec(4, 2))
    queue = [_reservation("g1", elastic, gang_id="g1"), _reservation("r1", GpuRequest(gpus=1))]
    assert waiting_demand(queue) == [Waiting("g1", elastic, 2), Waiting("r1", GpuRequest(gpus=1), 1)]
