"""``gpupool status`` and ``gpupool explain`` show the stored forecast, in words and in JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_gpupool.cli import main
from airflow_gpupool.forecast.step import refresh_forecasts
from airflow_gpupool.forecast.words import describe_forecast
from airflow_gpupool.ledger import Ledger, LedgerForecasts
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node


@pytest.fixture
def waiting(tmp_path: Path) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger = Ledger.create(url)
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "holder")
    rid = ledger.reserve(GpuRequest(gpus=1), "waiter").id
    refresh_forecasts(ledger)
    ledger.close()
    return url, rid


def test_status_shows_the_forecast(waiting: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    url, rid = waiting
    ledger = Ledger(url)
    forecast = LedgerForecasts(ledger).get(rid)
    assert forecast is not None and forecast.status == "forecast"
    assert main(["status", "--url", url]) == 0
    out = capsys.readouterr().out
    assert "START" in out and describe_forecast(forecast, ledger.now())[:20] in out
    assert main(["status", "--url", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["forecasts"][rid] == forecast.to_dict()


def test_explain_says_position_and_forecast(
    waiting: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, rid = waiting
    assert main(["explain", "--url", url, rid]) == 0
    out = capsys.readouterr().out
    assert "n1: needs 1 free GPUs" in out and "position 1 of 1; expected start " in out
    assert main(["explain", "--url", url, rid, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["state"] == "waiting" and got["forecast"]["status"] == "forecast"
