"""``gpupool bench forecast``: the pass's cost, its floor, and the replay's caches changing no answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_gpupool.bench.forecast_bench import forecast_state, shared_rule_floor
from airflow_gpupool.cli import main
from airflow_gpupool.forecast import replay


def test_bench_forecast_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/b.db"
    argv = ["bench", "forecast", "--url", url, "--nodes", "12", "--waiting", "6", "--samples", "4"]
    ledger = [
        "--ledger-seconds",
        "1",
        "--ledger-clients",
        "2",
        "--ledger-rounds",
        "2",
        "--forecast-every",
        "0.5",
    ]
    assert main([*argv, *ledger, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["nodes"], result["waiting"], result["samples"]) == (12, 6, 4)
    assert sum(result["statuses"].values()) == 6
    assert result["running"] > 0 and result["pass_cpu_s"] > 0
    without, beside = result["ledger_phases_without"], result["ledger_phases_with"]
    assert len(without) == len(beside) == 2 and min(without + beside) > 0  # A, B, A, B
    ratios = sorted(b / a for a, b in zip(without, beside, strict=True))
    assert (result["ledger_ratio_min"], result["ledger_ratio_max"]) == (
        pytest.approx(ratios[0], abs=1e-3),
        pytest.approx(ratios[1], abs=1e-3),
    )
    assert result["forecaster_every_s"] == 0.5
    assert result["forecaster_passes"] >= 2  # the controller's step ran in each phase beside the ledger
    assert result["ledger_violations"] == 0


def test_the_floor_counts_every_pass_of_one_replay() -> None:
    floor = shared_rule_floor(12, 8, samples=4)
    assert floor["replay_passes"] >= 1
    assert floor["replay_visits"] >= 8  # the first pass visits every waiting request
    assert floor["floor_cpu_s"] == pytest.approx(
        4 * floor["replay_visits"] * floor["visit_cpu_us"] / 1e6, rel=0.01, abs=0.01
    )
    assert floor["floor_places_cpu_s"] == pytest.approx(
        4 * 8 * floor["place_cpu_ms"] / 1e3, rel=0.01, abs=0.01
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_replays_caches_change_no_forecast(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Enough waiting requests behind a full cluster that blocked requests spend their overtakes and hold nodes.
    state = forecast_state(24, 60, seed)
    args = (1000.0, state["nodes"], state["empty"], state["running"], state["waiting"], state["place"], 2)
    fast = replay.forecast_starts(*args, samples=6)
    monkeypatch.setattr(replay, "_ReplaySim", replay._Preempting)  # the simulator's queue, no caches
    plain = replay.forecast_starts(*args, samples=6)
    assert fast == plain
    assert len({f.p50 for f in fast}) > 10  # not a trivial queue: the starts spread out
