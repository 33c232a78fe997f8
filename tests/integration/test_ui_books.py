"""The GPU pool page shows each node's books (granted, external, free GPUs) from the ledger alone."""

from __future__ import annotations

import re
from pathlib import Path

from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from airflow_gpupool.ledger import Ledger
from airflow_gpupool.plugins.app import create_app
from airflow_gpupool.plugins.books import BOOKS_TITLE
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
