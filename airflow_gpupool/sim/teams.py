"""Teams for the governed queue simulation: who shares the pool, with which quotas and workloads.

A teams file (YAML, ``gpupool simulate --mode queue --teams FILE``) is a quota file
(:func:`airflow_gpupool.governance.quotas.parse_quota_file`: ``teams[].name``, ``cohort``,
``quotas``) whose teams also describe their ``workloads``, plus the pool's governance settings:

- ``cluster`` (optional): ``{nodes, gpus_per_node, model, cpu_milli, memory_mib}``, the cluster
  simulated (without it, the ``--nodes`` list);
- ``headroom`` (share of capacity only urgent work may use, default 0.2), ``headroom_lent``
  (default false: true lends the headroom to preemptible work, which urgent work preempts), ``urgent_priority``
  (default 100), ``preemption_grace_s`` (default 120), ``min_runtime_s`` (default 120);
- per workload: ``name``, ``class`` (training, inference, batch), ``gpus`` (whole GPUs) or
  ``gpu_milli`` (a fraction), ``priority``, ``preemptible``, ``checkpoint_interval_s`` (periodic
  checkpoints; absent: none), ``emergency_checkpoint_s`` (how long writing a checkpoint on
  SIGTERM takes; absent: the workload cannot), ``duration_s`` (``[low, high]``, drawn uniformly),
  and its arrivals in bursts: ``bursts_per_hour`` (Poisson), ``jobs_per_burst``, ``burst_spread_s``.

The simulation governs one flavor: every quota names the same one, the whole simulated cluster.
Bad input raises :class:`~airflow_gpupool.exceptions.SimulationError` (or the quota parser's
:class:`~airflow_gpupool.exceptions.QuotaFileError`) naming the field, before anything runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from airflow_gpupool.exceptions import SimulationError
from airflow_gpupool.governance.quotas import Flavor, QuotaPlan, TeamQuota, parse_quota_file
from airflow_gpupool.placement.snapshot import GpuState, NodeState
from airflow_gpupool.resources import MILLI_PER_GPU, GpuRequest, WorkloadClass
from airflow_gpupool.sim.trace import GPU_MEMORY_MIB, QOS_PRIORITY, TracePod

__all__ = [
    "SCENARIOS",
    "ClusterSpec",
    "Job",
    "TeamsPlan",
    "Workload",
    "generate_jobs",
    "load_teams_file",
    "parse_cluster",
    "parse_teams_file",
    "scenario",
    "teams_from_qos",
]

#: Built-in scenarios, shipped as teams files.
SCENARIOS = {"three-teams": Path(__file__).parent / "examples" / "three_teams.yaml"}
_TOP_KEYS = frozenset(
    {
        "cluster",
        "headroom",
        "headroom_lent",
        "urgent_priority",
        "preemption_grace_s",
        "min_runtime_s",
        "teams",
    }
)
_WORKLOAD_KEYS = frozenset(
    {
        "name", "class", "gpus", "gpu_milli", "priority", "preemptible", "checkpoint_interval_s",
        "emergency_checkpoint_s", "duration_s", "bursts_per_hour", "jobs_per_burst", "burst_spread_s",
    }
)  # fmt: skip
_CLUSTER_KEYS = frozenset({"nodes", "gpus_per_node", "model", "cpu_milli", "memory_mib"})


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster of identical GPU nodes."""

    nodes: int
    gpus_per_node: int
    model: str
    cpu_milli: int = 128_000
    memory_mib: int = 1_048_576

    def build(self) -> tuple[NodeState, ...]:
        """Return the nodes, every GPU free."""
        memory = GPU_MEMORY_MIB.get(self.model, 81920)
        gpus = tuple(GpuState(i, self.model, memory) for i in range(self.gpus_per_node))
        return tuple(
            NodeState(f"{self.model.lower()}-{n}", self.cpu_milli, self.memory_mib, gpus)
            for n in range(self.nodes)
        )


