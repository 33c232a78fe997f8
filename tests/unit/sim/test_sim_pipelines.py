"""The pipeline policies on small hand-made DAG runs whose answers are known, the file's errors, the command."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_gpupool.cli.simulate import register
from airflow_gpupool.exceptions import QuotaFileError, SimulationError
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.sim.pipelines.engine import PIPELINE_POLICIES, PipelineSim
from airflow_gpupool.sim.pipelines.runs import pipeline_measures, run_bounds
from airflow_gpupool.sim.pipelines.spec import (
    PIPELINE_SCENARIOS,
    PipelinesPlan,
    RunDraw,
    draw_runs,
    load_pipelines_file,
    parse_pipelines_file,
)
from airflow_gpupool.sim.teams import Job

HORIZON = 10_000.0


def _teams(gpus: int) -> dict[str, Any]:
    """One node, no headroom, two teams (ml runs pipelines, bg is the background) splitting it."""
    half = gpus / 2
    return {
        "cluster": {"nodes": 1, "gpus_per_node": gpus, "model": "A100"},
        "headroom": 0,
        "teams": [
            {
                "name": team,
                "cohort": "lab",
                "quotas": [{"flavor": {"model": "A100"}, "nominal": half, "borrowing_limit": half}],
                "workloads": [{"name": "none", "gpus": 1, "duration_s": [1, 1], "bursts_per_hour": 0}],
            }
            for team in ("bg", "ml")
        ],
    }


def _plan(tmp_path: Path, gpus: int, steps: list[dict[str, Any]], **settings: Any) -> PipelinesPlan:
    (tmp_path / "teams.yaml").write_text(yaml.safe_dump(_teams(gpus)))
    document = {
        "background": "teams.yaml",
        "start_gap_s": 10,
        **settings,
        "pipelines": [{"name": "p", "team": "ml", "every_s": 100_000, "steps": steps}],
    }
    return parse_pipelines_file(document, tmp_path)


def _bg(seq: int, gpus: int, at: float, work: float) -> Job:
    request = GpuRequest(cpu_milli=1000, memory_mib=1024, gpus=gpus, team="bg")
    return Job(seq, "bg", request, at, work)


def _run(
    plan: PipelinesPlan,
    policy: str,
    run: RunDraw,
    jobs: list[Job] = (),  # type: ignore[assignment]
) -> PipelineSim:
    assert plan.teams.cluster is not None
    sim = PipelineSim(
        list(plan.teams.cluster.build()), plan, PIPELINE_POLICIES[policy], [run], warm=0.0, horizon=HORIZON
    )
    sim.run(list(jobs))
    return sim


def _waits(sim: PipelineSim) -> list[float]:
    """Each later step's wait: from when it asked for its slice to when its work began."""
    return [
        s.started - s.ready
        for (_, i), s in sorted(sim.steps.items())
        if i > 0 and s.started is not None and s.ready is not None
    ]


TRAIN_EVAL = [
    {"name": "train", "gpus": 2, "duration_s": [100, 100]},
    {"name": "evaluate", "gpus": 1, "duration_s": [50, 50]},
]


def test_per_task_loses_the_node_to_a_waiting_job_and_hand_on_does_not(tmp_path: Path) -> None:
    # Two GPUs. train holds both from 0 to 100; a background job asking for both arrives at 1.
    plan = _plan(tmp_path, 2, TRAIN_EVAL)
    run = RunDraw(0, 0, 0.0, (100.0, 50.0))
    per_task = _run(plan, "per-task", run, [_bg(0, 2, 1.0, 500.0)])
    # train ends at 100 and releases both GPUs; the job takes them; evaluate asks at 110, runs at 600.
    assert _waits(per_task) == [490.0]
    assert per_task.steps[(0, 1)].ended == 650.0
    handed = _run(plan, "hand-on", run, [_bg(0, 2, 1.0, 500.0)])
    # One GPU of train's two passes to evaluate: no wait, no gap another request could use.
    assert _waits(handed) == [0.0]
    assert handed.steps[(0, 1)].ended == 160.0
    assert handed.started_at[next(k for k in handed.tries if k not in handed.step_of)] == 160.0
    measures = pipeline_measures(handed)
    assert measures["run_latency_p50_s"] == 160.0
    # Held unused only during the 10 s start gap, one GPU of the two: 10 000 milli-s over 2 GPUs x 10 000 s.
    assert measures["idle_hand_on_pct"] == pytest.approx(100 * 1000 * 10 / (2000 * HORIZON), abs=1e-3)
    assert measures["idle_queue_ahead_pct"] == 0.0


