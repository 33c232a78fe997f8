"""GpuJobOperator beside a DAG's deadlines: its wait carries them, and a ``deadline`` event is said, then waited on.

A gang's forecast says "unknown" for now, so no deadline is flagged for it under ``dag.test()``;
what is tested here is the wiring the gang shares with GpuPodOperator: the deferral carries the
run's deadlines, and the trigger's ``deadline`` event records the XCom and defers again with the
deadline marked said, the gang still waiting. On both backends.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.providers.common.compat.sdk import TaskDeferred

from airflow_gpupool.forecast.deadlines import XCOM_DEADLINE_KEY, DagDeadline
from airflow_gpupool.ledger import Ledger, ReservationState, StartForecast
from airflow_gpupool.operators import GpuJobOperator
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node

pytest.importorskip("airflow.sdk.definitions.deadline")  # Airflow 3.1 has no DeadlineAlert


class RecordingTi(SimpleNamespace):
    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed.append((key, value))


def _ti() -> RecordingTi:
    return RecordingTi(dag_id="d", task_id="train", run_id="r1", map_index=-1, try_number=1, pushed=[])


@pytest.fixture
def waiting_gang(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Ledger, GpuJobOperator]:
    """Two one-GPU nodes, both held; a gang of two one-GPU members can only wait."""
    ledger = Ledger.create(ledger_url, policy="bestfit")
    ledger.upsert_nodes([node("n1", gpus=1), node("n2", gpus=1)])
    for holder in ("holder-1", "holder-2"):
        ledger.reserve(GpuRequest(gpus=1), holder, ttl=600)
    monkeypatch.setenv("GPUPOOL_LEDGER_URL", ledger_url)
    op = GpuJobOperator(
        task_id="train", name="train", members=2, gpus=1, image="i", ledger_conn_id=None, deferrable=True
    )
    yield ledger, op
    ledger.close()


def test_the_deferred_gang_carries_the_runs_deadlines(waiting_gang: tuple[Ledger, GpuJobOperator]) -> None:
    from airflow.sdk import DAG, AsyncCallback, DeadlineAlert, DeadlineReference

    from airflow_gpupool.notifiers.deadline import log_missed_deadline

    ledger, op = waiting_gang
    started = datetime.now(UTC)
    dag = DAG(
        "d",
        schedule=None,
        deadline=DeadlineAlert(
            reference=DeadlineReference.DAGRUN_QUEUED_AT,
            interval=timedelta(minutes=1),
            callback=AsyncCallback(log_missed_deadline),
            name="within a minute",
        ),
    )
    context = {"ti": _ti(), "dag": dag, "dag_run": SimpleNamespace(logical_date=None, start_date=started)}
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)  # type: ignore[arg-type]
    trigger = deferred.value.trigger
    assert trigger.deadlines == [DagDeadline("within a minute", (started + timedelta(minutes=1)).timestamp())]
    assert ledger.get(trigger.reservation_id).state is ReservationState.WAITING


def test_a_deadline_event_is_recorded_and_the_gang_waits_on(
    waiting_gang: tuple[Ledger, GpuJobOperator],
) -> None:
    ledger, op = waiting_gang
    rid = ledger.reserve(op.gpu_request(), "gang-holder", reservation_id="gang-1", timeout=600).id
    assert ledger.get(rid).state is ReservationState.WAITING
    forecast = StartForecast(rid, 1000.0, "never", reason="never, on the current nodes")
    said = "cannot start before the DAG's deadline 'within a minute' (10:01 UTC): never, on the current nodes"
    event = {
        "status": "deadline",
        "reservation_id": rid,
        "message": said,
        "unreachable": [{"name": "within a minute", "at": 1060.0, "message": said}],
        "deadlines": [DagDeadline("within a minute", 1060.0, warned=True).to_dict()],
        "forecast": forecast.to_dict(),
    }
    ti = _ti()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_granted({"ti": ti}, event)  # type: ignore[arg-type]
    assert deferred.value.method_name == "execute_granted"
    assert deferred.value.trigger.deadlines == [DagDeadline("within a minute", 1060.0, warned=True)]
    assert ti.pushed == [
        (
            XCOM_DEADLINE_KEY,
            {"reservation_id": rid, "unreachable": event["unreachable"], "forecast": forecast.to_dict()},
        )
    ]
    assert ledger.get(rid).state is ReservationState.WAITING  # kept its place, not released
