"""Gang placement: all or nothing, the fewest nodes first, then one topology domain."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from airflow_gpupool.placement import ClusterSnapshot, GpuState, NodeState, NoFit, get_policy
from airflow_gpupool.placement.gang import GangAssignment, hold_gang_nodes, members_that_fit, place_gang
from airflow_gpupool.placement.pools import PoolBinding, PoolBindings
from airflow_gpupool.resources import GangSpec, GpuKind, GpuRequest

ZONE = "topology.kubernetes.io/zone"


def node(
    name: str,
    free_gpus: int,
    gpus: int = 8,
    zone: str | None = None,
    rack: str | None = None,
    cpu: int = 64000,
    pool: str = "default",
    schedulable: bool = True,
) -> NodeState:
    labels = tuple(sorted((({ZONE: zone} if zone else {}) | ({"rack": rack} if rack else {})).items()))
    states = tuple(GpuState(i, "A100", 81920, free_milli=1000 if i < free_gpus else 0) for i in range(gpus))
    return NodeState(name, cpu, 262144, states, labels=labels, node_pool=pool, schedulable=schedulable)


def gang(members: int, gpus: int = 1, keys: tuple[str, ...] = (), **kw: object) -> GpuRequest:
    return GpuRequest(gpus=gpus, gang=GangSpec(members, members, keys), **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    nodes: tuple[NodeState, ...]
    request: GpuRequest
    expected: dict[str, int]  # members per node
    policy: str = "bestfit"


CASES = {
    "fits-one-node": Case((node("a", 2), node("b", 4), node("c", 2)), gang(4), {"b": 4}),
    "fewest-nodes-biggest-first": Case(
        (node("a", 1), node("b", 3), node("c", 1), node("d", 2)), gang(5), {"b": 3, "d": 2}
    ),
    "bestfit-picks-the-fullest-node-that-takes-the-rest": Case(
        (node("roomy", 8), node("snug", 2)), gang(2), {"snug": 2}
    ),
    "one-domain-wins-among-plans-of-as-many-nodes": Case(
        (node("a", 2, zone="x"), node("b", 2, zone="y"), node("c", 2, zone="y")),
        gang(4, keys=(ZONE,)),
        {"b": 2, "c": 2},
    ),
    "fewer-nodes-win-over-one-domain": Case(
        (node("a", 4, zone="x"), node("b", 2, zone="y"), node("c", 2, zone="y")),
        gang(4, keys=(ZONE,)),
        {"a": 4},
    ),
    "every-key-must-match": Case(
        (
            node("a", 2, zone="y", rack="r1"),
            node("b", 2, zone="y", rack="r2"),
            node("c", 2, zone="x", rack="r1"),
            node("d", 2, zone="x", rack="r1"),
        ),
        gang(4, keys=(ZONE, "rack")),
        {"c": 2, "d": 2},
    ),
    "no-keys-ignores-domains": Case(
        (node("a", 2, zone="x"), node("b", 2, zone="y"), node("c", 2, zone="y")), gang(4), {"a": 2, "b": 2}
    ),
    "preferred-nodes-first-among-nodes-that-take-as-many": Case(
        (node("a", 2, rack="r1"), node("b", 2, rack="r1"), node("c", 2, rack="r2"), node("d", 2, rack="r2")),
        gang(4, prefer_node_labels=(("rack", "r2"),)),
        {"c": 2, "d": 2},
    ),
    "a-preference-never-beats-fewer-nodes": Case(
        (node("a", 4, rack="r1"), node("b", 2, rack="r2"), node("c", 2, rack="r2")),
        gang(4, prefer_node_labels=(("rack", "r2"),)),
        {"a": 4},
    ),
    "multi-gpu-members": Case((node("a", 3), node("b", 4), node("c", 8)), gang(3, gpus=2), {"c": 3}),
    "cpu-bounds-members": Case(
        (node("a", 8, cpu=2000), node("b", 2)), gang(3, cpu_milli=1000), {"a": 2, "b": 1}
    ),
    "unschedulable-node-takes-none": Case(
        (node("a", 8, schedulable=False), node("b", 2), node("c", 2)), gang(4), {"b": 2, "c": 2}
    ),
    "gpupool-policy": Case((node("a", 2), node("b", 4)), gang(3), {"b": 3}, policy="gpupool"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_gang_placement(case: Case) -> None:
    assert case.request.gang is not None
    count = case.request.gang.members
    verdict = place_gang(ClusterSnapshot(case.nodes), case.request, count, get_policy(case.policy))
    assert isinstance(verdict, GangAssignment), verdict
    per_node: dict[str, int] = {}
    for a in verdict.members:
        per_node[a.node] = per_node.get(a.node, 0) + 1
    assert per_node == case.expected
    # No GPU is given to two members.
    taken = [(a.node, i) for a in verdict.members for i in a.gpu_indices]
    assert len(taken) == len(set(taken)) == len(verdict.members) * case.request.gpus
    assert verdict.nodes == tuple(dict.fromkeys(a.node for a in verdict.members))


def test_fractions_share_gpus_without_overfilling_them() -> None:
    nodes = ClusterSnapshot((node("a", 1), node("b", 2)))
    verdict = place_gang(nodes, GpuRequest(gpu_milli=500, gang=GangSpec(4, 4)), 4, get_policy("bestfit"))
    assert isinstance(verdict, GangAssignment)
    assert {a.node for a in verdict.members} == {"b"}
    assert sorted(a.gpu_indices[0] for a in verdict.members) == [0, 0, 1, 1]


def test_all_or_nothing_says_what_each_node_takes() -> None:
    nodes = ClusterSnapshot((node("a", 2), node("b", 1), node("full", 0), node("off", 8, schedulable=False)))
    verdict = place_gang(nodes, gang(4), 4, get_policy("bestfit"))
    assert isinstance(verdict, NoFit)
    text = [str(r) for r in verdict.reasons]
    assert text[:2] == ["a: takes 2 of the gang's 4 members", "b: takes 1 of the gang's 4 members"]
    assert any(r.startswith("full: needs 1 free GPUs") for r in text)
    assert any(r.startswith("off: node is not schedulable") for r in text)
    assert members_that_fit(nodes, GpuRequest(gpus=1), 4) == 3


def test_count_below_the_gang_places_the_minimum() -> None:
    nodes = ClusterSnapshot((node("a", 2), node("b", 1)))
    request = GpuRequest(gpus=1, gang=GangSpec(members=6, min_members=3))
    verdict = place_gang(nodes, request, 3, get_policy("bestfit"))
    assert isinstance(verdict, GangAssignment) and len(verdict.members) == 3
    assert isinstance(place_gang(nodes, request, 4, get_policy("bestfit")), NoFit)
    with pytest.raises(ValueError, match="at least one member"):
        place_gang(nodes, request, 0, get_policy("bestfit"))


def test_a_pool_whose_binding_cannot_express_the_member_takes_none() -> None:
    wholes_only = PoolBindings(
        None, {"whole": PoolBinding("whole", frozenset({GpuKind.WHOLE, GpuKind.NONE}))}
    )
    nodes = ClusterSnapshot((node("w", 8, pool="whole"), node("a", 1), node("b", 1)))
    request = GpuRequest(gpu_milli=500, gang=GangSpec(4, 4))
    verdict = place_gang(nodes, request, 4, get_policy("bestfit"), wholes_only)
    assert isinstance(verdict, GangAssignment)
    assert {a.node for a in verdict.members} == {"a", "b"}


def test_a_starving_gang_holds_the_closest_nodes_that_take_its_minimum() -> None:
    current = [
        node("busy", 0, gpus=4),
        node("half", 2, gpus=4),
        node("small", 1, gpus=1),
        node("near", 3, gpus=4),
    ]
    empty = [node(n.name, len(n.gpus), gpus=len(n.gpus)) for n in current]
    request = gang(6)
    assert hold_gang_nodes(current, empty, request, frozenset()) == ("small", "near", "half")
    assert hold_gang_nodes(current, empty, request, frozenset({"near"})) == ("small", "half", "busy")
    assert hold_gang_nodes(current, empty, request, frozenset({"near", "half"})) is None