def test_the_bounds_are_the_runs_own_work_and_a_whole_run_reservations_idle(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 2, TRAIN_EVAL)
    runs = [RunDraw(0, 0, 0.0, (100.0, 50.0)), RunDraw(1, 0, 50.0, (100.0, 50.0), skipped_from=1)]
    bounds = run_bounds(runs, plan, 2000, 0.0, HORIZON)
    # 160 s: 100 + the 10 s gap + 50; the skipped run is train alone. The median of two is their mean.
    assert bounds["run_latency_floor_p50_s"] == 130.0
    # Keeping 2 GPUs from 0 to 160 while it uses 2 x 100 + 1 x 50: 320 000 - 250 000 milli-s idle.
    assert bounds["whole_run_reservation_idle_pct"] == pytest.approx(
        100 * 70_000 / (2000 * HORIZON), abs=1e-3
    )


def test_a_handed_slice_nobody_claims_is_released_at_the_bound(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 2, TRAIN_EVAL, handoff_seconds=120)
    skipped = RunDraw(0, 0, 0.0, (100.0, 50.0), skipped_from=1)  # a branch skips evaluate
    sim = _run(plan, "hand-on", skipped, [_bg(0, 2, 1.0, 500.0)])
    assert sim.steps[(0, 1)].started is None
    background = next(k for k in sim.tries if k not in sim.step_of)
    assert sim.started_at[background] == 220.0  # train's end + handoff_seconds, not a second later
    assert sim.idle_held["hand-on"] == pytest.approx(1000 * 120)
    assert pipeline_measures(sim)["run_latency_p50_s"] == 100.0


PREP_TRAIN = [
    {"name": "preprocess", "gpus": 1, "duration_s": [50, 150]},
    {"name": "train", "gpus": 2, "duration_s": [50, 50]},
]


def test_a_queued_ahead_request_is_not_granted_before_not_before(tmp_path: Path) -> None:
    # Four GPUs, nothing else: train would fit at once, but it asks from its forecast time on.
    plan = _plan(tmp_path, 4, PREP_TRAIN, lead_s=1000, idle_bound_s=120)
    sim = _run(plan, "hand-on+queue-ahead", RunDraw(0, 0, 0.0, (100.0, 50.0)))
    train = sim.steps[(0, 1)]
    assert train.ahead
    # Forecast: the middle of preprocess's range, 100 s, plus the 10 s start gap.
    assert sim.tries[train.try_k or 0].queued_at == 0.0
    assert sim.started_at[train.try_k or 0] == 110.0
    assert _waits(sim) == [0.0]
    assert sim.idle_held["queue-ahead"] == 0.0


def test_a_late_upstream_makes_the_grant_step_back_at_the_bound_keeping_its_place(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 4, PREP_TRAIN, lead_s=1000, idle_bound_s=120)
    late = RunDraw(0, 0, 0.0, (300.0, 50.0))  # forecast 100 s, it takes 300 s
    # A background job queued at 120 asks for 3 GPUs; it fits only once train's slice is given back.
    sim = _run(plan, "hand-on+queue-ahead", late, [_bg(0, 3, 120.0, 1000.0)])
    train = sim.steps[(0, 1)]
    background = next(k for k in sim.tries if k not in sim.step_of)
    # Granted at its not_before (110), unused until the bound (230): 2 GPUs x 120 s held idle.
    assert sim.idle_held["queue-ahead"] == pytest.approx(2000 * 120)
    assert sim.started_at[background] == 230.0  # the slice given back at the bound, not held on
    # Stepped back, it waits for its upstream: preprocess ends at 300, train asks at 310, then
    # waits for the job that took the slice (a late upstream costs its own run, not the others).
    assert train.ready == 310.0 and train.started == 1230.0
    assert train.try_k is not None and sim.tries[train.try_k].queued_at == 0.0


