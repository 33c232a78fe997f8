"""The reason a waiting request gives names what really blocks it, on SQLite and PostgreSQL.

One row per dimension a user meets (issue 38 item 4): GPU model, MIG (a partitioned GPU of the
right model, and a MIG node with no free slice), GPU memory, GPU milli, workload class, the
team's quota, the pool's headroom, spot against on-demand, a quarantined node and a quarantined GPU. Each row
builds its situation in a real ledger (nodes, quota file, grants, health) and asserts the text
``Ledger.explain`` gives, which is also what a timed-out task's message and the UI show. A busy
node that would fit keeps each request waiting (not refused as never placeable), so the text is
the one a waiting user reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import yaml

from airflow_gpupool.governance.quotas import parse_quota_file
from airflow_gpupool.labels import CAPACITY_TYPE_LABEL
from airflow_gpupool.ledger import Ledger, LedgerQuotas, ReservationState
from airflow_gpupool.resources import GpuRequest, NodeHealth, NodeInventory, WorkloadClass
from tests.ledger_fixtures import node

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
BOTH = frozenset({A100, H100})
SPOT = {CAPACITY_TYPE_LABEL: "spot"}
ON_DEMAND = ((CAPACITY_TYPE_LABEL, "on-demand"),)
#: Team ``ml`` may hold 1 GPU of pool ``a100`` and borrows nothing (no cohort).
ONE_GPU_QUOTA = """
headroom: {share: 0}
teams:
  - name: ml
    quotas: [{flavor: {pool: a100}, nominal: 1}]
"""
#: 25 % of pool ``a100`` kept for urgent work; team ``ml`` may borrow all of it from ``serving``.
HEADROOM_QUOTA = """
headroom: {share: 0.25, urgent_priority: 100}
teams:
  - name: ml
    cohort: shared
    quotas: [{flavor: {pool: a100}, nominal: 1}]
  - name: serving
    cohort: shared
    quotas: [{flavor: {pool: a100}, nominal: 4}]
"""


@dataclass
class Row:
    """A situation: the inventory, a quota file, the grants taken first, a node's health, the asker."""

    nodes: list[NodeInventory]
    waiting: GpuRequest
    reason: str
    taken: list[GpuRequest] = field(default_factory=list)
    quotas: str | None = None
    health: tuple[str, NodeHealth] | None = None
    gpu_health: tuple[str, str, NodeHealth] | None = None


ROWS = {
    "GPU model": Row(
        [node("h1", gpus=1, model=H100), node("busy", gpus=1, model=A100)],
        GpuRequest(gpus=1, gpu_models=frozenset({A100})),
        f"h1: needs GPU model {A100}, node has {H100}",
        taken=[GpuRequest(gpus=1)],
    ),
    # The case: the model matches, the GPU is partitioned; the reason says MIG, not the model.
    "MIG-partitioned GPU": Row(
        [node("gpu-mig", gpus=1, model=A100, mig={0: ["1g.10gb"] * 7}), node("busy", gpus=1, model=A100)],
        GpuRequest(gpus=1, gpu_models=BOTH),
        f"gpu-mig: node's {A100} GPUs are MIG-partitioned: only a MIG profile (mig_profile) can use them",
        taken=[GpuRequest(gpus=1)],
    ),
    "MIG slice": Row(
        [node("gpu-mig", gpus=1, model=A100, mig={0: ["3g.40gb"]})],
        GpuRequest(mig_profile="3g.40gb"),
        "gpu-mig: no free MIG slice 3g.40gb",
        taken=[GpuRequest(mig_profile="3g.40gb")],
    ),
    "GPU memory": Row(
        [node("t4", gpus=1, model="Tesla-T4", memory_mib=15360)],
        GpuRequest(gpu_milli=250, gpu_memory_mib=8192),
        "t4: needs 8192 MiB GPU memory on one GPU with 250 milli-GPU free, the most such a GPU has is 7168 MiB",
        taken=[GpuRequest(gpu_milli=500, gpu_memory_mib=8192)],
    ),
    "GPU milli": Row(
        [node("n1", gpus=1)],
        GpuRequest(gpu_milli=500),
        "n1: needs 500 milli-GPU on one GPU, the freest GPU has 300",
        taken=[GpuRequest(gpu_milli=700)],
    ),
    "workload class": Row(
        [node("n1", gpus=2)],
        GpuRequest(gpus=1, workload_class=WorkloadClass.INFERENCE),
        "n1: node runs training work, which inference may not share",
        taken=[GpuRequest(gpus=1, workload_class=WorkloadClass.TRAINING)],
    ),
    "quota": Row(
        [node("a1", gpus=4, pool="a100")],
        GpuRequest(gpus=1, team="ml"),
        "team ml is at its quota on pool:a100 (1/1 GPUs), it is in no cohort to borrow from",
        taken=[GpuRequest(gpus=1, team="ml")],
        quotas=ONE_GPU_QUOTA,
    ),
    "headroom": Row(
        [node("a1", gpus=4, pool="a100")],
        GpuRequest(gpus=1, team="ml"),
        "pool a100 keeps 25% of its GPUs for urgent work (priority >= 100 or inference): 3 of 4 GPUs held",
        taken=[GpuRequest(gpus=3, team="ml")],
        quotas=HEADROOM_QUOTA,
    ),
    "spot": Row(
        [node("spot-1", gpus=1, labels=SPOT), node("busy", gpus=1)],
        GpuRequest(gpus=1, node_labels=ON_DEMAND),
        f"spot-1: node is spot capacity, the request needs on-demand ({CAPACITY_TYPE_LABEL}=on-demand)",
        taken=[GpuRequest(gpus=1, node_labels=ON_DEMAND)],
    ),
    "quarantine": Row(
        [node("n1", gpus=1)],
        GpuRequest(gpus=1),
        "n1: node is not schedulable (quarantined)",
        health=("n1", NodeHealth.QUARANTINED),
    ),
    # A quarantined GPU is kept from placement as if partitioned: the reason says quarantined, not MIG.
    "quarantined GPU": Row(
        [node("n1", gpus=1, model=A100), node("busy", gpus=1, model=A100)],
        GpuRequest(gpus=1),
        f"n1: node's {A100} GPU(s) 0 are quarantined",
        taken=[GpuRequest(gpus=1)],
        gpu_health=("n1", "0", NodeHealth.QUARANTINED),
    ),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_the_reason_names_the_real_blocker(make_ledger: Callable[..., Ledger], row: Row) -> None:
    ledger = make_ledger()
    ledger.upsert_nodes(row.nodes)
    if row.quotas is not None:
        LedgerQuotas(ledger).apply(parse_quota_file(yaml.safe_load(row.quotas)))
    for i, request in enumerate(row.taken):
        assert ledger.reserve(request, f"h{i}", reservation_id=f"r{i}", ttl=3600).grant is not None
    if row.health is not None:
        ledger.set_health(*row.health)
    if row.gpu_health is not None:
        ledger.set_gpu_health(*row.gpu_health)

    waiting = ledger.reserve(row.waiting, "asker", reservation_id="asker", timeout=3600)

    assert waiting.state is ReservationState.WAITING
    why = ledger.explain(waiting.id)
    assert row.reason in why, why
