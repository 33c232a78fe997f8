"""GpuPodOperator(fail_fast_on_forecast=True): the trigger's ``forecast`` event withdraws the request and fails the try."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_gpupool.exceptions import GpuPoolError
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.operators import GpuPodOperator
from airflow_gpupool.operators.pod.waiting import reservation_deferral
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node


def test_the_option_reaches_the_trigger_and_is_off_by_default() -> None:
    assert GpuPodOperator(task_id="t", image="i", gpus=1).fail_fast_on_forecast is False
    trigger = reservation_deferral("r", None, 60, 1.0, fail_fast_on_forecast=True)["trigger"]
    assert trigger.serialize()[1]["fail_fast_on_forecast"] is True
    assert (
        reservation_deferral("r", None, 60, 1.0)["trigger"].serialize()[1]["fail_fast_on_forecast"] is False
    )


def test_a_forecast_event_withdraws_and_fails_with_the_forecast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger = Ledger.create(url)
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "holder")
    waiting = ledger.reserve(GpuRequest(gpus=1), "waiter")
    monkeypatch.setenv("GPUPOOL_LEDGER_URL", url)
    op = GpuPodOperator(task_id="fit", image="i", gpus=1, ledger_conn_id=None, fail_fast_on_forecast=True)
    ti = SimpleNamespace(dag_id="d", task_id="fit", run_id="r1", map_index=-1, try_number=1)
    said = "gave up before its reservation timeout (14:00 UTC): the forecast said at 0s: expected start 15:00 UTC"
    event = {"status": "forecast", "reservation_id": waiting.id, "message": said}

    with pytest.raises(GpuPoolError, match="withdrawn: gave up before its reservation timeout"):
        op.execute_granted({"ti": ti}, event)  # type: ignore[arg-type]
    assert ledger.get(waiting.id).state is not ReservationState.WAITING  # withdrawn, not left waiting
    ledger.close()