def test_a_skipped_steps_queued_ahead_request_is_withdrawn_when_its_upstream_ends(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 4, PREP_TRAIN, lead_s=1000)
    skipped = RunDraw(0, 0, 0.0, (100.0, 50.0), skipped_from=1)
    sim = _run(plan, "hand-on+queue-ahead", skipped, [_bg(0, 4, 50.0, 100.0)])
    background = next(k for k in sim.tries if k not in sim.step_of)
    assert sim.started_at[background] == 100.0  # the whole node as soon as preprocess ends
    assert sim.steps[(0, 1)].try_k is None and not sim.waiting
    assert sim.idle_held == {"hand-on": 0.0, "queue-ahead": 0.0}


def test_run_admission_holds_the_first_step_until_the_quota_serves_the_peak(tmp_path: Path) -> None:
    steps = [
        {"name": "preprocess", "gpus": 1, "duration_s": [100, 100]},
        {"name": "train", "gpus": 4, "duration_s": [100, 100]},
    ]
    plan = _plan(tmp_path, 4, steps)
    run = RunDraw(0, 0, 10.0, (100.0, 100.0))
    jobs = [_bg(0, 2, 0.0, 1000.0)]  # bg holds its nominal 2 GPUs until 1000: ml can borrow none
    per_task = _run(plan, "hand-on+queue-ahead", run, jobs)
    admitted = _run(plan, "hand-on+queue-ahead+run-admission", run, jobs)
    assert per_task.steps[(0, 0)].started == 10.0
    assert per_task.steps[(0, 1)].started == 1000.0  # train waited 880 s half-way through the run
    assert admitted.steps[(0, 0)].started == 1000.0  # the run starts when its peak can be served
    assert _waits(admitted) == [0.0]


BAD = [
    ("unknown-top-key", ["nope"], 1, SimulationError, "--pipelines file: unknown key"),
    ("no-pipelines", ["pipelines"], [], SimulationError, "--pipelines pipelines"),
    ("team-without-quota", ["pipelines", 0, "team"], "nobody", SimulationError, "pipelines[0].team"),
    (
        "one-step",
        ["pipelines", 0, "steps"],
        [{"name": "a", "gpus": 1, "duration_s": [1, 2]}],
        SimulationError,
        "pipelines[0].steps",
    ),
    (
        "five-steps",
        ["pipelines", 0, "steps"],
        [{"name": "a", "gpus": 1, "duration_s": [1, 2]}] * 5,
        SimulationError,
        "pipelines[0].steps",
    ),
    (
        "both-sizes",
        ["pipelines", 0, "steps", 1, "gpu_milli"],
        500,
        SimulationError,
        "pipelines[0].steps[1].gpus/gpu_milli",
    ),
    (
        "fraction-too-big",
        ["pipelines", 0, "steps", 3, "gpu_milli"],
        1000,
        SimulationError,
        "pipelines[0].steps[3].gpu_milli",
    ),
    (
        "bad-duration",
        ["pipelines", 0, "steps", 0, "duration_s"],
        [5, 1],
        SimulationError,
        "pipelines[0].steps[0].duration_s",
    ),
    (
        "bad-class",
        ["pipelines", 0, "steps", 0, "class"],
        "gaming",
        SimulationError,
        "pipelines[0].steps[0].class",
    ),
    (
        "skip-is-certain",
        ["pipelines", 0, "steps", 2, "skip_probability"],
        1,
        SimulationError,
        "steps[2].skip_probability",
    ),
    (
        "first-step-skips",
        ["pipelines", 0, "steps", 0, "skip_probability"],
        0.5,
        SimulationError,
        "steps[0].skip_probability",
    ),
    ("jitter-past-period", ["pipelines", 0, "jitter_s"], 7200, SimulationError, "pipelines[0].jitter_s"),
    ("negative-handoff", ["handoff_seconds"], -1, SimulationError, "--pipelines file.handoff_seconds"),
    ("bad-background", ["background"], "four-teams", SimulationError, "--pipelines background"),
    ("bad-cluster", ["cluster", "nodes"], 0, SimulationError, "--pipelines cluster.nodes"),
    ("team-clash", ["teams", 0, "name"], "research", SimulationError, "--pipelines teams"),
    ("bad-quota", ["teams", 0, "quotas", 0, "nominal"], -1, QuotaFileError, "nominal"),
]


