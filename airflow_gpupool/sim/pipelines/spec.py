"""Pipelines file: DAG runs of chained GPU steps, arriving on schedules beside a teams background.

A pipelines file (YAML, ``gpupool simulate --mode queue --pipelines FILE``; the built-in one is
``--scenario pipelines``) holds:

- ``background``: a built-in scenario name (default ``three-teams``) or a teams file, relative to
  the pipelines file: the teams whose jobs share the pool with the pipelines;
- ``cluster`` (optional): the cluster, replacing the background's (the same fields);
- ``teams`` (optional): quota entries of teams that run pipelines only (a quota file's
  ``teams[]``: ``name``, ``cohort``, ``quotas``), added to the background's quotas;
- ``handoff_seconds`` (default 120): how long a handed-on slice waits for its downstream;
- ``lead_s`` (default 600): how long before its upstream's forecast end a downstream queues ahead;
- ``idle_bound_s`` (default 120): how long a queued-ahead grant may be held before its step can
  use it; past it, the request steps back (keeping its place) until the upstream ends;
- ``start_gap_s`` (default 10): scheduler and pod start latency between a step's end and its
  downstream's request, in every policy;
- ``pipelines[]``: ``name``, ``team``, ``priority`` (default 0), ``every_s`` (one run per period),
  ``offset_s`` (first run, default 0), ``jitter_s`` (each run arrives up to this late, uniformly;
  default 0), and ``steps[]`` (2 to 4): ``name``, ``gpus`` (whole GPUs) or ``gpu_milli`` (a
  fraction), ``class`` (training, inference, batch; default batch), ``duration_s`` (``[low,
  high]``, drawn uniformly) and ``skip_probability`` (a branch that skips this step and the rest
  of the run, default 0).

Bad input raises :class:`~airflow_gpupool.exceptions.SimulationError` naming the field (as
``--pipelines <path>``), or the quota parser's :class:`~airflow_gpupool.exceptions.QuotaFileError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from airflow_gpupool.exceptions import SimulationError
from airflow_gpupool.governance.quotas import QuotaPlan, parse_quota_file
from airflow_gpupool.resources import MILLI_PER_GPU, GpuRequest, WorkloadClass
from airflow_gpupool.sim.teams import SCENARIOS, TeamsPlan, load_teams_file

__all__ = [
    "PIPELINE_SCENARIOS",
    "PipelineSpec",
    "PipelinesPlan",
    "RunDraw",
    "StepSpec",
    "draw_runs",
    "load_pipelines_file",
    "parse_pipelines_file",
]

#: Built-in pipelines scenarios.
PIPELINE_SCENARIOS = {"pipelines": Path(__file__).parent.parent / "examples" / "pipelines.yaml"}
_TOP_KEYS = frozenset(
    {
        "background",
        "cluster",
        "teams",
        "handoff_seconds",
        "lead_s",
        "idle_bound_s",
        "start_gap_s",
        "pipelines",
    }
)
_PIPELINE_KEYS = frozenset({"name", "team", "priority", "every_s", "offset_s", "jitter_s", "steps"})
_STEP_KEYS = frozenset({"name", "gpus", "gpu_milli", "class", "duration_s", "skip_probability"})
MAX_STEPS = 4


@dataclass(frozen=True)
class StepSpec:
    """One GPU step of a pipeline."""

    name: str
    request: GpuRequest
    duration_s: tuple[float, float]
    skip_probability: float = 0.0


@dataclass(frozen=True)
class PipelineSpec:
    """One DAG: its team, schedule and chained GPU steps."""

    name: str
    team: str
    every_s: float
    steps: tuple[StepSpec, ...]
    offset_s: float = 0.0
    jitter_s: float = 0.0

    @property
    def peak_milli(self) -> int:
        """The run's peak concurrent GPU need: its largest step (the steps run one after another)."""
        return max(s.request.total_gpu_milli for s in self.steps)


@dataclass(frozen=True)
class PipelinesPlan:
    """The background teams (quotas and cluster included), the pipelines and the policies' settings."""

    teams: TeamsPlan
    pipelines: tuple[PipelineSpec, ...]
    handoff_s: float = 120.0
    lead_s: float = 600.0
    idle_bound_s: float = 120.0
    start_gap_s: float = 10.0


@dataclass(frozen=True)
class RunDraw:
    """One DAG run: when it arrives, each step's work, and the first step a branch skips (None: none)."""

    seq: int
    pipeline: int
    arrival: float
    work_s: tuple[float, ...]
    skipped_from: int | None = None


def _fail(where: str, value: Any, expected: str) -> SimulationError:
    return SimulationError(f"--pipelines {where}", value, expected)


