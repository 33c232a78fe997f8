"""How long a task's recent successful runs held their slice: what the spot rule takes as its run's length."""

from __future__ import annotations

from collections.abc import Callable

from airflow_gpupool.ledger import Ledger, LedgerHistory, TaskAttempt, TaskAttempts
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.task_try import TaskTry
from tests.ledger_fixtures import FakeClock, node


def run(ledger: Ledger, clock: FakeClock, task: TaskTry, seconds: float) -> str:
    """Reserve for ``task``, hold ``seconds``, release; return the reservation id."""
    reservation = ledger.reserve(GpuRequest(gpus=1), task.holder, reservation_id=task.reservation_id)
    clock.advance(seconds)
    ledger.release(reservation.id)
    return reservation.id


def test_the_median_of_the_newest_successful_runs(
    make_ledger: Callable[..., Ledger], clock: FakeClock
) -> None:
    ledger = make_ledger()
    ledger.upsert_nodes([node("n1", gpus=1)])
    history = LedgerHistory(ledger)
    assert history.typical_run_seconds("retrain", "fit") is None  # no run yet

    for day, seconds in enumerate([9000, 100, 300, 200, 250, 400], 1):
        run(ledger, clock, TaskTry("retrain", "fit", f"scheduled__{day}", -1, 1, "w"), seconds)
    failed = run(ledger, clock, TaskTry("retrain", "fit", "scheduled__7", -1, 1, "w"), 5)
    TaskAttempts(ledger).record(
        TaskAttempt(
            "retrain/fit/scheduled__7/map--1", 1, failed, "evicted", "retry", GpuRequest(gpus=1), "evicted"
        )
    )
    run(ledger, clock, TaskTry("retrain", "fit-other", "scheduled__8", -1, 1, "w"), 7)  # another task
    run(ledger, clock, TaskTry("retrain-other", "fit", "scheduled__9", -1, 1, "w"), 11)  # another DAG

    # The five newest successful runs of retrain/fit: 100, 300, 200, 250, 400 (the 9000 s one is older).
    assert history.typical_run_seconds("retrain", "fit") == (250.0, 5)
    assert history.typical_run_seconds("retrain", "fit", runs=2) == (325.0, 2)
