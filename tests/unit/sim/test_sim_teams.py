"""Queue mode with teams: the three-teams scenario, the compared policies, teams files and the trace by QoS."""

from __future__ import annotations

import argparse
import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_gpupool.cli.simulate import register
from airflow_gpupool.exceptions import QuotaFileError, SimulationError
from airflow_gpupool.placement.snapshot import ClusterSnapshot
from airflow_gpupool.sim.synth import synthesize
from airflow_gpupool.sim.team_runs import simulate_teams, trace_jobs
from airflow_gpupool.sim.teams import SCENARIOS, generate_jobs, parse_teams_file, scenario
from airflow_gpupool.sim.trace import load_nodes, load_pods

HOUR = 3600.0


def _command(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["simulate", *argv])


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, Any]]:
    """Every policy on the same 14 simulated hours of the three-teams scenario, seed 42."""
    plan = scenario("three-teams")
    assert plan.cluster is not None
    nodes = plan.cluster.build()
    jobs = generate_jobs(plan, 14 * HOUR, seed=42)
    return {
        p: simulate_teams(nodes, jobs, plan, p, warmup_s=2 * HOUR, window_s=12 * HOUR)
        for p in ("gpupool", "kueue-like", "no-preemption", "airflow-pool")
    }


def test_the_scenario_is_the_same_for_a_seed_and_differs_across_seeds() -> None:
    plan = scenario("three-teams")
    assert plan.cluster is not None
    nodes = plan.cluster.build()
    once = simulate_teams(
        nodes, generate_jobs(plan, 8 * HOUR, 7), plan, "gpupool", warmup_s=HOUR, window_s=7 * HOUR
    )
    again = simulate_teams(
        nodes, generate_jobs(plan, 8 * HOUR, 7), plan, "gpupool", warmup_s=HOUR, window_s=7 * HOUR
    )
    other = simulate_teams(
        nodes, generate_jobs(plan, 8 * HOUR, 8), plan, "gpupool", warmup_s=HOUR, window_s=7 * HOUR
    )
    assert once == again
    assert once != other
    assert set(once["teams"]) == {"research", "data", "product"}
    assert once["gpus"] == 8


@pytest.mark.parametrize("seed", [42, 43, 44])
def test_every_seed_offers_the_files_load_in_the_warm_up_and_in_the_window(seed: int) -> None:
    plan = scenario("three-teams")
    warm, window = 24 * HOUR, 48 * HOUR
    jobs = generate_jobs(plan, warm + window, seed, warmup_s=warm)
    mean = {  # what the file's rates offer on average: bursts/h x jobs x mean duration x GPUs
        team: sum(
            w.bursts_per_hour / HOUR * w.jobs_per_burst * sum(w.duration_s) / 2 * w.milli
            for w in plan.workloads[team]
        )
        for team in plan.teams
    }
    for start, end in ((0.0, warm), (warm, warm + window)):
        capacity = 8000 * (end - start)
        offered = {}  # per team, GPU time overlapping the segment (as `offered_load` counts it)
        for team in plan.teams:
            offered[team] = sum(
                j.request.total_gpu_milli * max(0.0, min(j.arrival + j.work_s, end) - max(j.arrival, start))
                for j in jobs
                if j.team == team
            )
            burst = max(w.jobs_per_burst * w.duration_s[1] * w.milli for w in plan.workloads[team])
            # within a burst and a half: bursts at the segment's ends spill over them
            assert abs(offered[team] - mean[team] * (end - start)) <= 1.5 * burst, (team, start)
    # The window offers the file's 0.96 of the pool, where plain Poisson draws offered 0.949,
    # 1.175 and 0.841 for seeds 42, 43 and 44.
    assert abs(sum(offered.values()) / capacity - sum(mean.values()) / 8000) < 0.05


