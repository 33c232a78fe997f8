"""Fair queue order, headroom for urgent work, and the spot rules (pure)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.governance.capacity import (
    Capacity,
    CapacityType,
    capacity_type,
    default_capacity,
    fits_headroom,
    headroom_overcommit,
    is_urgent,
)
from airflow_gpupool.governance.fairness import FairShare
from airflow_gpupool.governance.quotas import Flavor, QuotaPlan, TeamQuota

A100 = Flavor("pool", "a100")


@dataclass(frozen=True)
class Waiting:
    name: str
    team: str
    priority: int
    created_at: float


def order(plan: QuotaPlan, held: dict[str, int], queue: list[Waiting], capacity: int = 8000) -> list[str]:
    return [w.name for w in FairShare(plan, held, capacity).order(queue)]  # type: ignore[attr-defined]


def test_within_a_priority_the_team_furthest_below_its_share_goes_first() -> None:
    plan = QuotaPlan((TeamQuota("a", A100, 4000), TeamQuota("b", A100, 2000)))
    queue = [Waiting("a1", "a", 0, 1.0), Waiting("b1", "b", 0, 2.0), Waiting("urgent", "a", 9, 3.0)]
    # a holds 2 of its 4 (0.5), b 2 of its 2 (1.0): a first; the urgent one before both.
    assert order(plan, {"a": 2000, "b": 2000}, queue) == ["urgent", "a1", "b1"]
    # b holds nothing: b first.
    assert order(plan, {"a": 2000}, queue) == ["urgent", "b1", "a1"]


def test_teams_without_quota_get_equal_shares_and_equal_teams_stay_fifo() -> None:
    queue = [Waiting("x1", "x", 0, 1.0), Waiting("y1", "y", 0, 2.0), Waiting("x2", "x", 0, 3.0)]
    assert order(QuotaPlan(), {}, queue) == ["x1", "y1", "x2"]
    assert order(QuotaPlan(), {"x": 4000, "y": 1000}, queue) == ["y1", "x1", "x2"]
    shares = FairShare(QuotaPlan(), {"x": 4000}, 8000).shares(["y"])
    assert shares == {"x": 4000.0, "y": 4000.0}


def test_a_team_with_a_zero_quota_holding_gpus_goes_last() -> None:
    plan = QuotaPlan((TeamQuota("zero", A100, 0), TeamQuota("a", A100, 1000)))
    queue = [Waiting("z", "zero", 0, 1.0), Waiting("a", "a", 0, 2.0)]
    assert order(plan, {"zero": 1000, "a": 1000}, queue) == ["a", "z"]


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({}, CapacityType.ON_DEMAND),
        ({"karpenter.sh/capacity-type": "spot"}, CapacityType.SPOT),
        ({"karpenter.sh/capacity-type": "on-demand"}, CapacityType.ON_DEMAND),
        ({"cloud.google.com/gke-spot": "true"}, CapacityType.SPOT),
        ({"eks.amazonaws.com/capacityType": "SPOT"}, CapacityType.SPOT),
        ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, CapacityType.ON_DEMAND),
    ],
)
def test_capacity_type_from_cloud_labels(labels: dict[str, str], expected: CapacityType) -> None:
    assert capacity_type(labels) is expected


@pytest.mark.parametrize(
    ("urgent", "checkpointed", "preemptible", "kind", "ratio", "seconds", "expected"),
    [
        pytest.param(True, True, True, "training", 0.1, 60, Capacity.ON_DEMAND, id="urgent-never-spot"),
        pytest.param(False, True, True, "training", 0.5, 1800, Capacity.SPOT, id="short-and-cheap"),
        pytest.param(False, True, True, "training", 0.5, 7200, Capacity.ANY, id="long-needs-cheaper"),
        pytest.param(False, True, True, "training", 0.3, 7200, Capacity.SPOT, id="long-and-cheap"),
        pytest.param(False, True, True, "training", 0.3, None, Capacity.SPOT, id="unknown-length-is-long"),
        pytest.param(False, False, True, "training", 0.1, 60, Capacity.ANY, id="no-checkpoints"),
        pytest.param(False, True, False, "training", 0.1, 60, Capacity.ANY, id="not-preemptible"),
        pytest.param(False, True, True, "batch", 0.1, 60, Capacity.ANY, id="not-training"),
        pytest.param(False, True, True, "training", None, 60, Capacity.ANY, id="no-price"),
    ],
)
def test_default_capacity(
    urgent: bool,
    checkpointed: bool,
    preemptible: bool,
    kind: str,
    ratio: float | None,
    seconds: float | None,
    expected: Capacity,
) -> None:
    chosen = default_capacity(
        urgent=urgent,
        checkpointed=checkpointed,
        preemptible=preemptible,
        workload_class=kind,
        price_ratio=ratio,
        expected_seconds=seconds,
    )
    assert chosen is expected


def test_headroom_is_kept_for_urgent_work() -> None:
    assert is_urgent(100, "training", urgent_priority=100) and is_urgent(0, "inference", urgent_priority=100)
    assert not is_urgent(99, "batch", urgent_priority=100)
    # 10 GPUs, 20 %: others may leave no fewer than 2 free.
    assert fits_headroom(10000, 3000, 1000, 0.2, urgent=False)
    assert not fits_headroom(10000, 2500, 1000, 0.2, urgent=False)
    assert fits_headroom(10000, 2500, 2500, 0.2, urgent=True)
    assert fits_headroom(10000, 1000, 1000, 0.0, urgent=False)  # 0 turns it off
    # A pool that lends its headroom lets preemptible work in; it must still fit.
    assert fits_headroom(10000, 2500, 1000, 0.2, urgent=False, lendable=True)
    assert not fits_headroom(10000, 500, 1000, 0.2, urgent=False, lendable=True)
    for bad in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(InvalidRequestError, match="headroom share"):
            fits_headroom(10000, 1000, 1000, bad, urgent=False)
    # Nominal quotas above the pool less its headroom promise non-urgent work what it cannot take.
    assert headroom_overcommit("a100", 8000, 10000, 0.2) is None  # exactly the 8 outside the headroom
    assert headroom_overcommit("a100", 10000, 10000, 0.0) is None  # no headroom: nothing kept
    assert headroom_overcommit("a100", 8500, 10000, 0.25) == (
        "pool a100: nominal quotas add up to 8.5 GPUs, above the 7.5 GPUs outside its 25% headroom:"
        " work that is not urgent may wait within its nominal"
    )
    assert Capacity.of("spot") is Capacity.SPOT
    with pytest.raises(InvalidRequestError, match="capacity"):
        Capacity.of("cheap")


@pytest.mark.parametrize(
    ("labels", "pool", "expected"),
    [
        pytest.param(
            {"gpupool.io/capacity-type": "on-demand", "karpenter.sh/capacity-type": "spot"},
            "p",
            CapacityType.ON_DEMAND,
            id="own-label-wins",
        ),
        pytest.param({"gpupool.io/capacity-type": "spot"}, "p", CapacityType.SPOT, id="own-label-spot"),
        pytest.param({}, "a100-spot", CapacityType.SPOT, id="configured-pool"),
        pytest.param({}, "a100", CapacityType.ON_DEMAND, id="other-pool"),
    ],
)
def test_capacity_type_from_the_nodes_own_label_and_configured_pools(
    labels: dict[str, str], pool: str, expected: CapacityType
) -> None:
    assert capacity_type(labels, node_pool=pool, spot_pools={"a100-spot"}) is expected


def test_with_capacity_type_stamps_the_label_once() -> None:
    from airflow_gpupool.governance.capacity import with_capacity_type
    from tests.ledger_fixtures import node

    spot = with_capacity_type(node("s", gpus=1, labels={"cloud.google.com/gke-spot": "true"}))
    assert dict(spot.labels) == {"cloud.google.com/gke-spot": "true", "gpupool.io/capacity-type": "spot"}
    assert with_capacity_type(spot) is spot
    assert dict(with_capacity_type(node("o", gpus=1)).labels) == {"gpupool.io/capacity-type": "on-demand"}
    assert dict(with_capacity_type(node("p", gpus=1, pool="cheap"), {"cheap"}).labels) == {
        "gpupool.io/capacity-type": "spot"
    }
