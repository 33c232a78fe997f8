"""The duration model: which level answers, survival conditioning, bad history discarded."""

from __future__ import annotations

import math

import numpy as np
import pytest

from airflow_gpupool.forecast.durations import MAX_RUN_SECONDS, DurationModel, TaskKey
from airflow_gpupool.ledger import FinishedRun

TASK = TaskKey("train", "fit", "vision", "training")


def runs(seconds: list[float], dag: str | None = "train", task: str | None = "fit") -> list[FinishedRun]:
    return [FinishedRun(dag, task, "vision", "training", s) for s in seconds]


@pytest.mark.parametrize(
    ("history", "elapsed", "level", "remaining"),
    [
        pytest.param(runs([100, 200, 300]), 0, "task", [100, 200, 300], id="the task's own runs"),
        pytest.param(runs([100, 200, 300, 400]), 150, "task", [50, 150, 250], id="conditioned on time run"),
        pytest.param(
            runs([100, 200, 300]) + runs([500, 600, 700], dag="other"),
            250,
            "team",
            [50, 250, 350, 450],
            id="outlived the task's runs: its team's",
        ),
        pytest.param(runs([500, 600, 700], dag="other"), 0, "team", [500, 600, 700], id="no run of its own"),
        pytest.param(runs([100, 200]), 0, "prior", None, id="too few runs at either level"),
        pytest.param([], 0, "prior", None, id="no history"),
        pytest.param(
            runs([0, -5, math.nan, math.inf, MAX_RUN_SECONDS * 2]),
            0,
            "prior",
            None,
            id="bad durations dropped",
        ),
    ],
)
def test_levels(
    history: list[FinishedRun], elapsed: float, level: str, remaining: list[float] | None
) -> None:
    model = DurationModel.from_runs(history, prior_seconds=3600)
    got_level, alive = model.source(TASK, elapsed)
    assert got_level == level
    assert (sorted(alive) if alive is not None else None) == remaining


def test_draws_are_positive_finite_and_seeded() -> None:
    model = DurationModel.from_runs(runs([100, 200, 300]), prior_seconds=3600)
    for key, elapsed in ((TASK, -50.0), (TaskKey(None, None, "x", "batch"), 1e9)):  # a clock jump; a long run
        sampler = model.sampler(key, elapsed)
        first = [sampler.draw(np.random.default_rng(1)) for _ in range(3)]
        assert all(math.isfinite(d) and d > 0 for d in first)
        assert first == [sampler.draw(np.random.default_rng(1)) for _ in range(3)]


@pytest.mark.parametrize("prior", [0, -1, math.nan, math.inf])
def test_a_bad_prior_is_refused(prior: float) -> None:
    with pytest.raises(ValueError, match="forecast prior"):
        DurationModel.from_runs([], prior_seconds=prior)
