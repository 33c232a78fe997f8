"""How long each running grant has left: an empirical model from the ledger's own history.

A grant's total run time is drawn from the recent successful runs most like it, in this order:

1. the same task (``dag_id``/``task_id`` parsed from the holder): its newest
   :data:`RUNS_PER_TASK` successful runs;
2. else the same team and workload class: their newest :data:`RUNS_PER_GROUP` runs;
3. else a prior: exponential with mean ``[gpupool] forecast_prior_seconds``.

A level is used only when it holds at least :data:`MIN_RUNS` runs that last longer than the
time the grant has already run; the remaining time is then one of those runs' durations minus
the time already run, drawn uniformly (the empirical distribution conditioned on survival). A
grant that has outlived every run at a level falls through to the next; the prior, being
memoryless, always answers. A waiting request, not yet started, is the same with nothing run.

Durations that are not finite, not positive, or longer than :data:`MAX_RUN_SECONDS` are
discarded as bad history (a clock jump, a bad row). Samples are drawn from a seeded
``numpy`` generator the caller passes, so a forecast is reproducible.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from airflow_gpupool.ledger import FinishedRun

__all__ = ["MAX_RUN_SECONDS", "MIN_RUNS", "RUNS_PER_GROUP", "RUNS_PER_TASK", "DurationModel", "TaskKey"]

#: Runs of the same task kept (the newest).
RUNS_PER_TASK = 20
#: Runs of the same team and workload class kept (the newest).
RUNS_PER_GROUP = 200
#: A level answers only with at least this many runs longer than the time already run.
MIN_RUNS = 3
#: Longer runs are bad history (30 days).
MAX_RUN_SECONDS = 30 * 86400.0


@dataclass(frozen=True)
class TaskKey:
    """What a grant's duration is looked up by."""

    dag_id: str | None
    task_id: str | None
    team: str
    workload_class: str


@dataclass
class DurationModel:
    """Remaining-time samples for grants, from successful runs and a prior.

    :param prior_seconds: the prior's mean (``[gpupool] forecast_prior_seconds``)
    """

    prior_seconds: float
    by_task: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    by_group: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.prior_seconds) and self.prior_seconds > 0):
            raise ValueError(f"forecast prior {self.prior_seconds!r}: expected a positive number of seconds")

    @classmethod
    def from_runs(cls, runs: Iterable[FinishedRun], prior_seconds: float) -> DurationModel:
        """Build the model from successful runs, newest first; bad durations are dropped."""
        by_task: dict[tuple[str, str], list[float]] = defaultdict(list)
        by_group: dict[tuple[str, str], list[float]] = defaultdict(list)
        for run in runs:
            if not (math.isfinite(run.seconds) and 0 < run.seconds <= MAX_RUN_SECONDS):
                continue
            if run.dag_id and run.task_id:
                task = by_task[(run.dag_id, run.task_id)]
                if len(task) < RUNS_PER_TASK:
                    task.append(run.seconds)
            group = by_group[(run.team, run.workload_class)]
            if len(group) < RUNS_PER_GROUP:
                group.append(run.seconds)
        return cls(prior_seconds, dict(by_task), dict(by_group))

    def source(self, key: TaskKey, elapsed: float = 0.0) -> tuple[str, Sequence[float] | None]:
        """Return which level answers for ``key`` after ``elapsed`` seconds and its surviving runs (None: the prior)."""
        elapsed = max(0.0, elapsed)
        levels = (
            ("task", self.by_task.get((key.dag_id, key.task_id)) if key.dag_id and key.task_id else None),
            ("team", self.by_group.get((key.team, key.workload_class))),
        )
        for name, runs in levels:
            if runs:
                alive = [d - elapsed for d in runs if d > elapsed]
                if len(alive) >= MIN_RUNS:
                    return name, alive
        return "prior", None

    def sampler(self, key: TaskKey, elapsed: float = 0.0) -> RemainingTime:
        """Return a sampler of the remaining seconds of ``key`` after ``elapsed`` seconds."""
        level, alive = self.source(key, elapsed)
        return RemainingTime(level, tuple(alive) if alive is not None else None, self.prior_seconds)


@dataclass(frozen=True)
class RemainingTime:
    """One grant's remaining-time distribution: surviving runs' remainders, or the exponential prior."""

    level: str
    remainders: tuple[float, ...] | None
    prior_seconds: float

    def draw(self, rng: np.random.Generator) -> float:
        """Return one sample of the remaining seconds (always positive and finite)."""
        if self.remainders is None:
            return max(1.0, float(rng.exponential(self.prior_seconds)))
        return max(1.0, self.remainders[int(rng.integers(len(self.remainders)))])

    def mean(self) -> float:
        """Return the expected remaining seconds."""
        if self.remainders is None:
            return self.prior_seconds
        return sum(self.remainders) / len(self.remainders)
