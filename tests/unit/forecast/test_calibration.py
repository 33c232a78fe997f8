"""The calibration widens the replay's range by how earlier forecasts turned out."""

from __future__ import annotations

import math

import numpy as np
import pytest

from airflow_gpupool.forecast.calibration import MIN_SCORED, PER_REQUEST, Calibration
from airflow_gpupool.ledger import StartForecast


def _forecast(rid: str, now: float, p10: float, p50: float, p90: float) -> StartForecast:
    return StartForecast(rid, now, "forecast", now + p10, now + p50, now + p90, 1, 1)


def _teach(calibration: Calibration, count: int, *, wait: float, started_after: float) -> None:
    """``count`` forecasts of ``wait`` s (all three quantiles) whose requests started after ``started_after`` s."""
    for i in range(count):
        calibration.calibrate([_forecast(f"t{i}", 0.0, wait, wait, wait)])
    calibration.observe(set(), lambda rid: started_after)


def test_too_few_scores_leave_the_replays_range() -> None:
    calibration = Calibration()
    _teach(calibration, MIN_SCORED - 1, wait=60, started_after=600)
    forecast = _forecast("r", 1000.0, 100, 200, 300)
    assert calibration.calibrate([forecast]) == [forecast]


def test_starts_later_than_p90_move_p90_by_as_much_in_log_wait() -> None:
    calibration = Calibration()
    _teach(calibration, MIN_SCORED, wait=180, started_after=600)  # each 600 s where 180 s was said
    (out,) = calibration.calibrate([_forecast("r", 1000.0, 60, 120, 180)])
    # log1p(600/60) - log1p(180/60) added to p90's log-wait: 180 s becomes 600 s
    assert out.p90 == pytest.approx(1000.0 + 600)
    assert out.p50 == 1000.0 + 120
    # The lower end: every start was above p10 by log1p(600/60) - log1p(180/60); p10 moves up, to p50 at most.
    assert out.p10 == 1000.0 + 120


def test_starts_earlier_than_p10_move_p10_down_never_into_the_past() -> None:
    calibration = Calibration()
    _teach(calibration, MIN_SCORED, wait=3600, started_after=0)
    (out,) = calibration.calibrate([_forecast("r", 1000.0, 600, 1200, 1800)])
    assert out.p10 == 1000.0  # now, not before
    assert out.p90 == 1000.0 + 1200  # every start was far below p90: p90 comes down to p50


def test_a_request_that_left_without_starting_is_forgotten() -> None:
    calibration = Calibration()
    calibration.calibrate([_forecast("gone", 0.0, 10, 20, 30), _forecast("waits", 0.0, 10, 20, 30)])
    calibration.observe({"waits"}, lambda rid: None)
    assert calibration.scored == 0 and set(calibration.pending) == {"waits"}


def test_requests_waiting_past_p90_count_as_misses_before_they_start() -> None:
    calibration = Calibration()
    _teach(calibration, MIN_SCORED, wait=600, started_after=600)  # exact so far: nothing to widen
    overdue = [_forecast(f"w{i}", 0.0, 60, 60, 60) for i in range(MIN_SCORED)]
    calibration.calibrate(overdue)  # said 60 s; at 3540 s they still wait
    (out,) = calibration.calibrate([_forecast("r", 3540.0, 60, 60, 60)])
    assert out.p90 == pytest.approx(3540.0 + 3540.0)  # as late as the overdue ones are already
    (exact,) = Calibration().calibrate([_forecast("r", 3540.0, 60, 60, 60)])
    assert exact.p90 == 3540.0 + 60


def test_never_and_unknown_pass_unchanged() -> None:
    calibration = Calibration()
    _teach(calibration, MIN_SCORED, wait=60, started_after=600)
    never = StartForecast("n", 0.0, "never", reason="never, on the current nodes")
    unknown = StartForecast("u", 0.0, "unknown", reason="gangs are not forecast yet")
    assert calibration.calibrate([never, unknown]) == [never, unknown]
    assert "n" not in calibration.pending and "u" not in calibration.pending


def test_a_too_narrow_replay_is_widened_to_about_80_percent_coverage() -> None:
    """Starts drawn with σ 1.0 around the replay's median, the replay's range as if σ were 0.3."""
    rng = np.random.default_rng(7)
    calibration = Calibration()
    raw_hits = hits = 0
    trials = 3000
    for i in range(trials):
        now, median = float(i), float(rng.uniform(60, 7200))
        z = 1.2816  # the 90th percentile of the standard normal
        forecast = _forecast(f"r{i}", now, median * math.exp(-0.3 * z), median, median * math.exp(0.3 * z))
        (out,) = calibration.calibrate([forecast])
        start = now + median * float(rng.lognormal(0.0, 1.0))
        calibration.observe(set(), lambda rid, start=start: start)
        if i >= trials // 3:  # once the scores have settled
            raw_hits += forecast.p10 <= start <= forecast.p90
            hits += out.p10 <= start <= out.p90
    assert raw_hits / (trials - trials // 3) < 0.40
    assert 0.75 <= hits / (trials - trials // 3) <= 0.85


def test_a_group_with_enough_scores_is_widened_by_its_own() -> None:
    calibration = Calibration()
    for i in range(MIN_SCORED):  # team a's starts: 600 s where 180 s was said; team b's: exact
        calibration.calibrate(
            [_forecast(f"a{i}", 0.0, 180, 180, 180), _forecast(f"b{i}", 0.0, 180, 180, 180)],
            {f"a{i}": "a", f"b{i}": "b"},
        )
    calibration.observe(set(), lambda rid: 600.0 if rid.startswith("a") else 180.0)
    ra, rb, rc = (_forecast(r, 1000.0, 60, 120, 180) for r in ("ra", "rb", "rc"))
    out = calibration.calibrate([ra, rb, rc], {"ra": "a", "rb": "b", "rc": "c"})
    assert out[0].p90 == pytest.approx(1000.0 + 600)  # a's own misses
    assert out[1].p90 == 1000.0 + 180  # b was exact: its range stays
    assert out[2].p90 == pytest.approx(1000.0 + 600)  # c has no scores: all of them, a's misses among them


def test_a_long_wait_scores_only_a_few_of_its_forecasts_the_first_among_them() -> None:
    calibration = Calibration()
    for at in range(10):  # ten forecasts of one request, each of a 100 s wait from then
        calibration.calibrate([_forecast("long", float(at), 100, 100, 100)])
    calibration.observe(set(), lambda rid: 100.0)
    assert PER_REQUEST == 2 and calibration.scored == 2
    # The forecasts made at 0 s (the first) and 5 s, each below the start by nothing and by 5 s.
    assert list(calibration.all.lower) == pytest.approx([0.0, math.log1p(100 / 60) - math.log1p(95 / 60)])
