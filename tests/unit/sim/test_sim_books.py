"""The simulator keeps its books with the ledger's accounting: what a grant takes, a departure gives back."""

from __future__ import annotations

import pytest

from airflow_gpupool.placement import GpuState, NodeState, get_policy
from airflow_gpupool.placement.accounting import allocate, deallocate
from airflow_gpupool.placement.frag import DEFAULT_SHAPES
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.sim.queue import QueueSim
from airflow_gpupool.sim.replay import quick


def gpus(n: int, model: str = "A100", memory: int = 40960) -> tuple[GpuState, ...]:
    return tuple(GpuState(i, model, memory) for i in range(n))


MIG = NodeState(
    "m",
    64000,
    262144,
    (
        GpuState(
            0, "A100", 81920, free_milli=0, partitioned=True, mig_free=(("s0", "3g.40gb"), ("s1", "1g.10gb"))
        ),
    ),
)

# (id, node, request)
CASES = [
    ("cpu-only", NodeState("n", 64000, 262144), GpuRequest(cpu_milli=2000, memory_mib=1024)),
    ("whole", NodeState("n", 64000, 262144, gpus(2)), GpuRequest(gpus=2, cpu_milli=4000)),
    (
        "whole-mixed-memory",
        NodeState("n", 64000, 262144, (*gpus(1), GpuState(1, "A100", 81920))),
        GpuRequest(gpus=2),
    ),
    ("fraction", NodeState("n", 64000, 262144, gpus(1, "T4", 15109)), GpuRequest(gpu_milli=333)),
    (
        "fraction-memory",
        NodeState("n", 64000, 262144, gpus(1)),
        GpuRequest(gpu_milli=250, gpu_memory_mib=30000),
    ),
    ("mig-slice", MIG, GpuRequest(mig_profile="1g.10gb")),
    ("training", NodeState("n", 64000, 262144, gpus(1)), GpuRequest(gpus=1, workload_class="training")),
    (
        "inference",
        NodeState("n", 64000, 262144, gpus(1)),
        GpuRequest(gpu_milli=500, workload_class="inference"),
    ),
]


@pytest.mark.parametrize(("node", "request_"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_queue_books_are_the_ledgers(node: NodeState, request_: GpuRequest) -> None:
    sim = QueueSim([node], quick(get_policy("gpupool", typical_shapes=DEFAULT_SHAPES)), DEFAULT_SHAPES, 8)
    sim.arrive(0, request_, 0.0, request_.total_gpu_milli)
    assert sim.serve(0.0) == [0]
    _, assignment, _ = sim.running[0]
    assert sim.nodes[0] == allocate(node, request_, assignment)
    sim.depart(0)
    # Given back in full: the MIG slice, the GPU memory and the exclusive class too.
    assert sim.nodes[0] == deallocate(
        allocate(node, request_, assignment), request_, assignment, node.classes
    )
    assert sim.nodes[0] == node


def test_a_class_leaves_a_node_with_its_last_task() -> None:
    node = NodeState("n", 64000, 262144, gpus(1))
    training = GpuRequest(gpu_milli=250, workload_class="training")
    sim = QueueSim([node], quick(get_policy("gpupool", typical_shapes=DEFAULT_SHAPES)), DEFAULT_SHAPES, 8)
    for k in range(2):
        sim.arrive(k, training, 0.0, 250)
    assert sim.serve(0.0) == [0, 1]
    sim.depart(0)
    assert sim.nodes[0].classes == {"training"}
    sim.depart(1)
    assert sim.nodes[0].classes == frozenset()
