"""The simulator handles any trace: unreached points, MIG and GPU-memory columns, queue plots, bad arguments."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from airflow_gpupool.cli.simulate import UNREACHED, format_table, register
from airflow_gpupool.exceptions import SimulationError, TraceFormatError
from airflow_gpupool.resources import GpuKind
from airflow_gpupool.sim.plot import legend
from airflow_gpupool.sim.queue import simulate_queue
from airflow_gpupool.sim.replay import REPORT_POINTS, replay
from airflow_gpupool.sim.trace import EXAMPLE_NODES, EXAMPLE_PODS, load_nodes, load_pods

# One node of 8 GPUs and three pods: the arrived % jumps 12.5 points a pod, so most report
# points are never hit exactly.
SMALL_NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,8,A100\n"
SMALL_PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(
    f"p{i},1000,1024,1,1000\n" for i in range(3)
)


def _command(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["simulate", *argv])


@pytest.fixture
def small(tmp_path: Path) -> tuple[str, str]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(SMALL_NODES)
    pods.write_text(SMALL_PODS)
    return str(nodes), str(pods)


def test_points_a_trace_does_not_reach_are_null_in_json_and_a_dash_in_tables(small: tuple[str, str]) -> None:
    result = replay(load_nodes(small[0]), load_pods(small[1]), "gpupool", 42)

    summary = result.summary()
    text = json.dumps(summary, allow_nan=False)  # raises on NaN
    unreached = [p for p in REPORT_POINTS if summary[f"alloc_{p}"] is None]
    reached = [p for p in REPORT_POINTS if summary[f"alloc_{p}"] is not None]
    assert unreached and reached, text
    assert not any(isinstance(v, float) and math.isnan(v) for v in summary.values())
    row = format_table([result]).splitlines()[2]
    assert row.split()[1:] == [
        UNREACHED if p in unreached else f"{summary[f'alloc_{p}']:.2f}" for p in REPORT_POINTS
    ]
    assert "nan" not in format_table([result]).lower()
    assert "nan" not in legend(result).lower()
    assert legend(result).endswith(f"at {reached[-1]}%)")


def test_the_command_writes_json_without_nan(
    small: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = _command("--nodes", small[0], "--pods", small[1], "--json", "--quiet")

    assert args.func(args) == 0

    out = capsys.readouterr().out
    assert "NaN" not in out and "null" in out
    json.loads(out.splitlines()[0])


def test_trace_columns_carry_mig_and_gpu_memory_requests() -> None:
    nodes = {n.name: n for n in load_nodes(EXAMPLE_NODES)}
    pods = load_pods(EXAMPLE_PODS)

    mig_node = nodes["mig-a100-0"]
    assert all(g.partitioned for g in mig_node.gpus)
    assert [p for _, p in mig_node.gpus[0].mig_free] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert nodes["t4-0"].gpus[0].memory_mib == 15360
    kinds = {p.request.kind for p in pods}
    assert kinds == {GpuKind.MIG, GpuKind.FRACTION, GpuKind.WHOLE, GpuKind.NONE}
    assert any(p.request.gpu_memory_mib == 4096 and p.request.kind is GpuKind.FRACTION for p in pods)


def test_mig_requests_of_the_example_trace_go_to_mig_slices() -> None:
    nodes = load_nodes(EXAMPLE_NODES)
    result = replay(nodes, load_pods(EXAMPLE_PODS), "gpupool", 42)

    taken = sum(
        len(n.gpus[0].mig_free) < len(next(m for m in nodes if m.name == n.name).gpus[0].mig_free)
        for n in result.nodes
        if n.gpus and n.gpus[0].partitioned
    )
    assert taken >= 1
    assert result.failed < result.pods


def test_a_mig_row_with_several_gpus_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,mig_profile\np,1,1,1,0,1g.10gb\nq,1,1,2,0,1g.10gb\n"
    )

    with pytest.raises(TraceFormatError, match="line 3: column 'num_gpu'"):
        load_pods(path)


def test_an_unknown_mig_profile_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model,mig_profiles\nn,1,1,1,A100,9g.99gb\n")

    with pytest.raises(TraceFormatError, match="line 2: column 'mig_profiles'"):
        load_nodes(path)


def test_a_deletion_before_the_creation_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"
        "ok,1,1,1,1000,10,20\nbad,1,1,1,1000,50,40\n"
    )

    with pytest.raises(TraceFormatError) as err:
        load_pods(path)

    assert (err.value.row, err.value.column) == (3, "deletion_time")
    assert "40 precedes creation_time 50" in str(err.value)


def test_queue_mode_plots_waits_and_allocation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "queue.png"
    args = _command(
        "--mode", "queue", "--nodes", str(EXAMPLE_NODES), "--pods", str(EXAMPLE_PODS),
        "--queue-nodes", "0", "--arrivals", "300", "--plot", str(png), "--quiet",
    )  # fmt: skip

    assert args.func(args) == 0

    assert png.stat().st_size > 10_000
    assert "mean wait s" in capsys.readouterr().out


def test_queue_series_are_those_of_the_window() -> None:
    series: dict[str, object] = {}
    out = simulate_queue(
        load_nodes(EXAMPLE_NODES), load_pods(EXAMPLE_PODS), "gpupool", arrivals=300, series=series
    )

    waits = series["waits"]
    alloc = series["alloc"]
    assert isinstance(waits, list) and isinstance(alloc, list) and alloc
    assert max(waits) >= out["p99_wait_s"] >= 0
    assert all(out["warmup_hours"] - 0.1 <= h and 0 <= a <= 100 for h, a in alloc)


BAD_ARGUMENTS = [
    (["--mode", "queue", "--load", "0"], "--load 0.0: expected a positive number"),
    (["--mode", "queue", "--load", "-1"], "--load -1.0: expected a positive number"),
    (["--mode", "queue", "--queue-nodes", "-5"], "--queue-nodes -5: expected 0 (all nodes) or a positive"),
    (["--mode", "queue", "--arrivals", "-1"], "--arrivals -1"),
    (["--mode", "queue", "--hours", "0"], "--hours 0.0"),
    (
        ["--plot", "/no/such/folder/x.png"],
        "--plot '/no/such/folder/x.png': expected a PNG file in an existing folder",
    ),
    (["--mode", "queue", "--plot", "/no/such/folder/x.png"], "expected a PNG file in an existing folder"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_ARGUMENTS, ids=[" ".join(a) for a, _ in BAD_ARGUMENTS])
def test_bad_arguments_fail_early_with_what_to_fix(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    args = _command("--nodes", str(EXAMPLE_NODES), "--pods", str(EXAMPLE_PODS), "--quiet", *argv)

    assert args.func(args) == 2

    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.out == ""  # nothing ran


def test_simulate_queue_refuses_a_zero_load_with_a_typed_error() -> None:
    with pytest.raises(SimulationError, match="--load"):
        simulate_queue(load_nodes(EXAMPLE_NODES), load_pods(EXAMPLE_PODS), "gpupool", load=0)


def test_scale_replicates_the_cluster_and_the_pods(
    small: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_gpupool.sim.replay import scale_cluster

    nodes, pods = scale_cluster(load_nodes(small[0]), load_pods(small[1]), 3)

    assert [n.name for n in nodes] == ["n0-r0", "n0-r1", "n0-r2"]
    assert len(pods) == 9
    args = _command("--nodes", small[0], "--pods", small[1], "--scale", "3", "--json", "--quiet")
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["pods"] >= 9
    args = _command("--nodes", small[0], "--pods", small[1], "--scale", "0", "--quiet")
    assert args.func(args) == 2
    assert "--scale 0: expected a positive whole number" in capsys.readouterr().err
