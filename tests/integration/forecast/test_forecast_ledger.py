"""The forecast on a hand-made queue whose answer is known exactly, on SQLite and PostgreSQL."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from airflow_gpupool.forecast.calibration import MIN_SCORED
from airflow_gpupool.forecast.step import Forecaster, compute_forecasts, refresh_forecasts
from airflow_gpupool.governance import Flavor, QuotaPlan, TeamQuota
from airflow_gpupool.ledger import Ledger, LedgerForecasts, LedgerQuotas, StartForecast
from airflow_gpupool.resources import GangSpec, GpuRequest
from airflow_gpupool.task_try import TaskTry
from tests.ledger_fixtures import FakeClock, node

RUN_S = 600.0


def _try(run: int) -> TaskTry:
    return TaskTry("train", "fit", f"scheduled__{run}", -1, 1, "w")


@pytest.fixture
def queued(make_ledger: Callable[..., Ledger], clock: FakeClock) -> tuple[Ledger, list[str]]:
    """One GPU; train/fit ran three times for exactly 600 s; one run 100 s in; two more waiting."""
    ledger = make_ledger()
    ledger.upsert_nodes([node("n1", gpus=1)])
    for run in range(3):
        task = _try(run)
        reservation = ledger.reserve(GpuRequest(gpus=1), task.holder, reservation_id=task.reservation_id)
        clock.advance(RUN_S)
        ledger.release(reservation.id)
    ledger.reserve(GpuRequest(gpus=1), _try(3).holder, reservation_id=_try(3).reservation_id)
    clock.advance(100)
    waiting = [
        ledger.reserve(GpuRequest(gpus=1), _try(run).holder, reservation_id=_try(run).reservation_id).id
        for run in (4, 5)
    ]
    return ledger, waiting


def test_fixed_durations_give_exact_starts(queued: tuple[Ledger, list[str]], clock: FakeClock) -> None:
    ledger, (first, second) = queued
    assert refresh_forecasts(ledger) == 2
    stored = LedgerForecasts(ledger).get_many()
    now = clock.now
    # The running try ends 500 s from now; the first waiting one then runs 600 s.
    assert stored[first] == StartForecast(
        first, now, "forecast", now + 500, now + 500, now + 500, 1, 2, stored[first].reason
    )
    assert (stored[second].p10, stored[second].p50, stored[second].p90) == (now + 1100,) * 3
    assert (stored[second].position, stored[second].queue_length) == (2, 2)
    assert "later arrivals ignored" in stored[second].reason


def test_a_new_pass_replaces_the_old_one(queued: tuple[Ledger, list[str]], clock: FakeClock) -> None:
    ledger, (first, second) = queued
    forecaster = Forecaster(ledger)
    assert forecaster() == 2
    assert forecaster() is None  # nothing changed, nothing due: no replay
    ledger.release(ledger.get(first).id)  # withdrawn: no longer waiting
    assert forecaster() == 1
    assert set(LedgerForecasts(ledger).get_many()) == {second}


def test_while_nothing_waits_no_pass_runs(queued: tuple[Ledger, list[str]], clock: FakeClock) -> None:
    ledger, waiting = queued
    forecaster = Forecaster(ledger)
    assert forecaster() == 2
    for rid in waiting:
        ledger.release(rid)  # withdrawn: nothing waits
    assert forecaster() == 0  # one pass clears the stored forecasts
    assert LedgerForecasts(ledger).get_many() == {}
    ledger.release(_try(3).reservation_id)  # the grants change, and a new one comes
    ledger.reserve(GpuRequest(gpus=1), _try(6).holder, reservation_id=_try(6).reservation_id)
    clock.advance(60)
    assert forecaster() is None  # still nothing waits: no pass
    later = ledger.reserve(GpuRequest(gpus=1), _try(7).holder, reservation_id=_try(7).reservation_id)
    assert forecaster() == 1 and set(LedgerForecasts(ledger).get_many()) == {later.id}


def test_a_forecast_that_came_due_is_recomputed(queued: tuple[Ledger, list[str]], clock: FakeClock) -> None:
    ledger, (first, _) = queued
    forecaster = Forecaster(ledger)
    forecaster()
    clock.advance(501)  # the running try overran its history: the stored start is now in the past
    assert forecaster() == 2
    stored = LedgerForecasts(ledger).get(first)
    assert stored is not None and stored.p10 is not None and stored.p10 >= clock.now


def test_only_the_head_of_the_queue_is_forecast(queued: tuple[Ledger, list[str]], clock: FakeClock) -> None:
    ledger, (first, second) = queued
    by_id = {f.reservation_id: f for f in compute_forecasts(ledger, ledger.snapshot(), max_waiting=1)}
    assert by_id[first].status == "forecast" and by_id[first].p50 == clock.now + 500
    assert (by_id[second].status, by_id[second].reason) == (
        "unknown",
        "only the first 1 waiting requests are forecast",
    )


def test_a_waiting_gang_says_unknown_and_singles_are_still_forecast(
    make_ledger: Callable[..., Ledger], clock: FakeClock
) -> None:
    ledger = make_ledger()
    ledger.upsert_nodes([node("n1", gpus=1), node("n2", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "holder-1")
    ledger.reserve(GpuRequest(gpus=1), "holder-2")
    gang = ledger.reserve(GpuRequest(gpus=1, gang=GangSpec(2, 2)), "gang", reservation_id="g1")
    single = ledger.reserve(GpuRequest(gpus=1), "single", reservation_id="s1")
    refresh_forecasts(ledger)
    stored = LedgerForecasts(ledger).get_many()
    assert (stored[gang.id].status, stored[gang.id].reason) == ("unknown", "gangs are not forecast yet")
    assert stored[single.id].status == "forecast"  # the replay ran without the gang


def test_a_head_past_its_overtake_budget_lets_nothing_pass_in_the_forecast(
    make_ledger: Callable[..., Ledger], clock: FakeClock
) -> None:
    """The replay starts each request with the overtakes the ledger counted, as the queue rule does."""
    ledger = make_ledger(max_overtakes=1)
    ledger.upsert_nodes([node("n1", gpus=2)])
    for run in range(3):  # train/fit's history: exactly 600 s a run
        task = _try(run)
        ledger.reserve(GpuRequest(gpus=1), task.holder, reservation_id=task.reservation_id)
        clock.advance(RUN_S)
        ledger.release(task.reservation_id)
    running, head, passer, small = (_try(run) for run in (3, 4, 5, 6))
    ledger.reserve(GpuRequest(gpus=1), running.holder, reservation_id=running.reservation_id)
    ledger.reserve(GpuRequest(gpus=2), head.holder, reservation_id=head.reservation_id)
    ledger.reserve(GpuRequest(gpus=1), passer.holder, reservation_id=passer.reservation_id)  # passes the head
    waiting_small = ledger.reserve(GpuRequest(gpus=1), small.holder, reservation_id=small.reservation_id)
    clock.advance(100)
    ledger.release(passer.reservation_id)  # a GPU frees; the head's budget is spent: nothing passes it
    assert ledger.get(waiting_small.id).state.value == "waiting"
    assert ledger.snapshot().queue[0].overtakes == 1

    by_id = {f.reservation_id: f for f in compute_forecasts(ledger, ledger.snapshot())}
    now = clock.now
    # The running try ends in 500 s; the head takes both GPUs for 600 s; the small one starts after it.
    assert by_id[head.reservation_id].p50 == now + 500
    assert by_id[small.reservation_id].p50 == now + 1100, "the small request may not backfill past the head"


def test_under_quotas_the_forecast_serves_the_queue_as_the_ledger_does(
    make_ledger: Callable[..., Ledger], clock: FakeClock
) -> None:
    """Two teams of one GPU each: a request its team's quota refuses waits past a free GPU."""
    ledger = make_ledger()
    ledger.upsert_nodes([node("n1", gpus=2)])
    for run in range(3):  # every try runs exactly 600 s
        task = _try(run)
        ledger.reserve(GpuRequest(gpus=1), task.holder, reservation_id=task.reservation_id)
        clock.advance(RUN_S)
        ledger.release(task.reservation_id)
    pool = Flavor("pool", "default")
    LedgerQuotas(ledger).apply(QuotaPlan((TeamQuota("a", pool, 1000), TeamQuota("b", pool, 1000))))

    def ask(run: int, team: str) -> str:
        task = _try(run)
        return ledger.reserve(
            GpuRequest(gpus=1, team=team), task.holder, reservation_id=task.reservation_id
        ).id

    b_running = ask(3, "b")
    clock.advance(300)
    ask(4, "a")
    clock.advance(100)  # b's try ends in 200 s, a's in 500 s
    a_waiting, b_waiting = ask(5, "a"), ask(6, "b")  # a's first in the queue
    by_id = {f.reservation_id: f for f in compute_forecasts(ledger, ledger.snapshot())}
    now = clock.now
    # When b's try ends, team a still holds its quota: b's waiting request takes the GPU, a's waits for a's.
    assert (by_id[b_waiting].p50, by_id[a_waiting].p50) == (now + 200, now + 500)

    clock.advance(200)
    ledger.release(b_running)  # the ledger agrees
    assert (ledger.get(b_waiting).state.value, ledger.get(a_waiting).state.value) == ("granted", "waiting")


