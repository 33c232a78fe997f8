"""The JSON API and the metric show the forecast the controller stored (they only read it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from airflow_gpupool.forecast.step import refresh_forecasts
from airflow_gpupool.ledger import Ledger, LedgerForecasts
from airflow_gpupool.plugins.app import create_app
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import FakeClock, node
from tests.unit.metrics.test_collector import scrape


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    clock = FakeClock()
    ledger = Ledger.create(f"sqlite:///{tmp_path}/ledger.db", clock=clock)
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1, team="vision"), "holder")
    ledger.reserve(GpuRequest(gpus=1, team="vision"), "next", reservation_id="r-next")
    ledger.reserve(GpuRequest(gpus=1, team="vision"), "later", reservation_id="r-later")
    ledger.reserve(GpuRequest(gpus=1, team="nlp"), "nlp", reservation_id="r-nlp")
    yield ledger
    ledger.close()


def test_the_api_shows_the_stored_forecast(ledger: Ledger) -> None:
    app = create_app(lambda: ledger)
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer", role="viewer")
    client = TestClient(app)
    assert client.get("/api/v1/explain/r-next").json()["forecast"] is None  # no controller pass yet
    refresh_forecasts(ledger)
    stored = LedgerForecasts(ledger).get_many()
    assert client.get("/api/v1/explain/r-next").json()["forecast"] == stored["r-next"].to_dict()
    queue = client.get("/api/v1/snapshot").json()["queue"]
    assert {q["id"]: q["forecast"] for q in queue} == {rid: f.to_dict() for rid, f in stored.items()}


def test_the_metric_is_each_teams_next_start(ledger: Ledger) -> None:
    assert not [
        k for k in scrape(ledger) if k[0] == "gpupool_forecast_wait_seconds"
    ]  # none stored: no series
    refresh_forecasts(ledger)
    stored = LedgerForecasts(ledger).get_many()
    now = ledger.now()
    samples = {k: v for k, v in scrape(ledger).items() if k[0] == "gpupool_forecast_wait_seconds"}
    expected = {}
    for team, rid in (("vision", "r-next"), ("nlp", "r-nlp")):  # each team's first in service order
        f = stored[rid]
        for quantile, at in (("0.1", f.p10), ("0.5", f.p50), ("0.9", f.p90)):
            assert at is not None
            expected[("gpupool_forecast_wait_seconds", (("quantile", quantile), ("team", team)))] = at - now
    assert samples == pytest.approx(expected)


def test_the_page_shows_the_expected_start_with_its_range(ledger: Ledger) -> None:
    app = create_app(lambda: ledger, snapshot_ttl=0)
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer", role="viewer")
    client = TestClient(app)
    assert "no forecast yet" in client.get("/", params={"partial": 1}).text
    refresh_forecasts(ledger)
    f = LedgerForecasts(ledger).get("r-next")
    assert f is not None and f.p10 is not None and f.p50 is not None and f.p90 is not None
    html = client.get("/", params={"partial": 1}).text
    assert "<th>Expected start</th>" in html
    hhmm = [time.strftime("%H:%M", time.gmtime(t)) for t in (f.p10, f.p50, f.p90)]
    assert (
        f'title="80 % between {hhmm[0]} and {hhmm[2]} UTC; 64 replays of the queue as it stands (later'
        in html
    )
    assert f">{hhmm[1]}</span>" in html
