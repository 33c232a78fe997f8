"""The GPU pool page shows each node's books (granted, external, free GPUs) beside what the cluster runs, from the ledger alone."""

from __future__ import annotations

import re
from pathlib import Path

from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from airflow_gpupool.ledger import DriftRecord, Ledger, LedgerDriftRecords
from airflow_gpupool.plugins.app import create_app
from airflow_gpupool.plugins.books import BOOKS_TITLE, CLUSTER_TITLE
from airflow_gpupool.pod_gpus import ExternalPod, GpuUse
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node


def card(html: str, name: str) -> str:
    match = re.search(rf'<article class="node[^"]*" data-node="{name}">.*?</article>', html, re.S)
    assert match, name
    return match.group(0)


def test_each_node_card_shows_what_the_ledger_holds_there(tmp_path: Path) -> None:
    ledger = Ledger.create(f"sqlite:///{tmp_path}/ledger.db")
    ledger.upsert_nodes([node("gpu-a", gpus=4), node("cpu-1")])
    ledger.reserve(GpuRequest(gpus=1), "train", reservation_id="gp-1")
    ledger.sync_external([ExternalPod("default", "notebook", "u1", "gpu-a", GpuUse(whole=2))])
    app = create_app(lambda: ledger)
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer", role="viewer")
    try:
        html = TestClient(app).get("/").text
    finally:
        ledger.close()

    assert "ledger: 1 granted · 2 external · 1 free GPUs" in card(html, "gpu-a")
    assert BOOKS_TITLE in card(html, "gpu-a")
    assert "ledger:" not in card(html, "cpu-1")  # no GPUs: nothing to hold


def test_beside_the_books_the_card_shows_what_the_cluster_runs_and_the_drift(tmp_path: Path) -> None:
    ledger = Ledger.create(f"sqlite:///{tmp_path}/ledger.db")
    ledger.upsert_nodes([node("gpu-a", gpus=4), node("gpu-b", gpus=4), node("gpu-c", gpus=4)])
    now = ledger.now()
    LedgerDriftRecords(ledger).replace(
        [
            DriftRecord("gpu-a", 3.0, 2.0, ("external:default/nb: 0 → 2",), now - 120, now),
            DriftRecord("gpu-b", 1.0, 0.0, (), None, now),
        ]
    )
    app = create_app(lambda: ledger)
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer", role="viewer")
    try:
        web = TestClient(app)
        html = web.get("/").text
        api = web.get("/api/v1/snapshot").json()
    finally:
        ledger.close()

    drifting = card(html, "gpu-a")
    assert "ledger: 0 granted · 0 external · 4 free GPUs" in drifting
    assert "| cluster: 3 running" in drifting
    assert re.search(
        r'class="badge drift" title="external:default/nb: 0 → 2">drift 2 GPUs for 1[23]\ds<', drifting
    )
    assert CLUSTER_TITLE in drifting
    assert "| cluster: 1 running · no drift" in card(html, "gpu-b")
    assert "cluster:" not in card(html, "gpu-c")  # not judged by the controller yet
    assert api["drift"]["gpu-a"] == {
        "running_gpus": 3.0,
        "drift_gpus": 2.0,
        "mismatched": ["external:default/nb: 0 → 2"],
        "drifting_since": now - 120,
        "computed_at": now,
    }
    assert "gpu-c" not in api["drift"]