def _history(ledger: Ledger, clock: FakeClock) -> None:
    """train/fit's history: three runs of exactly 600 s."""
    for run in range(3):
        task = _try(run)
        ledger.reserve(GpuRequest(gpus=1), task.holder, reservation_id=task.reservation_id)
        clock.advance(RUN_S)
        ledger.release(task.reservation_id)


def _one_gpu_with_preemption(make_ledger: Callable[..., Ledger], clock: FakeClock) -> Ledger:
    """One GPU, a 60 s minimum runtime and a 120 s grace, and train/fit's history."""
    ledger = make_ledger(min_runtime_seconds=60, preemption_grace_seconds=120)
    ledger.upsert_nodes([node("n1", gpus=1)])
    _history(ledger, clock)
    return ledger


def _forecast_of(ledger: Ledger, reservation_id: str) -> StartForecast:
    return {f.reservation_id: f for f in compute_forecasts(ledger, ledger.snapshot())}[reservation_id]


def test_the_forecast_preempts_a_grant_once_it_comes_of_age(
    make_ledger: Callable[..., Ledger], clock: FakeClock
) -> None:
    """A preemptible grant 10 s old is no victim yet (min runtime 60 s); the ledger takes it at 60 s, so does the replay."""
    ledger = _one_gpu_with_preemption(make_ledger, clock)
    victim, urgent = _try(3), _try(4)
    ledger.reserve(GpuRequest(gpus=1, preemptible=True), victim.holder, reservation_id=victim.reservation_id)
    granted = clock.now
    clock.advance(10)
    ledger.reserve(GpuRequest(gpus=1, priority=10), urgent.holder, reservation_id=urgent.reservation_id)
    assert ledger.get(victim.reservation_id).preempt_deadline is None, "too young: not a victim yet"

    forecast = _forecast_of(ledger, urgent.reservation_id)
    # Without preemption it would start when the victim's run ends, 600 s after its grant. With it:
    # once the victim is 60 s old, within its 120 s grace.
    assert forecast.p10 is not None and forecast.p90 is not None
    assert granted + 60 <= forecast.p10 <= forecast.p90 <= granted + 180
    assert "preemption replayed" in forecast.reason

    clock.advance(50)
    ledger.reserve(GpuRequest(gpus=0), _try(9).holder)  # any write runs a pass: the ledger preempts now
    assert ledger.get(victim.reservation_id).preempt_deadline == granted + 60 + 120


