"""The replay on pure inputs: never on the current nodes, no nodes, no time in the past."""

from __future__ import annotations

import warnings

import numpy as np

from airflow_gpupool.forecast.durations import RemainingTime
from airflow_gpupool.forecast.replay import NEVER, Running, Waiting, forecast_starts, start_quantiles
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


def test_a_request_past_the_overtake_bound_lets_nothing_pass_in_the_replay() -> None:
    empty = [node("n1", gpus=2)]
    one = GpuRequest(gpus=1)
    place = quick(get_policy("bestfit"))
    verdict = place(ClusterSnapshot(tuple(empty)), one)
    assert isinstance(verdict, Assignment)
    busy = [allocate(empty[0], one, verdict)]
    running = [Running("r", one, verdict, fixed(30))]

    def starts(head_overtakes: int) -> dict[str, float | None]:
        waiting = [
            Waiting("head", GpuRequest(gpus=2), fixed(60), head_overtakes),
            Waiting("small", one, fixed(60)),
        ]
        return {
            f.reservation_id: f.p50 for f in forecast_starts(NOW, busy, empty, running, waiting, place, 8)
        }

    # Below the bound the small request backfills the free GPU at once; at it, it waits its turn.
    assert starts(0) == {"head": NOW + 60, "small": NOW}  # the head then waits for the small one
    assert starts(8) == {"head": NOW + 30, "small": NOW + 90}


def test_start_quantiles_beside_replays_that_never_started_are_never_nan() -> None:
    inf = np.inf
    # Column 0: started in half the replays; column 1: in one of four; column 2: in none.
    starts = np.array([[1.0, inf, inf], [2.0, inf, inf], [inf, inf, inf], [inf, 5.0, inf]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value encountered" on the way
        q = start_quantiles(starts)
    assert not np.isnan(q).any()
    assert q[:, 0].tolist() == [1.3, 2.0, inf]  # p50 at the lower neighbour, the start itself
    assert q[:, 1].tolist() == [inf, inf, inf] and q[:, 2].tolist() == [inf, inf, inf]
