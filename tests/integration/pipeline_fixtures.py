"""What the pipelines' end-to-end tests share (issue 40): a ledger of the emulated cluster on each backend."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.ledger import Ledger, Reservation
from airflow_gpupool.task_try import TaskTry
from tests.integration.conftest import ledger_inventory


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def handon_ledger(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Ledger]:
    """A fresh ledger of the emulated cluster on each backend, named by the default gpupool connection."""
    url = (
        f"sqlite:///{tmp_path}/ledger.db"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_schema_url")
    )
    ledger = Ledger.create(url)
    ledger.upsert_nodes(ledger_inventory())
    extra = {"ledger_url": url, "poll_interval_seconds": 0.2}
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({"conn_type": "gpupool", "extra": extra}))
    yield ledger
    ledger.close()


def reservation_of(ledger: Ledger, dag_run: Any, task_id: str) -> Reservation:
    """Return the reservation of ``task_id``'s first try in ``dag_run``."""
    return ledger.get(TaskTry(dag_run.dag_id, task_id, dag_run.run_id).reservation_id)


def states(dag_run: Any) -> dict[str, str]:
    """Return each task's state in ``dag_run``."""
    return {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
