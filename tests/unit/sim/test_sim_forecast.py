"""``gpupool simulate --mode queue --forecast``: the forecast backtest on a trace and on three-teams."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.cli.simulate import register
from airflow_gpupool.sim.synth import synthesize

SHARES = ("coverage_p10_p90", "below_p10", "above_p90")
BOUNDS = (
    "oracle_coverage",
    "delayed_by_later_arrivals",
    "coverage_of_no_arrival_start",
    "above_p90_by_later_arrivals",
)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]], str]:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["simulate", "--mode", "queue", "--json", "--quiet", *argv])
    code = args.func(args)
    out = capsys.readouterr()
    return code, [json.loads(line) for line in out.out.splitlines() if line.startswith("{")], out.err


@pytest.fixture
def trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synthesize(tmp_path, nodes=8, pods=200, seed=1)
    monkeypatch.setenv("GPUPOOL_TRACE_DIR", str(tmp_path))


def _check(forecast: dict[str, Any]) -> None:
    assert forecast["requests"] > 0, forecast
    for key in SHARES:
        assert 0.0 <= forecast[key] <= 1.0, (key, forecast)
    # Each scored start is inside [p10, p90], below it or above it: the three shares add up to 1.
    assert sum(forecast[k] for k in SHARES) == pytest.approx(1.0, abs=0.002), forecast
    for key in BOUNDS:
        assert 0.0 <= forecast["bounds"][key] <= 1.0, (key, forecast)
    assert forecast["width_median_s"] >= 0
    assert forecast["p50_abs_error_median_s"] >= 0
    assert set(forecast["baselines"]) == {"declared", "naive", "oracle"}
    for baseline in forecast["baselines"].values():
        assert baseline["p50_abs_error_median_s"] >= 0
    later = forecast["at_changes"]  # the forecasts made after arrival, while the request waited
    assert later["forecasts"] >= later["requests"] > 0, later
    assert 0.0 <= later["coverage_p10_p90"] <= 1.0 and later["p50_abs_error_median_s"] >= 0, later


QUEUE = ("--queue-nodes", "4", "--load", "1.0", "--arrivals", "200", "--forecast-samples", "4")


def test_the_trace_backtest_scores_its_forecasts_and_leaves_the_run_as_it_was(
    trace: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, rows, err = _run(capsys, *QUEUE, "--policy", "gpupool", "--forecast")
    assert code == 0, err
    (row,) = rows
    _check(row["forecast"])
    assert row["forecast"]["samples"] == 4
    # The backtest only reads the simulation: the same run without it measures the same.
    code, (plain,), err = _run(capsys, *QUEUE[:-2], "--policy", "gpupool")
    assert code == 0, err
    assert "forecast" not in plain
    assert {k: v for k, v in row.items() if k != "forecast"} == plain


def test_the_three_teams_backtest_adds_forecast_to_each_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code, rows, err = _run(
        capsys,
        "--scenario",
        "three-teams",
        "--policy",
        "gpupool",
        "--policy",
        "airflow-pool",
        "--warmup-hours",
        "1",
        "--hours",
        "3",
        "--forecast",
        "--forecast-samples",
        "4",
    )
    assert code == 0, err
    assert [r["policy"] for r in rows] == ["gpupool", "airflow-pool"]
    for row in rows:
        _check(row["forecast"])


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--mode", "fgd", "--forecast"), "--forecast '--mode fgd'"),
        (("--scenario", "pipelines", "--forecast"), "--forecast 'with pipelines'"),
        (("--forecast-samples", "8"), "--forecast-samples 8"),
        (("--forecast", "--forecast-samples", "0"), "--forecast-samples 0"),
    ],
)
def test_a_bad_combination_is_refused_with_what_to_do(
    argv: tuple[str, ...], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, rows, err = _run(capsys, *argv)
    assert code == 2
    assert not rows
    assert named in err and "expected" in err
