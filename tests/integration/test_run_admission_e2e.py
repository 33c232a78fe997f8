"""Admission of a run as a whole under dag.test(): the real operators, the emulator, SQLite and PostgreSQL.

``run_admission_fits`` peaks at 3 GPUs (train_a and train_b at once), ``run_admission_too_big`` at 4;
team vision's quota on pool a100 is 3 GPUs, so the second is refused before any pod exists.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import create_engine, select

from airflow_gpupool.governance.quotas import parse_quota_file
from airflow_gpupool.ledger import Ledger, LedgerQuotas, ReservationState
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer
from tests.integration.conftest import A100, ledger_inventory

QUOTA = "headroom: {share: 0}\nteams:\n  - {name: vision, quotas: [{flavor: {pool: a100}, nominal: 3}]}\n"


@pytest.fixture(params=["sqlite", "postgresql"])
def run_ledger(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Ledger]:
    """The emulated cluster's ledger on each backend, with team vision's quota, named by the connection."""
    url = (
        f"sqlite:///{tmp_path}/ledger.db"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_schema_url")
    )
    ledger = Ledger.create(url)
    ledger.upsert_nodes(ledger_inventory())
    LedgerQuotas(ledger).apply(parse_quota_file(yaml.safe_load(QUOTA)))
    extra = {"ledger_url": url, "poll_interval_seconds": 0.2}
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({"conn_type": "gpupool", "extra": extra}))
    yield ledger
    ledger.close()


def reservations(ledger: Ledger, dag_id: str = "run_admission_") -> dict[str, Any]:
    """The run's reservation rows by task id (the holder is ``dag/task/run/...``), with the run columns."""
    engine = create_engine(normalize_url(ledger.url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(schema.reservations)).all()
    finally:
        engine.dispose()
    return {row.holder.split("/")[1]: row for row in rows if row.holder.startswith(dag_id)}


def test_a_run_larger_than_its_team_quota_is_refused_with_the_reason_in_the_log(
    run_dag: Callable[[str], Any],
    k8s: KubernetesEmulatorServer,
    run_ledger: Ledger,
    capfd: pytest.CaptureFixture[str],
) -> None:
    dag_run = run_dag("run_admission_too_big")

    assert str(dag_run.state) == "failed"
    assert k8s.created_pods() == []  # refused up front: no step started
    out = capfd.readouterr()
    log = out.out + out.err
    assert "RunTooLargeError" in log
    assert "needs 4 GPUs at once (train_a, train_b)" in log
    assert "team vision's quota (nominal plus what it may borrow) can ever give (3 GPUs)" in log
    assert run_ledger.snapshot().grants == ()


def test_a_run_that_fits_waits_for_its_peak_then_runs(
    run_dag: Callable[[str], Any], k8s: KubernetesEmulatorServer, run_ledger: Ledger
) -> None:
    # Another vision job holds 1 GPU of its 3: the run's prep (1 GPU) would fit, its peak (3) does not.
    hold = run_ledger.reserve(
        GpuRequest(gpus=1, gpu_models=frozenset({A100}), team="vision"), "other", reservation_id="ra-hold"
    )
    assert hold.state is ReservationState.GRANTED
    released: dict[str, float] = {}

    def release() -> None:
        released["at"] = run_ledger.now()
        run_ledger.release("ra-hold")

    timer = threading.Timer(3.0, release)
    timer.start()
    try:
        dag_run = run_dag("run_admission_fits")
    finally:
        timer.cancel()

    assert str(dag_run.state) == "success"
    assert len(k8s.created_pods()) == 4
    rows = reservations(run_ledger)
    prep = rows["prep"]
    assert prep.run_peak_milli == 3000 and prep.run_key.startswith("run_admission_fits/")
    assert prep.granted_at >= released["at"]  # admitted only once its team's quota served the peak
    # The later steps reserve as usual.
    assert {t: rows[t].run_key for t in ("train_a", "train_b", "evaluate")} == dict.fromkeys(
        ("train_a", "train_b", "evaluate")
    )


def test_the_example_dag_is_admitted_as_a_run(
    run_dag: Callable[[str], Any], k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    # dags/pipeline_run_admission.py, without quotas: the pool's A100 node serves the peak of 3.
    dag_run = run_dag("pipeline_run_admission")

    assert str(dag_run.state) == "success"
    assert len(k8s.created_pods()) == 4
    rows = reservations(gpu_ledger, "pipeline_run_admission")
    assert rows["preprocess"].run_peak_milli == 3000
    assert rows["evaluate"].run_peak_milli is None
    assert gpu_ledger.snapshot().grants == ()
