"""Every built-in policy on tiny clusters: feasibility rules, MIG, fractions, NoFit reasons."""

from __future__ import annotations

import pytest

from airflow_gpupool.placement import (
    DEFAULT_POLICY,
    Assignment,
    ClusterSnapshot,
    GpuState,
    NodeState,
    NoFit,
    TypicalShape,
    choices,
    get_policy,
    policy_names,
)
from airflow_gpupool.resources import GpuRequest, WorkloadClass

POLICIES = ["random", "dotprod", "clustering", "packing", "bestfit", "fgd", "fitness", "gpupool", "spread"]


def gpu(index: int, model: str = "A100", free: int = 1000, memory: int = 40960, **kw: object) -> GpuState:
    return GpuState(index, model, memory, free_milli=free, free_memory_mib=memory * free // 1000, **kw)  # type: ignore[arg-type]


def node(
    name: str, gpus: int = 0, model: str = "A100", free: tuple[int, ...] = (), cpu: int = 64000, **kw: object
) -> NodeState:
    frees = free or (1000,) * gpus
    return NodeState(name, cpu, 262144, tuple(gpu(i, model, f) for i, f in enumerate(frees)), **kw)  # type: ignore[arg-type]


def mig_node(name: str) -> NodeState:
    g = GpuState(
        0, "A100", 81920, free_milli=0, partitioned=True, mig_free=(("s0", "3g.40gb"), ("s1", "1g.10gb"))
    )
    return NodeState(name, 64000, 262144, (g,))


# (id, nodes, request, node it must land on (None: NoFit), GPU indices (None: any that fits))
CASES = [
    ("cpu-only", [node("n1")], GpuRequest(cpu_milli=2000), "n1", ()),
    ("whole-2-gpus", [node("a", free=(1000, 500)), node("b", gpus=2)], GpuRequest(gpus=2), "b", (0, 1)),
    (
        "fraction",
        [node("a", free=(300, 200)), node("b", free=(0, 600))],
        GpuRequest(gpu_milli=500),
        "b",
        (1,),
    ),
    (
        "fraction-gpu-memory",
        [NodeState("a", 64000, 262144, (GpuState(0, "T4", 15000),)), node("b", gpus=1)],
        GpuRequest(gpu_milli=250, gpu_memory_mib=20000),
        "b",
        (0,),
    ),
    ("mig-slice", [node("a", gpus=1), mig_node("m")], GpuRequest(mig_profile="1g.10gb"), "m", (0,)),
    (
        "model-constraint",
        [node("a", gpus=4), node("t", gpus=1, model="T4")],
        GpuRequest(gpus=1, gpu_models={"T4"}),
        "t",
        (0,),
    ),
    (
        "training-not-with-inference",
        [node("inf", gpus=2, classes=frozenset({"inference"})), node("free", gpus=1)],
        GpuRequest(gpus=1, workload_class=WorkloadClass.TRAINING),
        "free",
        (0,),
    ),
    (
        "node-labels",
        [node("a", gpus=1), node("b", gpus=1, labels=(("zone", "eu"),))],
        GpuRequest(gpus=1, node_labels={"zone": "eu"}),
        "b",
        (0,),
    ),
    ("unschedulable", [node("a", gpus=1, schedulable=False)], GpuRequest(gpus=1), None, None),
    ("too-many-gpus", [node("a", gpus=2), node("b", gpus=4)], GpuRequest(gpus=8), None, None),
]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    ("nodes", "request_", "where", "indices"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_policy_obeys_feasibility(policy, nodes, request_, where, indices):
    verdict = get_policy(policy, seed=1).place(ClusterSnapshot(tuple(nodes)), request_)
    if where is None:
        assert isinstance(verdict, NoFit)
        assert len(verdict.reasons) == len(nodes)
        assert list(verdict.reasons) == sorted(verdict.reasons)
        return
    assert isinstance(verdict, Assignment), verdict
    assert verdict.node == where
    if indices is not None:
        assert verdict.gpu_indices == indices
    # Whatever a policy picks is one of the ways fit.py says the request fits.
    options = choices(ClusterSnapshot(tuple(nodes)).node(where), request_)
    assert isinstance(options, list)
    assert (
        verdict.node,
        verdict.gpu_indices,
        verdict.milli_per_gpu,
        verdict.gpu_memory_mib,
        verdict.mig_slice,
    ) in {(o.node, o.gpu_indices, o.milli_per_gpu, o.gpu_memory_mib, o.mig_slice) for o in options}


def test_nofit_reasons_closest_first():
    nodes = (node("far", gpus=1), node("near", gpus=4, free=(1000, 1000, 1000, 0)))
    verdict = get_policy("gpupool").place(ClusterSnapshot(nodes), GpuRequest(gpus=4))
    assert isinstance(verdict, NoFit)
    assert [r.node for r in verdict.reasons] == ["near", "far"]
    assert "needs 4 free GPUs, 3 free of 4" in verdict.reasons[0].reason


FULLER = [node("empty", gpus=4), node("half", free=(1000, 1000, 0, 0))]
SHARED = [node("empty", gpus=2), node("shared", free=(400, 1000))]

# (id, policy, nodes, request, node chosen)
PREFERENCES = [
    ("bestfit-fuller-node", "bestfit", FULLER, GpuRequest(gpus=1), "half"),
    ("dotprod-least-aligned", "dotprod", FULLER, GpuRequest(gpus=1), "half"),
    ("packing-shared-gpu", "packing", SHARED, GpuRequest(gpu_milli=300), "shared"),
    ("clustering-same-kind", "clustering", SHARED, GpuRequest(gpu_milli=300), "shared"),
    (
        "spread-emptiest",
        "spread",
        [node("busy", gpus=1, cpu=64000, cpu_free=1000), node("idle", gpus=1)],
        GpuRequest(gpus=1),
        "idle",
    ),
    ("fitness-highest", "fitness", [node("a", gpus=1)], GpuRequest(gpu_milli=100), "a"),
]


@pytest.mark.parametrize(
    ("policy", "nodes", "request_", "where"), [c[1:] for c in PREFERENCES], ids=[c[0] for c in PREFERENCES]
)
def test_policy_preference(policy, nodes, request_, where):
    verdict = get_policy(policy, seed=3).place(ClusterSnapshot(tuple(nodes)), request_)
    assert isinstance(verdict, Assignment)
    assert verdict.node == where


EIGHT = (TypicalShape(8000, 1000, 8, frozenset(), 1.0),)


@pytest.mark.parametrize("policy", ["fgd", "gpupool"])
def test_fragmentation_policies_keep_whole_nodes_for_typical_shapes(policy):
    # One 8-GPU shape is typical: a 1-GPU task must not break the only empty 8-GPU node.
    nodes = (node("whole", gpus=8), node("broken", free=(1000,) * 4 + (0,) * 4))
    verdict = get_policy(policy, typical_shapes=EIGHT, seed=0).place(
        ClusterSnapshot(nodes), GpuRequest(gpus=1)
    )
    assert isinstance(verdict, Assignment) and verdict.node == "broken"


@pytest.mark.parametrize("policy", ["fgd", "gpupool"])
def test_fraction_goes_where_it_strands_least(policy):
    shapes = (TypicalShape(1000, 500, 1, frozenset(), 1.0),)
    nodes = (node("a", free=(700, 1000)),)
    verdict = get_policy(policy, typical_shapes=shapes).place(
        ClusterSnapshot(nodes), GpuRequest(gpu_milli=500)
    )
    # On GPU 0 the 200 left is a fragment for a 500 task; on GPU 1 the 500 left is not.
    assert isinstance(verdict, Assignment) and verdict.gpu_indices == (1,)


def test_ties_follow_seeded_node_order():
    nodes = tuple(node(f"n{i}", gpus=1) for i in range(16))
    snapshot = ClusterSnapshot(nodes)
    picks = {
        seed: get_policy("bestfit", seed=seed).place(snapshot, GpuRequest(gpus=1)).node for seed in range(6)
    }
    assert picks[0] == get_policy("bestfit", seed=0).place(snapshot, GpuRequest(gpus=1)).node
    assert len(set(picks.values())) > 1


def test_random_is_seeded():
    nodes = tuple(node(f"n{i}", gpus=2) for i in range(10))
    snapshot = ClusterSnapshot(nodes)
    first = [get_policy("random", seed=7).place(snapshot, GpuRequest(gpu_milli=100)) for _ in range(2)]
    assert first[0] == first[1]


def test_policy_follows_snapshot_changes():
    # The table is refreshed by node identity: a changed node must be re-read.
    policy = get_policy("gpupool")
    nodes = (node("a", gpus=1), node("b", gpus=1))
    first = policy.place(ClusterSnapshot(nodes), GpuRequest(gpus=1))
    assert isinstance(first, Assignment)
    used = tuple(node(n.name, free=(0,)) if n.name == first.node else n for n in nodes)
    second = policy.place(ClusterSnapshot(used), GpuRequest(gpus=1))
    assert isinstance(second, Assignment) and second.node != first.node
    assert isinstance(
        policy.place(ClusterSnapshot(tuple(node(n.name, free=(0,)) for n in nodes)), GpuRequest(gpus=1)),
        NoFit,
    )


def test_shapes_do_not_follow_the_requests_placed():
    # Issue 10: the shapes were learned per process, so two workers could score alike clusters differently.
    policy = get_policy(DEFAULT_POLICY)
    snapshot = ClusterSnapshot(tuple(node(f"n{i}", gpus=8) for i in range(4)))
    for _ in range(70):
        assert isinstance(policy.place(snapshot, GpuRequest(gpu_milli=250)), Assignment)
    assert {s.gpu_milli for s in policy.frag.shapes} == {250, 500, 750, 1000}


def test_registry():
    assert set(POLICIES) <= set(policy_names())
    assert DEFAULT_POLICY == "gpupool"
    with pytest.raises(ValueError, match="unknown placement policy"):
        get_policy("nope")