def test_a_victim_told_to_end_passes_its_slice_on_by_its_deadline(
    make_ledger: Callable[..., Ledger], clock: FakeClock
) -> None:
    """The ledger has preempted: the preemptor's forecast is the victim's deadline, not its run's end."""
    ledger = _one_gpu_with_preemption(make_ledger, clock)
    victim, urgent = _try(3), _try(4)
    ledger.reserve(GpuRequest(gpus=1, preemptible=True), victim.holder, reservation_id=victim.reservation_id)
    clock.advance(100)
    ledger.reserve(GpuRequest(gpus=1, priority=10), urgent.holder, reservation_id=urgent.reservation_id)
    deadline = ledger.get(victim.reservation_id).preempt_deadline
    assert deadline == clock.now + 120
    clock.advance(30)
    forecast = _forecast_of(ledger, urgent.reservation_id)
    assert (forecast.p10, forecast.p50, forecast.p90) == (deadline,) * 3


def test_victims_exits_are_read_and_a_replayed_victim_ends_as_they_did(
    make_ledger: Callable[..., Ledger], clock: FakeClock
) -> None:
    """Three victims took 30 s each to end once told: a victim in the replay takes 30 s too."""
    ledger = _one_gpu_with_preemption(make_ledger, clock)
    for run in range(3):
        victim, urgent = _try(10 + 2 * run), _try(11 + 2 * run)
        ledger.reserve(
            GpuRequest(gpus=1, preemptible=True), victim.holder, reservation_id=victim.reservation_id
        )
        clock.advance(100)
        ledger.reserve(GpuRequest(gpus=1, priority=10), urgent.holder, reservation_id=urgent.reservation_id)
        clock.advance(30)
        ledger.release(victim.reservation_id)  # its pod ended 30 s after it was told
        assert ledger.get(victim.reservation_id).state.value == "preempted"
        assert ledger.get(urgent.reservation_id).state.value == "granted"
        clock.advance(RUN_S)
        ledger.release(urgent.reservation_id)
    assert LedgerForecasts(ledger).victim_exits(120) == [30.0, 30.0, 30.0]

    victim, urgent = _try(20), _try(21)
    ledger.reserve(GpuRequest(gpus=1, preemptible=True), victim.holder, reservation_id=victim.reservation_id)
    granted = clock.now
    clock.advance(10)  # too young to be a victim: the replay takes it at 60 s, and it ends 30 s later
    ledger.reserve(GpuRequest(gpus=1, priority=10), urgent.holder, reservation_id=urgent.reservation_id)
    forecast = _forecast_of(ledger, urgent.reservation_id)
    assert (forecast.p10, forecast.p50, forecast.p90) == (granted + 90,) * 3