def test_preemption_with_a_checkpoint_grace_loses_far_less_work_than_stopping_victims(
    runs: dict[str, dict[str, Any]],
) -> None:
    ours, kueue = runs["gpupool"], runs["kueue-like"]
    assert kueue["preemptions_total"] > 0 and ours["preemptions_total"] > 0
    assert ours["lost_gpu_s_total"] < 0.2 * kueue["lost_gpu_s_total"]
    # The training team checkpoints on SIGTERM: it loses nothing, it only spends the writing time.
    assert ours["teams"]["research"]["lost_gpu_s"] == 0
    assert ours["teams"]["research"]["grace_gpu_s"] > 0
    assert kueue["grace_gpu_s_total"] == 0
    assert kueue["teams"]["research"]["lost_gpu_s"] > 0


def test_urgent_work_waits_least_with_preemption_and_longest_in_an_airflow_pool(
    runs: dict[str, dict[str, Any]],
) -> None:
    p99 = {p: r["high_priority_p99_wait_s"] for p, r in runs.items()}
    assert p99["gpupool"] <= 120  # at most the grace
    assert p99["no-preemption"] > 10 * p99["gpupool"]
    assert p99["airflow-pool"] > 10 * p99["gpupool"]
    for policy in ("no-preemption", "airflow-pool"):
        assert runs[policy]["preemptions_total"] == 0 and runs[policy]["lost_gpu_s_total"] == 0


def test_the_measures_are_consistent(runs: dict[str, dict[str, Any]]) -> None:
    for result in runs.values():
        shares = sum(t["share"] for t in result["teams"].values())
        assert shares == pytest.approx(result["mean_alloc"] / 100, abs=0.01)
        assert 0 < result["jain_fairness"] <= 1
        assert sum(t["nominal_share"] for t in result["teams"].values()) == pytest.approx(1.0)
    # The airflow pool knows no quota: research borrows the most there.
    borrowed = {p: r["teams"]["research"]["borrowed_gpu_s"] for p, r in runs.items()}
    assert borrowed["airflow-pool"] == max(borrowed.values())


def _base() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(SCENARIOS["three-teams"].read_text())
    return document


def _bad(path: list[Any], value: Any) -> dict[str, Any]:
    document = copy.deepcopy(_base())
    target: Any = document
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return document


BAD = [
    ("unknown-top-key", ["quota"], 1, SimulationError, "file: unknown key"),
    ("headroom-above-one", ["headroom"], 1.5, SimulationError, "headroom"),
    ("headroom-lent-not-bool", ["headroom_lent"], "yes", SimulationError, "headroom_lent"),
    ("no-workloads", ["teams", 0, "workloads"], [], SimulationError, "teams[0].workloads"),
    ("workload-unknown-key", ["teams", 0, "workloads", 0, "gpu"], 1, SimulationError, "unknown key"),
    (
        "both-gpus-and-milli",
        ["teams", 0, "workloads", 0, "gpu_milli"],
        500,
        SimulationError,
        "gpus/gpu_milli",
    ),
    ("whole-milli", ["teams", 2, "workloads", 0, "gpu_milli"], 1000, SimulationError, "gpu_milli"),
    ("bad-class", ["teams", 0, "workloads", 0, "class"], "gaming", SimulationError, "class"),
    ("bad-duration", ["teams", 0, "workloads", 0, "duration_s"], [10, 5], SimulationError, "duration_s"),
    (
        "negative-bursts",
        ["teams", 0, "workloads", 0, "bursts_per_hour"],
        -1,
        SimulationError,
        "bursts_per_hour",
    ),
    ("preemptible-text", ["teams", 0, "workloads", 0, "preemptible"], "yes", SimulationError, "preemptible"),
    ("priority-float", ["teams", 0, "workloads", 0, "priority"], 1.5, SimulationError, "priority"),
    ("cluster-model", ["cluster", "model"], KeyError, SimulationError, "cluster.model"),
    ("cluster-nodes", ["cluster", "nodes"], 0, SimulationError, "cluster.nodes"),
    ("negative-nominal", ["teams", 0, "quotas", 0, "nominal"], -1, QuotaFileError, "nominal"),
    (
        "two-flavors",
        ["teams", 1, "quotas", 0, "flavor"],
        {"model": "H100"},
        SimulationError,
        "one flavor",
    ),
]