def _bad(path: list[Any], value: Any) -> Any:
    document = copy.deepcopy(yaml.safe_load(PIPELINE_SCENARIOS["pipelines"].read_text()))
    where = document
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    return document


@pytest.mark.parametrize(("path", "value", "error", "field"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_pipelines_file_names_the_field(
    path: list[Any], value: Any, error: type[Exception], field: str
) -> None:
    with pytest.raises(error) as caught:
        parse_pipelines_file(_bad(path, value), PIPELINE_SCENARIOS["pipelines"].parent)
    assert field in str(caught.value)


def test_the_scenario_loads_and_its_runs_are_the_same_for_a_seed() -> None:
    plan = load_pipelines_file("pipelines")
    assert [p.name for p in plan.pipelines] == ["train-model", "features"]
    assert plan.teams.cluster is not None and "ml" in plan.teams.workloads
    runs = draw_runs(plan, 24 * 3600, 42)
    assert runs == draw_runs(plan, 24 * 3600, 42) != draw_runs(plan, 24 * 3600, 43)
    assert [r.arrival for r in runs] == sorted(r.arrival for r in runs)
    assert sum(r.pipeline == 0 for r in runs) == 12  # every two hours over a day


def _command(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["simulate", *argv])


def test_the_command_prints_the_pipelines_object_keyed_by_policy(capsys: pytest.CaptureFixture[str]) -> None:
    args = _command(
        "--mode",
        "queue",
        "--scenario",
        "pipelines",
        "--hours",
        "4",
        "--warmup-hours",
        "1",
        "--json",
        "--quiet",
    )
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "gpupool" and out["seed"] == 42
    assert list(out["pipelines"]) == list(PIPELINE_POLICIES)
    keys = {
        "run_latency_p50_s",
        "run_latency_p99_s",
        "inter_step_wait_p50_s",
        "inter_step_wait_p99_s",
        "idle_held_pct",
        "background_mean_wait_s",
    }
    for measures in out["pipelines"].values():
        assert keys <= set(measures)
        assert measures["runs"] > 0
        assert all(isinstance(measures[k], float) for k in keys)


def test_the_command_prints_a_table_of_the_policies_named(capsys: pytest.CaptureFixture[str]) -> None:
    args = _command(
        "--mode", "queue", "--scenario", "pipelines", "--hours", "2", "--warmup-hours", "1", "--quiet",
        "--pipeline-policy", "per-task", "--pipeline-policy", "ideal-reserve",
    )  # fmt: skip
    assert args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("gpupool governance, seed 42, 2.0 h after 1.0 h, 16 GPUs")
    assert [line.split()[0] for line in lines[2:]] == ["per-task", "ideal-reserve"]


def test_the_command_refuses_a_bad_pipelines_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "pipelines.yaml"
    bad.write_text(yaml.safe_dump(_bad(["pipelines", 0, "steps", 1, "gpus"], 0)))
    args = _command("--mode", "queue", "--pipelines", str(bad), "--quiet")
    assert args.func(args) == 2
    assert "--pipelines pipelines[0].steps[1].gpus" in capsys.readouterr().err
    for argv, named in (
        (("--mode", "queue", "--pipelines", str(tmp_path / "none.yaml")), "--pipelines"),
        (
            ("--mode", "queue", "--pipelines", str(bad), "--scenario", "pipelines"),
            "--pipelines and --scenario",
        ),
        (("--mode", "queue", "--scenario", "pipelines", "--pipeline-policy", "fifo"), "--pipeline-policy"),
        (
            ("--mode", "queue", "--scenario", "three-teams", "--pipeline-policy", "hand-on"),
            "--pipeline-policy",
        ),
        (("--mode", "fgd", "--pipelines", str(bad)), "--mode queue"),
    ):
        args = _command(*argv, "--quiet")
        assert args.func(args) == 2
        assert named in capsys.readouterr().err
