"""``gpupool bench ui`` builds the cluster it says and measures both pages (a smoke run, not a benchmark)."""

from __future__ import annotations

import json

import pytest

from airflow_gpupool.cli import main


def test_bench_ui_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    # 30 nodes (more than open by default): 6 T4 nodes of 4, so 24 T4 grants, then 16 A100 grants;
    # the 3 waiters ask for a T4 and wait.
    code = main(
        ["bench", "ui", "--nodes", "30", "--grants", "40", "--waiting", "3", "--requests", "2", "--json"]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["nodes"], result["gpus"], result["grants"], result["waiting"]) == (30, 216, 40, 3)
    for case in ("baseline", "refresh_cold", "refresh"):
        assert result[case]["kb"] > 0 and 0 < result[case]["ms_median"] <= result[case]["ms_max"]
    # Pools closed: the refresh draws no node card, the baseline draws all 30.
    assert result["refresh"]["kb"] < result["baseline"]["kb"]
    assert result["size_ratio"] == pytest.approx(result["refresh"]["kb"] / result["baseline"]["kb"], abs=1e-3)
