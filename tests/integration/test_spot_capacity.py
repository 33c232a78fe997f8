"""On-demand and spot capacity from the cluster's own labels, on SQLite and PostgreSQL ledgers.

Inventory sync reads the emulator's nodes over HTTP: one labelled spot by Karpenter, one in a
node pool configured as spot, one on-demand. The ledger keeps each with its
``gpupool.io/capacity-type`` label, and the requests ``GpuPodOperator`` builds for each
``capacity`` (and for the default rule) are placed accordingly.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_gpupool.governance.capacity import Capacity
from airflow_gpupool.inventory import sync_inventory
from airflow_gpupool.inventory.sync import core_v1_api
from airflow_gpupool.labels import CAPACITY_TYPE_LABEL
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.operators.capacity import with_capacity
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node

GRANTED, WAITING = ReservationState.GRANTED, ReservationState.WAITING


@pytest.fixture(scope="module")
def cluster() -> Iterator[KubernetesEmulatorServer]:
    nodes = [
        gpu_node("od-0", gpus=2, pool="a100"),
        gpu_node("karpenter-0", gpus=2, pool="a100-burst", labels={"karpenter.sh/capacity-type": "spot"}),
        gpu_node("cheap-0", gpus=2, pool="a100-cheap"),
    ]
    with KubernetesEmulatorServer(nodes=nodes) as server:
        yield server


@pytest.fixture
def pool(
    ledger_url: str, cluster: KubernetesEmulatorServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Ledger]:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__SPOT_NODE_POOLS", "a100-cheap")
    with Ledger.create(ledger_url) as ledger:
        first = sync_inventory(ledger, core_v1_api(cluster.kubeconfig_path))
        assert sorted(first.added) == ["cheap-0", "karpenter-0", "od-0"]
        yield ledger


def capacity_of(ledger: Ledger) -> dict[str, str]:
    return {n.name: dict(n.labels)[CAPACITY_TYPE_LABEL] for n in ledger.snapshot().nodes}


def reserve(
    ledger: Ledger, rid: str, request: GpuRequest, capacity: Capacity | None
) -> tuple[ReservationState, str]:
    placed = with_capacity(request, capacity, checkpointed=True, expected_seconds=1800)
    reservation = ledger.reserve(placed, rid, reservation_id=rid)
    return reservation.state, reservation.grant.node if reservation.grant else ""


def test_sync_labels_each_node_spot_or_on_demand_and_a_second_sync_changes_nothing(
    pool: Ledger, cluster: KubernetesEmulatorServer
) -> None:
    assert capacity_of(pool) == {"od-0": "on-demand", "karpenter-0": "spot", "cheap-0": "spot"}
    again = sync_inventory(pool, core_v1_api(cluster.kubeconfig_path))
    assert (again.added, again.updated) == ((), ())


def test_a_task_that_names_its_capacity_runs_only_there(pool: Ledger) -> None:
    assert reserve(pool, "od", GpuRequest(gpus=2), Capacity.ON_DEMAND) == (GRANTED, "od-0")
    assert reserve(pool, "od-more", GpuRequest(gpus=1), Capacity.ON_DEMAND)[0] is WAITING  # spot is free
    assert "gpupool.io/capacity-type=on-demand" in pool.explain("od-more")
    assert reserve(pool, "spot", GpuRequest(gpus=1), Capacity.SPOT)[1] in {"karpenter-0", "cheap-0"}
    assert reserve(pool, "any", GpuRequest(gpus=1), Capacity.ANY)[0] is GRANTED


def test_urgent_work_waits_for_on_demand_rather_than_run_on_spot(pool: Ledger) -> None:
    assert reserve(pool, "fill", GpuRequest(gpus=2), Capacity.ON_DEMAND) == (GRANTED, "od-0")
    assert reserve(pool, "urgent", GpuRequest(gpus=1, priority=100), None)[0] is WAITING
    pool.release("fill")
    assert pool.get("urgent").state is GRANTED and pool.get("urgent").grant.node == "od-0"  # type: ignore[union-attr]


def test_cheap_spot_is_preferred_by_checkpointed_preemptible_training_and_never_required(
    pool: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__SPOT_PRICE_RATIO", "0.3")
    training = GpuRequest(gpus=2, workload_class="training", preemptible=True)  # type: ignore[arg-type]
    placed = {reserve(pool, f"t{i}", training, None)[1] for i in range(3)}
    assert placed == {"karpenter-0", "cheap-0", "od-0"}  # both spot nodes first, then on-demand
    assert pool.get("t0").grant.node != "od-0" and pool.get("t1").grant.node != "od-0"  # type: ignore[union-attr]
