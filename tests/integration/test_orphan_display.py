"""An orphaned grant shows in ``gpupool status`` (and --json), the UI page's grants table and the metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_gpupool.cli import main
from airflow_gpupool.ledger import Ledger, ledger_totals
from airflow_gpupool.metrics import ledger_metrics
from airflow_gpupool.plugins.page import grants_html
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import FakeClock, node


@pytest.fixture
def orphaned(tmp_path: Path) -> tuple[str, Ledger]:
    url = f"sqlite:///{tmp_path}/ledger.db"
    clock = FakeClock()
    ledger = Ledger.create(url, clock=clock)
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.reserve(GpuRequest(gpus=1), "worker-1", ttl=4, reservation_id="gp-orphan")
    ledger.reserve(GpuRequest(gpus=1), "worker-2", ttl=600, reservation_id="gp-live")
    ledger.bind("gp-orphan", namespace="ml", name="train-0", uid="uid-0")
    clock.advance(10)
    assert ledger.reap().orphaned == ("gp-orphan",)
    return url, ledger


def test_status_shows_the_orphan(orphaned: tuple[str, Ledger], capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = orphaned
    assert main(["status", "--url", url]) == 0
    out = capsys.readouterr().out
    assert "Grants (2, 1 orphaned)" in out
    (line,) = [row for row in out.splitlines() if row.startswith("gp-orphan")]
    assert "orphaned" in line and "pod ml/train-0" in line
    assert main(["status", "--url", url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["orphaned"] == ["gp-orphan"]
    states = {g["id"]: (g["state"], g["grant"]["pod_uid"]) for g in data["grants"]}
    assert states == {"gp-orphan": ("orphaned", "uid-0"), "gp-live": ("granted", None)}


def test_the_page_and_the_metrics_show_the_orphan(orphaned: tuple[str, Ledger]) -> None:
    _, ledger = orphaned
    snapshot = ledger.snapshot()
    html = grants_html(snapshot, "")
    assert html.count('class="state s-orphaned"') == 1 and "<code>ml/train-0</code>" in html
    metrics = {m.name: m for m in ledger_metrics(snapshot, ledger_totals(ledger.url))}
    assert [s.value for s in metrics["gpupool_orphaned_grants"].samples] == [1]
    assert sum(s.value for s in metrics["gpupool_active_grants"].samples) == 2
    assert snapshot.gpu_allocated_milli == 2000
    ledger.close()