@dataclass(frozen=True)
class Workload:
    """One kind of work a team submits (see the module docstring for the fields)."""

    name: str
    workload_class: str
    milli: int
    whole: bool
    priority: int
    preemptible: bool
    checkpoint_interval_s: float | None
    emergency_checkpoint_s: float | None
    duration_s: tuple[float, float]
    bursts_per_hour: float
    jobs_per_burst: int
    burst_spread_s: float

    def request(self, team: str) -> GpuRequest:
        """Return the request each of ``team``'s jobs of this workload makes."""
        gpu: dict[str, Any] = (
            {"gpus": self.milli // MILLI_PER_GPU} if self.whole else {"gpu_milli": self.milli}
        )
        return GpuRequest(
            cpu_milli=2000 * max(1, self.milli // MILLI_PER_GPU),
            memory_mib=8192 * max(1, self.milli // MILLI_PER_GPU),
            priority=self.priority,
            team=team,
            workload_class=WorkloadClass(self.workload_class),
            preemptible=self.preemptible,
            **gpu,
        )


@dataclass(frozen=True)
class Job:
    """One submission: what it asks, when, for how long (seconds of work on its slice)."""

    seq: int
    team: str
    request: GpuRequest
    arrival: float
    work_s: float
    checkpoint_interval_s: float | None = None
    emergency_checkpoint_s: float | None = None


@dataclass(frozen=True)
class TeamsPlan:
    """Quotas, workloads and governance settings of one simulated pool."""

    quotas: QuotaPlan
    workloads: Mapping[str, tuple[Workload, ...]]
    flavor: Flavor
    cluster: ClusterSpec | None = None
    headroom: float = 0.2
    headroom_lent: bool = False
    urgent_priority: int = 100
    grace_s: float = 120.0
    min_runtime_s: float = 120.0

    @property
    def teams(self) -> tuple[str, ...]:
        """The teams, sorted."""
        return tuple(sorted(self.workloads))

    def nominal_milli(self, team: str) -> int:
        """Return the team's nominal quota of the simulated flavor."""
        return sum(q.nominal_milli for q in self.quotas.quotas if q.team == team)


def _fail(where: str, value: Any, expected: str) -> SimulationError:
    return SimulationError(f"--teams {where}", value, expected)


def _number(raw: Mapping[str, Any], key: str, where: str, default: float | None, *, low: float = 0) -> Any:
    value = raw.get(key, default)
    if value is None and default is None:
        return None
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or value < low:
        raise _fail(f"{where}.{key}", value, f"a finite number >= {low:g}")
    return value


def _keys(raw: Any, allowed: frozenset[str], where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise _fail(where, raw, f"a mapping with keys among {sorted(allowed)}")
    unknown = sorted(map(str, set(raw) - allowed))
    if unknown:
        raise _fail(f"{where}: unknown key", unknown, f"only {sorted(allowed)}")
    return raw


def _workload(raw: Any, where: str) -> Workload:
    raw = _keys(raw, _WORKLOAD_KEYS, where)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(f"{where}.name", name, "a non-empty name")
    klass = raw.get("class", WorkloadClass.BATCH.value)
    if klass not in {c.value for c in WorkloadClass}:
        raise _fail(f"{where}.class", klass, "training, inference or batch")
    if ("gpus" in raw) == ("gpu_milli" in raw):
        raise _fail(f"{where}.gpus/gpu_milli", sorted(k for k in raw if k.startswith("gpu")), "exactly one")
    whole = "gpus" in raw
    milli = (
        int(_number(raw, "gpus", where, None, low=1)) * MILLI_PER_GPU
        if whole
        else int(_number(raw, "gpu_milli", where, None, low=1))
    )
    if not whole and milli >= MILLI_PER_GPU:
        raise _fail(f"{where}.gpu_milli", milli, "1 to 999 (a fraction; use gpus for whole GPUs)")
    duration = raw.get("duration_s")
    if (
        not isinstance(duration, list)
        or len(duration) != 2
        or not all(isinstance(d, int | float) and not isinstance(d, bool) for d in duration)
        or not 0 < duration[0] <= duration[1]
    ):
        raise _fail(f"{where}.duration_s", duration, "[low, high] seconds, 0 < low <= high")
    priority = raw.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise _fail(f"{where}.priority", priority, "a whole number")
    preemptible = raw.get("preemptible", False)
    if not isinstance(preemptible, bool):
        raise _fail(f"{where}.preemptible", preemptible, "true or false")
    interval = _number(raw, "checkpoint_interval_s", where, None, low=1)
    return Workload(
        name=name,
        workload_class=str(klass),
        milli=milli,
        whole=whole,
        priority=priority,
        preemptible=preemptible,
        checkpoint_interval_s=interval,
        emergency_checkpoint_s=_number(raw, "emergency_checkpoint_s", where, None),
        duration_s=(float(duration[0]), float(duration[1])),
        bursts_per_hour=_number(raw, "bursts_per_hour", where, None, low=0),
        jobs_per_burst=int(_number(raw, "jobs_per_burst", where, 1, low=1)),
        burst_spread_s=_number(raw, "burst_spread_s", where, 0),
    )


def parse_teams_file(document: Any) -> TeamsPlan:
    """Validate a loaded teams file (the YAML as Python objects) and return its plan.

    :raises SimulationError: a field outside the quotas is wrong, named as ``--teams <path>``
    :raises QuotaFileError: a quota is wrong (the quota parser's error, naming the field)
    """
    document = _keys(document, _TOP_KEYS, "file")
    teams = document.get("teams")
    if not isinstance(teams, list) or not teams:
        raise _fail("teams", teams, "a non-empty list of teams")
    workloads: dict[str, tuple[Workload, ...]] = {}
    quota_teams = []
    for index, team in enumerate(teams):
        where = f"teams[{index}]"
        if not isinstance(team, Mapping):
            raise _fail(where, team, "a mapping with name, cohort, quotas and workloads")
        entries = team.get("workloads")
        if not isinstance(entries, list) or not entries:
            raise _fail(f"{where}.workloads", entries, "a non-empty list of workloads")
        workloads[str(team.get("name"))] = tuple(
            _workload(w, f"{where}.workloads[{k}]") for k, w in enumerate(entries)
        )
        quota_teams.append({k: v for k, v in team.items() if k != "workloads"})
    plan = parse_quota_file({"teams": quota_teams})
    if len(plan.flavors) != 1:
        raise _fail(
            "teams[].quotas[].flavor", sorted(map(str, plan.flavors)), "one flavor (the simulated cluster)"
        )
    headroom = _number(document, "headroom", "file", 0.2)
    if headroom > 1:
        raise _fail("headroom", headroom, "a share from 0 to 1")
    lent = document.get("headroom_lent", False)
    if not isinstance(lent, bool):
        raise _fail("headroom_lent", lent, "true or false")
    urgent = document.get("urgent_priority", 100)
    if isinstance(urgent, bool) or not isinstance(urgent, int):
        raise _fail("urgent_priority", urgent, "a whole number")
    return TeamsPlan(
        quotas=plan,
        workloads=workloads,
        flavor=next(iter(plan.flavors)),
        cluster=_cluster(document.get("cluster")),
        headroom=float(headroom),
        headroom_lent=lent,
        urgent_priority=urgent,
        grace_s=float(_number(document, "preemption_grace_s", "file", 120)),
        min_runtime_s=float(_number(document, "min_runtime_s", "file", 120)),
    )


def _cluster(raw: Any) -> ClusterSpec | None:
    return None if raw is None else parse_cluster(raw, "--teams")


def parse_cluster(raw: Any, option: str) -> ClusterSpec:
    """Validate a file's ``cluster`` mapping; errors name the field as ``<option> cluster.<field>``.

    :raises SimulationError: a field is missing or wrong
    """

    def fail(where: str, value: Any, expected: str) -> SimulationError:
        return SimulationError(f"{option} {where}", value, expected)

    if not isinstance(raw, Mapping) or set(raw) - _CLUSTER_KEYS:
        raise fail("cluster", raw, f"a mapping with keys among {sorted(_CLUSTER_KEYS)}")
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise fail("cluster.model", model, "a GPU model name such as A100")
    counts = {k: raw.get(k) for k in ("nodes", "gpus_per_node", "cpu_milli", "memory_mib")}
    bad = {
        k: v
        for k, v in counts.items()
        if (k in raw or k in ("nodes", "gpus_per_node"))
        and (isinstance(v, bool) or not isinstance(v, int) or v < 1)
    }
    if bad:
        raise fail(f"cluster.{'/'.join(bad)}", bad, "whole numbers >= 1")
    extra = {k: int(raw[k]) for k in ("cpu_milli", "memory_mib") if k in raw}
    return ClusterSpec(int(raw["nodes"]), int(raw["gpus_per_node"]), model, **extra)


def load_teams_file(path: str | Path) -> TeamsPlan:
    """Read and validate a teams file.

    :raises SimulationError: it cannot be read, is not YAML, or a field is wrong
    """
    import yaml

    try:
        document = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise SimulationError("--teams", str(path), f"a readable YAML file ({e.strerror})") from e
    except yaml.YAMLError as e:
        raise SimulationError("--teams", str(path), f"valid YAML ({e})") from e
    return parse_teams_file(document)


def scenario(name: str) -> TeamsPlan:
    """Return a built-in scenario's plan.

    :raises SimulationError: no such scenario
    """
    if name not in SCENARIOS:
        raise SimulationError("--scenario", name, f"one of {', '.join(SCENARIOS)}")
    return load_teams_file(SCENARIOS[name])


def generate_jobs(plan: TeamsPlan, span_s: float, seed: int, *, warmup_s: float = 0.0) -> list[Job]:
    """Return the jobs arriving over ``span_s`` seconds, in arrival order (the same for a seed).

    Each workload's bursts arrive as a Poisson process scaled, as queue mode scales arrivals to a
    target offered load, so that the warm-up ``[0, warmup_s)`` and the window ``[warmup_s,
    span_s)`` each receive the GPU time the file's rates offer on average (bursts per hour ×
    jobs per burst × mean duration × GPUs): every seed offers the file's load, only the timing
    and sizes of its bursts differ. A burst's jobs arrive uniformly over its spread.
    """
    rng = np.random.default_rng(seed)
    drawn: list[tuple[float, str, Workload, float]] = []
    segments = [(0.0, min(warmup_s, span_s)), (min(warmup_s, span_s), span_s)]
    for team in plan.teams:
        for workload in plan.workloads[team]:
            if workload.bursts_per_hour <= 0:
                continue
            for start, end in segments:
                if end > start:
                    drawn += [(at, team, workload, work) for at, work in _bursts(workload, start, end, rng)]
    drawn.sort(key=lambda d: (d[0], d[1], d[2].name))
    return [
        Job(
            seq,
            team,
            workload.request(team),
            at,
            work,
            workload.checkpoint_interval_s,
            workload.emergency_checkpoint_s,
        )
        for seq, (at, team, workload, work) in enumerate(d for d in drawn if d[0] < span_s)
    ]


def _bursts(
    workload: Workload, start: float, end: float, rng: np.random.Generator
) -> list[tuple[float, float]]:
    """Return (arrival, duration) of one workload's jobs in ``[start, end)``, offering its mean load.

    Bursts are drawn as a Poisson process until their jobs hold the GPU time the workload
    offers on average over the segment (the count closest to it); the process is then scaled
    so that the burst after the last would arrive at ``end``: given its count, a Poisson
    process's arrivals are uniform, so the bursts keep their random timing.
    """
    rate = workload.bursts_per_hour / 3600
    mean_s = sum(workload.duration_s) / 2
    target = rate * (end - start) * workload.jobs_per_burst * mean_s
    bursts: list[tuple[float, list[tuple[float, float]]]] = []
    t, held = float(rng.exponential(1 / rate)), 0.0
    while True:
        jobs = [
            (float(rng.uniform(0, workload.burst_spread_s)), float(rng.uniform(*workload.duration_s)))
            for _ in range(workload.jobs_per_burst)
        ]
        burst_s = sum(d for _, d in jobs)
        if held + burst_s / 2 > target:
            break  # this burst would overshoot more than leaving it out falls short
        bursts.append((t, jobs))
        held += burst_s
        t += float(rng.exponential(1 / rate))
    scale = (end - start) / t
    return [(start + at * scale + offset, d) for at, jobs in bursts for offset, d in jobs]


#: Trace teams (by QoS class): preemptible ones, and their assumed checkpointing.
_QOS_PREEMPTIBLE = frozenset({"BE", "Burstable"})
_TRACE_CHECKPOINT_S = 600.0
_TRACE_EMERGENCY_S = 30.0


def teams_from_qos(pods: Sequence[TracePod], durations: Sequence[float], capacity_milli: int) -> TeamsPlan:
    """Return a plan with one team per QoS class of a trace, for the Alibaba queue study.

    Each team's nominal quota is its share of the trace's GPU time (how a capacity planner would
    size it), all in one cohort with no limits; BE and Burstable are preemptible and assumed to
    checkpoint every 10 minutes (30 s to write one on SIGTERM) and may use the headroom on loan;
    LS, the highest priority, is urgent.
    """
    work: dict[str, float] = {}
    for pod, seconds in zip(pods, durations, strict=True):
        work[pod.qos or "none"] = work.get(pod.qos or "none", 0.0) + pod.gpu_milli * seconds
    total = sum(work.values()) or 1.0
    flavor = Flavor("pool", "trace")
    quotas = tuple(
        TeamQuota(team, flavor, round(capacity_milli * w / total), "trace")
        for team, w in sorted(work.items())
    )
    return TeamsPlan(
        quotas=QuotaPlan(quotas),
        workloads={team: () for team in work},
        flavor=flavor,
        headroom_lent=True,  # as in the three-teams scenario: BE and Burstable may fill it
        urgent_priority=QOS_PRIORITY["LS"],
    )


def trace_preemption(qos: str) -> tuple[bool, float | None, float | None]:
    """Return (preemptible, checkpoint interval, emergency checkpoint time) of a trace team."""
    if qos in _QOS_PREEMPTIBLE:
        return True, _TRACE_CHECKPOINT_S, _TRACE_EMERGENCY_S
    return False, None, None
