"""The replay on pure inputs: never on the current nodes, no nodes, no time in the past."""

from __future__ import annotations

from airflow_gpupool.forecast.durations import RemainingTime
from airflow_gpupool.forecast.replay import NEVER, Running, Waiting, forecast_starts
from airflow_gpupool.placement.accounting import allocate
from airflow_gpupool.placement.policy import get_policy
from airflow_gpupool.placement.snapshot import ClusterSnapshot, GpuState, NodeState
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.sim.replay import quick

NOW = 1_000.0


def node(name: str, gpus: int) -> NodeState:
    return NodeState(name, 64000, 262144, tuple(GpuState(i, "A100", 81920, 1000, 81920) for i in range(gpus)))


def fixed(seconds: float) -> RemainingTime:
    return RemainingTime("task", (seconds,) * 3, 3600.0)


def test_fixed_durations_and_never() -> None:
    empty = [node("n1", gpus=1)]
    one = GpuRequest(gpus=1)
    verdict = quick(get_policy("bestfit"))(ClusterSnapshot(tuple(empty)), one)
    assert isinstance(verdict, Assignment)
    busy = [allocate(empty[0], one, verdict)]
    waiting = [
        Waiting("a", one, fixed(60)),
        Waiting("big", GpuRequest(gpus=2), fixed(60)),  # no node could ever hold it
        Waiting("b", one, fixed(60)),
    ]
    out = forecast_starts(
        NOW, busy, empty, [Running("r", one, verdict, fixed(30))], waiting, quick(get_policy("bestfit")), 8
    )
    by_id = {f.reservation_id: f for f in out}
    assert (by_id["a"].status, by_id["a"].p10, by_id["a"].p90) == ("forecast", NOW + 30, NOW + 30)
    assert (by_id["b"].p50, by_id["b"].position) == (NOW + 90, 3)
    assert (by_id["big"].status, by_id["big"].p50, by_id["big"].reason) == ("never", None, NEVER)


def test_no_nodes_is_unknown_with_the_reason() -> None:
    out = forecast_starts(NOW, [], [], [], [Waiting("a", GpuRequest(gpus=1), fixed(60))], lambda *a: None, 8)
    assert [(f.status, f.reason, f.p50) for f in out] == [("unknown", "no GPU nodes", None)]


def test_starts_never_lie_in_the_past() -> None:
    empty = [node("n1", gpus=1)]
    out = forecast_starts(
        NOW, empty, empty, [], [Waiting("a", GpuRequest(gpus=1), fixed(60))], quick(get_policy("bestfit")), 8
    )
    assert out[0].p10 == NOW  # it fits now: it starts now, not before