def test_a_start_scores_the_forecasts_made_for_it(queued: tuple[Ledger, list[str]], clock: FakeClock) -> None:
    ledger, (first, _) = queued
    forecaster = Forecaster(ledger)
    forecaster()  # first: 500 s from now, exactly (fixed durations)
    clock.advance(300)
    ledger.release(_try(3).reservation_id)  # the running try ends early: first starts 200 s before p10
    assert ledger.get(first).grant is not None
    forecaster()
    assert forecaster.calibration.scored == 1
    assert forecaster.calibration.all.lower[0] == pytest.approx(math.log1p(500 / 60) - math.log1p(300 / 60))
    assert forecaster.calibration.all.upper[0] == pytest.approx(math.log1p(300 / 60) - math.log1p(500 / 60))


def test_the_stored_range_is_widened_by_the_scores(
    queued: tuple[Ledger, list[str]], clock: FakeClock
) -> None:
    ledger, (first, _) = queued
    forecaster = Forecaster(ledger)
    # Twenty earlier starts, each 0.5 (log-wait) before its p10 at worst and 0.7 past its p90.
    forecaster.calibration.all.lower.extend([0.5] * MIN_SCORED)
    forecaster.calibration.all.upper.extend([0.7] * MIN_SCORED)
    forecaster()
    stored = LedgerForecasts(ledger).get(first)
    now = clock.now
    assert stored is not None and stored.p50 == now + 500  # the replay's median, untouched
    assert stored.p10 == pytest.approx(now + 60 * math.expm1(math.log1p(500 / 60) - 0.5))
    assert stored.p90 == pytest.approx(now + 60 * math.expm1(math.log1p(500 / 60) + 0.7))
    assert stored.reason.endswith("; its range calibrated on how 20 earlier forecasts turned out")
