"""``Ledger.explain`` names the first dimension that does not fit, in the documented order.

Table-driven: each case builds a small inventory, takes some grants, then asks why one more
request waits, and checks the reason given for the node each case is about, as a user reads it
(``gpupool ledger explain``, the UI, a timed-out task's message). The order is documented in
:mod:`airflow_gpupool.placement.fit`: health, workload class, binding, GPU model, MIG
availability, GPU milli, GPU memory, CPU, memory, held for a starving request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest, NodeHealth, NodeInventory, WorkloadClass
from tests.ledger_fixtures import node

T4 = {"model": "T4", "memory_mib": 15360}
SLICE = GpuRequest(gpu_milli=250, gpu_memory_mib=4096)


@dataclass
class Case:
    """One dimension: the inventory, the grants taken first, the request that waits, the reason."""

    nodes: list[NodeInventory]
    taken: list[GpuRequest]
    waiting: GpuRequest
    reason: str
    options: dict[str, object] = field(default_factory=dict)
    cordon: str | None = None


CASES = {
    # An idle node that is cordoned still comes first in nothing: health is checked first.
    "health": Case(
        [node("n1", gpus=1, cpu=500)],
        [GpuRequest(gpus=1, cpu_milli=100)],
        GpuRequest(gpus=1, cpu_milli=100),
        "n1: node is not schedulable (cordoned)",
        cordon="n1",
    ),
    "workload class": Case(
        [node("n1", gpus=2)],
        [GpuRequest(gpus=1, workload_class=WorkloadClass.TRAINING)],
        GpuRequest(gpus=2, workload_class=WorkloadClass.INFERENCE, cpu_milli=64_000),
        "n1: node runs training work, which inference may not share",
    ),
    # The binding is named before the GPUs, the CPU and the memory that are also short.
    "binding": Case(
        [node("n1", gpus=1, pool="a100", cpu=2000), node("t4", gpus=1, pool="t4", **T4)],  # type: ignore[arg-type]
        [SLICE, SLICE, SLICE],
        GpuRequest(gpu_milli=250, gpu_memory_mib=4096, cpu_milli=4000),
        "n1: binding 'whole' on pool a100 cannot express a fraction",
        options={"binding": "whole", "node_pool_bindings": {"t4": "hami"}},
    ),
    "GPU model": Case(
        [node("n1", gpus=1, cpu=4000), node("h1", gpus=1, model="H100")],
        [
            GpuRequest(gpus=1, gpu_models=frozenset({"A100"})),
            GpuRequest(gpus=1, gpu_models=frozenset({"H100"})),
        ],
        GpuRequest(gpus=1, gpu_models=frozenset({"H100"}), cpu_milli=4000),
        "n1: needs GPU model H100, node has A100",
    ),
    "MIG availability": Case(
        [node("n1", gpus=1, mig={0: ["1g.10gb"]}), node("plain", gpus=8)],
        [GpuRequest(mig_profile="1g.10gb")],
        GpuRequest(mig_profile="1g.10gb"),
        "n1: no free MIG slice 1g.10gb",
    ),
    "GPU milli": Case(
        [node("n1", gpus=1, cpu=4000)],
        [GpuRequest(gpu_milli=900)],
        GpuRequest(gpu_milli=250, cpu_milli=4000),
        "n1: needs 250 milli-GPU on one GPU, the freest GPU has 100",
    ),
    # The T4: three 250-milli / 4096-MiB slices leave 250 milli but only 3 GiB.
    "GPU memory": Case(
        [node("t4", gpus=1, **T4)],  # type: ignore[arg-type]
        [SLICE, SLICE, SLICE],
        SLICE,
        "t4: needs 4096 MiB GPU memory on one GPU with 250 milli-GPU free, the most such a GPU has is 3072 MiB",
    ),
    "CPU": Case(
        [node("n1", gpus=2, cpu=4000, mem=8192)],
        [GpuRequest(gpus=1, cpu_milli=3000, memory_mib=6144)],
        GpuRequest(gpus=1, cpu_milli=2000, memory_mib=4096),
        "n1: needs 2000m CPU, 1000m free",
    ),
    "memory": Case(
        [node("n1", gpus=2, mem=8192)],
        [GpuRequest(gpus=1, memory_mib=6144)],
        GpuRequest(gpus=1, memory_mib=4096),
        "n1: needs 4096 MiB memory, 2048 MiB free",
    ),
    # A 2-GPU request starves (no overtakes allowed): the queue holds n1 for it, so a
    # 1-GPU request that would fit n1's free GPU waits, and says why.
    "held for a starving request": Case(
        [node("n1", gpus=2)],
        [GpuRequest(gpus=1), GpuRequest(gpus=2)],
        GpuRequest(gpus=1),
        "n1: held for starving request r1 (it fits once released)",
        options={"max_overtakes": 0},
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_explain_names_the_first_dimension_that_does_not_fit(
    make_ledger: Callable[..., Ledger], case: Case
) -> None:
    ledger = make_ledger(**case.options)
    ledger.upsert_nodes(case.nodes)
    for i, request in enumerate(case.taken):
        ledger.reserve(request, f"h{i}", reservation_id=f"r{i}", timeout=3600)
    if case.cordon:
        ledger.set_health(case.cordon, NodeHealth.CORDONED)

    waiting = ledger.reserve(case.waiting, "asker", reservation_id="asker", timeout=3600)

    assert waiting.state is ReservationState.WAITING
    why = ledger.explain(waiting.id)
    closest = why.split("closest: ", 1)[1].split("; ")
    assert case.reason in closest, why


def test_nodes_without_mig_are_not_close_to_a_mig_request(make_ledger: Callable[..., Ledger]) -> None:
    ledger = make_ledger()
    ledger.upsert_nodes(
        [
            node("a-plain", gpus=8),
            node("b-plain", gpus=8),
            node("c-plain", gpus=8),
            node("mig", gpus=1, mig={0: ["1g.10gb"]}),
        ]
    )
    ledger.reserve(GpuRequest(mig_profile="1g.10gb"), "h")

    waiting = ledger.reserve(GpuRequest(mig_profile="1g.10gb"), "asker", timeout=3600)

    why = ledger.explain(waiting.id)
    closest = why.split("closest: ", 1)[1].split("; ")
    assert closest[0] == "mig: no free MIG slice 1g.10gb"
    assert all(part.endswith("node has no MIG-partitioned GPU") for part in closest[1:3]), why


def test_a_request_that_fits_but_waits_its_turn_says_so(make_ledger: Callable[..., Ledger]) -> None:
    ledger = make_ledger(max_overtakes=0)
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.reserve(GpuRequest(gpus=1), "h")
    ledger.reserve(GpuRequest(gpus=2), "big", reservation_id="big", timeout=3600)

    small = ledger.reserve(GpuRequest(gpus=1), "small", timeout=3600)

    assert small.state is ReservationState.WAITING
    assert "1 request(s) ahead" in ledger.explain(small.id)