@pytest.mark.parametrize(("path", "value", "error", "field"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_teams_file_names_the_field(
    path: list[Any], value: Any, error: type[Exception], field: str
) -> None:
    with pytest.raises(error) as caught:
        parse_teams_file(_bad(path, value))
    assert field in str(caught.value)


def test_the_command_prints_one_json_object_per_policy(capsys: pytest.CaptureFixture[str]) -> None:
    args = _command(
        "--mode",
        "queue",
        "--scenario",
        "three-teams",
        "--hours",
        "3",
        "--warmup-hours",
        "1",
        "--json",
        "--quiet",
    )
    assert args.func(args) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["policy"] for r in rows] == ["gpupool", "kueue-like", "no-preemption", "airflow-pool"]
    for key in ("teams", "jain_fairness", "high_priority_p99_wait_s", "lost_gpu_s_total", "mean_alloc"):
        assert all(key in r for r in rows)
    team = rows[0]["teams"]["research"]
    assert {
        "mean_wait_s",
        "p99_wait_s",
        "share",
        "nominal_share",
        "borrowed_gpu_s",
        "preemptions",
        "lost_gpu_s",
    } <= set(team)


def test_the_command_refuses_a_bad_teams_file_and_bad_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "teams.yaml"
    bad.write_text(yaml.safe_dump(_bad(["teams", 0, "workloads", 0, "gpus"], 0)))
    args = _command("--mode", "queue", "--teams", str(bad), "--quiet")
    assert args.func(args) == 2
    assert "--teams teams[0].workloads[0].gpus" in capsys.readouterr().err
    for argv, named in (
        (("--mode", "queue", "--teams", str(tmp_path / "none.yaml")), "--teams"),
        (
            ("--mode", "queue", "--scenario", "three-teams", "--teams-from", "qos"),
            "--scenario and --teams-from",
        ),
        (
            ("--mode", "queue", "--scenario", "three-teams", "--policy", "gpupool", "--policy", "fgd"),
            "--policy",
        ),
        (("--mode", "fgd", "--scenario", "three-teams"), "--mode queue"),
    ):
        args = _command(*argv, "--quiet")
        assert args.func(args) == 2
        assert named in capsys.readouterr().err


def test_the_trace_by_qos_class_gives_each_class_a_team_and_runs(tmp_path: Path) -> None:
    synthesize(tmp_path, nodes=12, pods=300, seed=3)
    root = tmp_path / "alibaba-gpu-v2023"
    nodes = load_nodes(root / "openb_node_list_gpu_node.csv")
    pods = load_pods(root / "openb_pod_list_default.csv")
    jobs, plan = trace_jobs(nodes, pods, load=1.2, span_s=30 * HOUR, seed=1)
    assert set(plan.teams) == {"LS", "BE", "Burstable", "Guaranteed"}
    assert sum(plan.nominal_milli(t) for t in plan.teams) == pytest.approx(
        ClusterSnapshot(tuple(nodes)).gpu_capacity_milli, abs=4
    )
    assert all(j.request.preemptible == (j.team in {"BE", "Burstable"}) for j in jobs)
    ours = simulate_teams(nodes, jobs, plan, "gpupool", warmup_s=6 * HOUR, window_s=24 * HOUR)
    kueue = simulate_teams(nodes, jobs, plan, "kueue-like", warmup_s=6 * HOUR, window_s=24 * HOUR)
    assert set(ours["teams"]) == set(plan.teams)
    assert ours["lost_gpu_s_total"] <= kueue["lost_gpu_s_total"]


def test_idle_capacity_is_split_by_whether_work_waited() -> None:
    """Seven 1-GPU batches of a team capped at 5.5 GPUs: two wait an hour while 3 GPUs idle.

    Window 0.5 h-2.5 h of 8 GPUs (16 GPU-h): 8 GPU-h idle before the arrival at 1 h and 6 after
    the five first end at 2 h (7 GPU-h with nothing waiting), 3 GPU-h idle while two wait.
    """
    plan = scenario("three-teams")
    assert plan.cluster is not None
    template = next(j for j in generate_jobs(plan, 6 * HOUR, seed=1) if j.team == "data")
    jobs = [replace(template, seq=i, arrival=HOUR, work_s=HOUR) for i in range(7)]
    result = simulate_teams(plan.cluster.build(), jobs, plan, "gpupool", warmup_s=HOUR / 2, window_s=2 * HOUR)
    assert result["mean_alloc"] == pytest.approx(37.5)
    assert result["idle_while_waiting_pct"] == pytest.approx(18.75)
    assert result["idle_queue_empty_pct"] == pytest.approx(43.75)


def test_mean_allocation_and_idle_time_add_up(runs: dict[str, dict[str, Any]]) -> None:
    for result in runs.values():
        total = result["mean_alloc"] + result["idle_queue_empty_pct"] + result["idle_while_waiting_pct"]
        assert total == pytest.approx(100, abs=0.02)


def test_the_instant_entitlement_does_not_count_demand_above_the_nominal_quota() -> None:
    """Data (nominal 2.5 GPUs) asks for 1 GPU in the window's first hour and 4 in its second.

    Averaged over the window its demand (5 GPU-h of 16) equals its nominal share; at each instant
    it is entitled to min(2.5, demand): 1 + 2.5 = 3.5 GPU-h. It gets all 5 GPU-h.
    """
    plan = scenario("three-teams")
    assert plan.cluster is not None
    template = next(j for j in generate_jobs(plan, 6 * HOUR, seed=1) if j.team == "data")
    jobs = [replace(template, seq=0, arrival=HOUR / 2, work_s=HOUR)]
    jobs += [replace(template, seq=i, arrival=1.5 * HOUR, work_s=HOUR) for i in range(1, 5)]
    result = simulate_teams(plan.cluster.build(), jobs, plan, "gpupool", warmup_s=HOUR / 2, window_s=2 * HOUR)
    data = result["teams"]["data"]
    assert data["share"] == pytest.approx(5 / 16, abs=1e-4)
    assert data["share_of_entitled"] == pytest.approx(1.0)
    assert data["instant_entitled_share"] == pytest.approx(3.5 / 16, abs=1e-4)
    assert data["share_of_instant_entitled"] == pytest.approx(5 / 3.5, abs=1e-3)
    assert result["teams"]["research"]["share_of_instant_entitled"] is None  # no demand


def test_work_that_is_not_urgent_stays_out_of_the_headroom_within_its_nominal_quota() -> None:
    """Research (non-preemptible here) holds 6 of 8 GPUs, the most outside the 1.6 kept; data asks.

    Data's 1-GPU batches, within its nominal 2.5 GPUs, wait for research to end whether or not
    they are preemptible (the file's headroom is not lent): only urgent work holds the headroom.
    With research at 4 GPUs, two batches fit outside the headroom and a third waits though GPUs
    are free.
    """
    plan = replace(scenario("three-teams"), headroom_lent=False)
    assert plan.cluster is not None
    generated = generate_jobs(plan, 6 * HOUR, seed=1)

    def job(team: str, seq: int, arrival: float, work_s: float, *, preemptible: bool) -> Any:
        template = next(j for j in generated if j.team == team)
        request = replace(template.request, preemptible=preemptible)
        return replace(template, seq=seq, arrival=arrival, work_s=work_s, request=request)

    def waits(research: int, data: int, *, preemptible: bool) -> dict[str, Any]:
        jobs = [job("research", i, 0.0, 3 * HOUR, preemptible=False) for i in range(research)]
        jobs += [job("data", research + i, HOUR / 2, HOUR / 2, preemptible=preemptible) for i in range(data)]
        result = simulate_teams(plan.cluster.build(), jobs, plan, "gpupool", warmup_s=0.0, window_s=4 * HOUR)
        return dict(result["teams"]["data"])

    assert waits(3, 2, preemptible=False)["mean_wait_s"] == pytest.approx(2.5 * HOUR, rel=0.01)
    assert waits(3, 2, preemptible=True)["mean_wait_s"] == pytest.approx(2.5 * HOUR, rel=0.01)
    # Research holds 4: two batches fit outside the headroom, the third would leave 1 GPU of the 1.6.
    assert waits(2, 3, preemptible=False)["mean_wait_s"] == pytest.approx(HOUR / 2 / 3, rel=0.01)
