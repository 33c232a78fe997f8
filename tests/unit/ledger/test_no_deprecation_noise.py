"""The ledger's common path raises no SQLAlchemy deprecation warning (they reach the demo and every task log)."""

from __future__ import annotations

import warnings
from pathlib import Path

from sqlalchemy.exc import SADeprecationWarning

from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node


def test_reserve_release_and_snapshot_warn_about_nothing(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Ledger.create(f"sqlite:///{tmp_path}/ledger.db") as ledger:
            ledger.upsert_nodes([node("n1", gpus=2, model="A100")])
            held = ledger.reserve(GpuRequest(gpus=1), "t@w", ttl=60)
            ledger.snapshot()
            ledger.release(held.id)
            ledger.snapshot()
    assert [str(w.message) for w in caught if issubclass(w.category, SADeprecationWarning)] == []
