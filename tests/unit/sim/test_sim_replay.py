"""The trace simulator on tiny CSV traces: loading, errors, the FGD protocol, queue mode, the command."""

from __future__ import annotations

import argparse
import json

import pytest

from airflow_gpupool.cli.simulate import register
from airflow_gpupool.exceptions import ConfigurationError, TraceFormatError
from airflow_gpupool.sim.fetch import trace_root
from airflow_gpupool.sim.queue import QUEUE_BASELINE, simulate_queue, whole_slots
from airflow_gpupool.sim.replay import replay, workload
from airflow_gpupool.sim.trace import NODE_LIST, TRACE_DIR_ENV, load_nodes, load_pods
from tests.skips import skip_or_fail

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"n{i},32000,131072,{g},{m}\n"
    for i, (g, m) in enumerate([(2, "T4"), (4, "G2"), (8, "G2"), (1, "V100M16")])
)
PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
    + "".join(
        f"p{i},{2000 + 1000 * (i % 3)},4096,{g},{m},{s},{q},Running,{i * 100},{i * 100 + 3600 * (1 + i % 4)},0\n"
        for i, (g, m, s, q) in enumerate(
            [
                (1, 500, "", "LS"),
                (1, 1000, "", "BE"),
                (2, 1000, "", "LS"),
                (0, 0, "", "BE"),
                (1, 250, "T4", "Burstable"),
                (4, 1000, "", "LS"),
            ]
            * 3
        )
    )
)


@pytest.fixture
def trace(tmp_path):
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return str(nodes), str(pods)


def test_load_trace(trace):
    nodes = load_nodes(trace[0])
    pods = load_pods(trace[1])
    assert [len(n.gpus) for n in nodes] == [2, 4, 8, 1]
    assert pods[0].request.gpu_milli == 500 and pods[0].request.priority == 2
    assert pods[4].request.gpu_models == frozenset({"T4"})
    assert pods[2].request.gpus == 2 and pods[2].gpu_milli == 2000