def _keys(raw: Any, allowed: frozenset[str], where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise _fail(where, raw, f"a mapping with keys among {sorted(allowed)}")
    unknown = sorted(map(str, set(raw) - allowed))
    if unknown:
        raise _fail(f"{where}: unknown key", unknown, f"only {sorted(allowed)}")
    return raw


def _number(raw: Mapping[str, Any], key: str, where: str, default: float | None, *, low: float = 0) -> float:
    value = raw.get(key, default)
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or value < low:
        raise _fail(f"{where}.{key}", value, f"a finite number >= {low:g}")
    return float(value)


def _name(raw: Mapping[str, Any], where: str) -> str:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(f"{where}.name", name, "a non-empty name")
    return name


def _step(raw: Any, where: str, team: str, priority: int) -> StepSpec:
    raw = _keys(raw, _STEP_KEYS, where)
    name = _name(raw, where)
    if ("gpus" in raw) == ("gpu_milli" in raw):
        raise _fail(f"{where}.gpus/gpu_milli", sorted(k for k in raw if k.startswith("gpu")), "exactly one")
    if "gpus" in raw:
        gpus = _number(raw, "gpus", where, None, low=1)
        if not gpus.is_integer():
            raise _fail(f"{where}.gpus", raw["gpus"], "a whole number of GPUs (gpu_milli for a fraction)")
        gpu: dict[str, Any] = {"gpus": int(gpus)}
    else:
        milli = _number(raw, "gpu_milli", where, None, low=1)
        if not milli.is_integer() or milli >= MILLI_PER_GPU:
            raise _fail(
                f"{where}.gpu_milli", raw["gpu_milli"], "1 to 999 (a fraction; use gpus for whole GPUs)"
            )
        gpu = {"gpu_milli": int(milli)}
    klass = raw.get("class", WorkloadClass.BATCH.value)
    if klass not in {c.value for c in WorkloadClass}:
        raise _fail(f"{where}.class", klass, "training, inference or batch")
    duration = raw.get("duration_s")
    if (
        not isinstance(duration, list)
        or len(duration) != 2
        or not all(isinstance(d, int | float) and not isinstance(d, bool) for d in duration)
        or not 0 < duration[0] <= duration[1] < math.inf
    ):
        raise _fail(f"{where}.duration_s", duration, "[low, high] seconds, 0 < low <= high")
    skip = _number(raw, "skip_probability", where, 0)
    if skip >= 1:
        raise _fail(f"{where}.skip_probability", skip, "a probability from 0 to below 1")
    size = max(1, gpu.get("gpus", 1))
    request = GpuRequest(
        cpu_milli=2000 * size,
        memory_mib=8192 * size,
        priority=priority,
        team=team,
        workload_class=WorkloadClass(klass),
        **gpu,
    )
    return StepSpec(name, request, (float(duration[0]), float(duration[1])), skip)


def _pipeline(raw: Any, where: str, teams: frozenset[str]) -> PipelineSpec:
    raw = _keys(raw, _PIPELINE_KEYS, where)
    name = _name(raw, where)
    team = raw.get("team")
    if team not in teams:
        raise _fail(f"{where}.team", team, f"a team with a quota: one of {sorted(teams)}")
    priority = raw.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise _fail(f"{where}.priority", priority, "a whole number")
    steps = raw.get("steps")
    if not isinstance(steps, list) or not 2 <= len(steps) <= MAX_STEPS:
        raise _fail(f"{where}.steps", steps, f"a list of 2 to {MAX_STEPS} chained GPU steps")
    if isinstance(steps[0], Mapping) and steps[0].get("skip_probability", 0):
        raise _fail(
            f"{where}.steps[0].skip_probability",
            steps[0]["skip_probability"],
            "0: a run starts with its first step",
        )
    every = _number(raw, "every_s", where, None, low=1)
    jitter = _number(raw, "jitter_s", where, 0)
    if jitter >= every:
        raise _fail(f"{where}.jitter_s", jitter, f"less than every_s ({every:g}): runs keep their order")
    return PipelineSpec(
        name,
        str(team),
        every,
        tuple(_step(s, f"{where}.steps[{i}]", str(team), priority) for i, s in enumerate(steps)),
        _number(raw, "offset_s", where, 0),
        jitter,
    )


def _background(document: Mapping[str, Any], base: Path) -> TeamsPlan:
    name = document.get("background", "three-teams")
    if not isinstance(name, str) or not name:
        raise _fail("background", name, f"a scenario ({', '.join(SCENARIOS)}) or a teams file")
    if name in SCENARIOS:
        return load_teams_file(SCENARIOS[name])
    path = base / name
    if not path.is_file():
        raise _fail(
            "background", name, f"a scenario ({', '.join(SCENARIOS)}) or a teams file ({path} is not one)"
        )
    return load_teams_file(path)


def _with_teams(plan: TeamsPlan, extra: Any) -> TeamsPlan:
    """Return the background plan with the pipelines-only teams' quotas added."""
    if extra is None:
        return plan
    if not isinstance(extra, list) or not extra:
        raise _fail("teams", extra, "a non-empty list of quota file teams (name, cohort, quotas)")
    added = parse_quota_file({"teams": extra})
    clash = sorted(set(added.teams) & set(plan.workloads))
    if clash or added.flavors != plan.quotas.flavors:
        raise _fail(
            "teams", clash or sorted(map(str, added.flavors)), "new team names, on the background's flavor"
        )
    quotas = QuotaPlan(
        tuple(sorted((*plan.quotas.quotas, *added.quotas), key=lambda q: (q.team, str(q.flavor)))),
        plan.quotas.headroom,
    )
    return replace(plan, quotas=quotas, workloads={**plan.workloads, **{t: () for t in added.teams}})


def parse_pipelines_file(document: Any, base: Path = Path()) -> PipelinesPlan:
    """Validate a loaded pipelines file and return its plan.

    :param document: the YAML as Python objects
    :param base: the folder a ``background`` teams file is relative to
    :raises SimulationError: a field is wrong, named as ``--pipelines <path>``
    :raises QuotaFileError: a quota of ``teams`` is wrong
    """
    from airflow_gpupool.sim.teams import parse_cluster

    document = _keys(document, _TOP_KEYS, "file")
    teams = _with_teams(_background(document, base), document.get("teams"))
    if "cluster" in document:
        teams = replace(teams, cluster=parse_cluster(document["cluster"], "--pipelines"))
    raw = document.get("pipelines")
    if not isinstance(raw, list) or not raw:
        raise _fail("pipelines", raw, "a non-empty list of pipelines")
    with_quota = frozenset(teams.quotas.teams)
    pipelines = tuple(_pipeline(p, f"pipelines[{i}]", with_quota) for i, p in enumerate(raw))
    return PipelinesPlan(
        teams,
        pipelines,
        handoff_s=_number(document, "handoff_seconds", "file", 120),
        lead_s=_number(document, "lead_s", "file", 600),
        idle_bound_s=_number(document, "idle_bound_s", "file", 120),
        start_gap_s=_number(document, "start_gap_s", "file", 10),
    )


def load_pipelines_file(path: str | Path) -> PipelinesPlan:
    """Read and validate a pipelines file, or a built-in scenario's (by name).

    :raises SimulationError: it cannot be read, is not YAML, or a field is wrong
    """
    import yaml

    path = PIPELINE_SCENARIOS.get(str(path), Path(path))
    try:
        document = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise SimulationError("--pipelines", str(path), f"a readable YAML file ({e.strerror})") from e
    except yaml.YAMLError as e:
        raise SimulationError("--pipelines", str(path), f"valid YAML ({e})") from e
    return parse_pipelines_file(document, Path(path).parent)


def draw_runs(plan: PipelinesPlan, span_s: float, seed: int) -> list[RunDraw]:
    """Return the DAG runs arriving in ``[0, span_s)``, in arrival order (the same for a seed).

    Each pipeline runs every ``every_s`` from ``offset_s``, each run up to ``jitter_s`` late; each
    step's work is drawn uniformly from its range, and a step with a ``skip_probability`` skips
    itself and the rest of its run (a branch not taken) with that probability.
    """
    rng = np.random.default_rng([seed, 40])  # its own stream: the background's jobs are unchanged
    drawn: list[tuple[float, int, tuple[float, ...], int | None]] = []
    for index, pipeline in enumerate(plan.pipelines):
        start = pipeline.offset_s
        while start < span_s:
            arrival = start + float(rng.uniform(0, pipeline.jitter_s)) if pipeline.jitter_s else start
            work = tuple(float(rng.uniform(*s.duration_s)) for s in pipeline.steps)
            skips = [float(rng.uniform()) < s.skip_probability for s in pipeline.steps]
            skipped = next((i for i, s in enumerate(skips) if s and i > 0), None)
            if arrival < span_s:
                drawn.append((arrival, index, work, skipped))
            start += pipeline.every_s
    drawn.sort(key=lambda d: (d[0], d[1]))
    return [RunDraw(seq, p, at, work, skipped) for seq, (at, p, work, skipped) in enumerate(drawn)]