BAD = [
    ("missing-column", "name,cpu_milli,memory_mib,num_gpu\np,1,1,0\n", 0, "gpu_milli"),
    ("bad-number", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,0,0\nq,lots,1,0,0\n", 3, "cpu_milli"),
    ("bad-gpu-milli", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,2,500\n", 2, "gpu_milli"),
]


@pytest.mark.parametrize(("text", "row", "column"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_pod_trace_names_row_and_column(tmp_path, text, row, column):
    path = tmp_path / "pods.csv"
    path.write_text(text)
    with pytest.raises(TraceFormatError) as err:
        load_pods(str(path))
    assert (err.value.row, err.value.column) == (row, column)


def test_named_alibaba_trace_loads_from_the_trace_dir():
    try:
        trace_root(NODE_LIST)
    except ConfigurationError as e:
        skip_or_fail(
            f"no Alibaba trace (here: {TRACE_DIR_ENV}=../shared/traces): {e}", what="the full-trace test"
        )
    assert len(load_nodes()) == 1213
    assert len(load_pods("default")) == 8152


def test_named_trace_without_the_trace_dir_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.delenv(TRACE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty cache
    with pytest.raises(ConfigurationError, match="GPUPOOL_TRACE_DIR"):
        load_pods("default")


def test_named_trace_missing_from_the_trace_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(TRACE_DIR_ENV, str(tmp_path))
    with pytest.raises(ConfigurationError, match="no alibaba-gpu-v2023/openb_node_list_gpu_node.csv there"):
        load_nodes()


def test_workload_reaches_ratio_and_is_seeded(trace):
    pods = load_pods(trace[1])
    a, b = workload(pods, 15000, 42), workload(pods, 15000, 42)
    assert [p.name for p in a] == [p.name for p in b]
    assert sum(p.gpu_milli for p in a) >= 1.3 * 15000
    assert sum(p.gpu_milli for p in a[:-1]) < 1.3 * 15000


@pytest.mark.parametrize("policy", ["bestfit", "fgd", "gpupool", "random"])
def test_replay_accounts(trace, policy):
    result = replay(load_nodes(trace[0]), load_pods(trace[1]), policy, seed=42)
    assert result.arrived[-1] >= 130
    assert 0 < result.alloc[-1] <= 100
    assert result.failed > 0  # 130 % of the capacity cannot all fit
    summary = result.summary()
    assert {
        "policy",
        "seed",
        "pods",
        "failed",
        "alloc_100",
        "alloc_130",
        "frag_90",
        "seconds",
        "decision_ms_p50",
        "decision_ms_p99",
    } <= set(summary)


def test_whole_slots_round_fractions_up(trace):
    pod = load_pods(trace[1])[0]
    assert whole_slots(pod.request).gpus == 1 and whole_slots(pod.request).gpu_milli is None


@pytest.mark.parametrize("policy", ["gpupool", QUEUE_BASELINE])
def test_queue_mode(trace, policy):
    out = simulate_queue(
        load_nodes(trace[0]), load_pods(trace[1]), policy, load=1.0, seed=1, sample_nodes=0, arrivals=300
    )
    assert out["policy"] == policy and out["mean_wait_s"] >= 0 and out["p99_wait_s"] >= out["mean_wait_s"]
    assert 0 < out["mean_alloc"] <= 100


def _command(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpupool")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["simulate", *argv])


def test_command_json_and_plot(trace, tmp_path, capsys):
    png = tmp_path / "alloc.png"
    args = _command(
        "--nodes",
        trace[0],
        "--pods",
        trace[1],
        "--policy",
        "fgd",
        "--policy",
        "gpupool",
        "--json",
        "--plot",
        str(png),
        "--quiet",
    )
    assert args.func(args) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["policy"] for r in rows] == ["fgd", "gpupool"]
    assert png.stat().st_size > 1000


def test_command_table_and_errors(trace, tmp_path, capsys):
    args = _command("--nodes", trace[0], "--pods", trace[1], "--quiet")
    assert args.func(args) == 0
    assert "GPU allocation % at arrived %" in capsys.readouterr().out
    bad = tmp_path / "bad.csv"
    bad.write_text("sn,cpu_milli\nx,1\n")
    args = _command("--nodes", str(bad), "--pods", trace[1], "--quiet")
    assert args.func(args) == 2
    assert "column 'memory_mib'" in capsys.readouterr().err


def test_command_queue_mode(trace, capsys):
    args = _command(
        "--mode",
        "queue",
        "--nodes",
        trace[0],
        "--pods",
        trace[1],
        "--queue-nodes",
        "0",
        "--arrivals",
        "200",
        "--json",
        "--quiet",
    )
    assert args.func(args) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["policy"] for r in rows] == ["gpupool", QUEUE_BASELINE]


def test_offered_rate_is_load_times_capacity_over_mean_work():
    import numpy as np

    from airflow_gpupool.sim.queue import offered_rate

    milli = np.array([500.0, 1000.0, 0.0])
    durations = np.array([3600.0, 7200.0, 100.0])
    rate = offered_rate(4000, milli, durations, 0.8)
    # rate × mean(milli × duration) = 0.8 × capacity
    assert rate * (milli * durations).mean() == pytest.approx(0.8 * 4000)
    with pytest.raises(ValueError):
        offered_rate(4000, np.zeros(2), durations[:2], 1.0)


@pytest.mark.parametrize("policy", ["gpupool", QUEUE_BASELINE])
def test_queue_mode_measures_the_steady_state_window(trace, policy):
    out = simulate_queue(
        load_nodes(trace[0]),
        load_pods(trace[1]),
        policy,
        load=0.5,
        seed=3,
        sample_nodes=0,
        warmup_s=4 * 3600,
        window_s=200 * 3600,
    )
    assert out["warmup_hours"] == 4.0
    assert out["hours"] == pytest.approx(204, rel=0.1)
    # The arrivals offer what was asked for, and at half load a steady state carries it.
    assert out["offered_load"] == pytest.approx(0.5, rel=0.15)
    assert out["mean_alloc"] == pytest.approx(50, rel=0.25)


def test_where_lost_breaks_down_the_unallocated_capacity():
    from airflow_gpupool.placement import GpuState, NodeState
    from airflow_gpupool.sim.replay import where_lost

    nodes = [
        NodeState(
            "a",
            8000,
            65536,
            (GpuState(0, "T4", 15000, free_milli=190), GpuState(1, "T4", 15000, free_milli=0)),
            cpu_free=1000,
        ),
        NodeState("b", 8000, 65536, (GpuState(0, "T4", 15000), GpuState(1, "T4", 15000, free_milli=190))),
    ]
    out = where_lost(nodes)
    assert out["unallocated"] == pytest.approx((190 + 1000 + 190) / 40)
    assert out["whole_free"] == pytest.approx(25.0)
    assert out["slivers"] == pytest.approx(9.5)
    assert out["on_cpu_exhausted"] == pytest.approx(4.75)
    assert out["sliver_values"] == [[190, 2, 9.5]]


def test_replay_keeps_the_final_cluster(trace):
    result = replay(load_nodes(trace[0]), load_pods(trace[1]), "gpupool", seed=1)
    assert len(result.nodes) == 4
    assert sum(g.free_milli for n in result.nodes for g in n.gpus) < 15 * 1000
