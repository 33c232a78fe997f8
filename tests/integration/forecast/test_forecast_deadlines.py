"""A DAG's Airflow deadline beside the GPU forecast, under dag.test() on the emulator.

The A100 node is full (a holder with no history: the prior's hour); the controller's step
stores the forecast while the task waits (deferred, or in place), then the holder ends. A deadline a minute
after the run started lies before the forecast's p10: the trigger (or the waiting task) warns and the task records
the ``gpupool_deadline`` XCom, then runs once granted. The example's two hours are reachable:
no warning, no XCom.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from airflow_gpupool.forecast.deadlines import XCOM_DEADLINE_KEY
from airflow_gpupool.forecast.step import refresh_forecasts
from airflow_gpupool.ledger import Ledger, LedgerForecasts
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer

A100 = "NVIDIA-A100-SXM4-80GB"


@pytest.fixture
def scheduler_side_without_alerts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Work around Airflow 3.3.2's ``dag.test()`` with a ``DeadlineAlert``: it crashes when the run succeeds.

    ``dag.test()`` builds its scheduler-side DAG straight from ``serialize_dag`` (the alerts stay
    dicts; the DAG processor replaces them by stored ids) and ``DagRun.update_state`` then looks
    each one up by id (``'dict' object has no attribute 'hex'``). Under ``dag.test()`` the alert is
    skipped anyway (no ``queued_at``), so only that copy drops them; the worker still parses the
    DAG file and reads the alert, which is what is tested here.
    """
    from airflow.serialization.serialized_objects import DagSerialization

    deserialize = DagSerialization.deserialize_dag

    def without_alerts(*args: Any, **kwargs: Any) -> Any:
        dag = deserialize(*args, **kwargs)
        dag.deadline = None
        return dag

    monkeypatch.setattr(DagSerialization, "deserialize_dag", without_alerts)


def deadline_xcoms(dag_id: str) -> list[Any]:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel).filter_by(dag_id=dag_id, key=XCOM_DEADLINE_KEY).all()
        return [XComModel.deserialize_value(row) for row in rows]


def forecast_then_release(
    ledger: Ledger, blocker_id: str, dag_id: str, stored: list[Any], *, warned: bool
) -> threading.Thread:
    """The controller's forecast step once the task waits; the holder ends once the waiter had time to react."""

    def run() -> None:
        until = time.monotonic() + 60
        while not ledger.snapshot().queue and time.monotonic() < until:
            time.sleep(0.05)
        refresh_forecasts(ledger)
        stored.extend(LedgerForecasts(ledger).get_many().values())
        # The room's poll (0.2 s) wakes the waiter on the new forecast: a warning comes within a
        # second on a quiet machine (30 s allowed for a loaded one); without one, 2 s show none came.
        until = time.monotonic() + (30 if warned else 2)
        while not deadline_xcoms(dag_id) and time.monotonic() < until:
            time.sleep(0.1)
        ledger.release(blocker_id, reason="the other task finished")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("dag_id", "warned"),
    [
        ("gpu_deadline_unreachable", True),
        ("gpu_deadline_unreachable_in_place", True),
        ("deadline_retraining", False),
    ],
    ids=["unreachable", "unreachable-in-place", "reachable"],
)
def test_a_deadline_before_the_forecasts_p10_is_said_early(
    dagbag: Any,
    k8s: KubernetesEmulatorServer,
    gpu_ledger: Ledger,
    capfd: pytest.CaptureFixture[str],
    scheduler_side_without_alerts: None,
    dag_id: str,
    warned: bool,
) -> None:
    blocker = gpu_ledger.reserve(GpuRequest(gpus=4, gpu_models=[A100]), "other-task")
    stored: list[Any] = []
    helper = forecast_then_release(gpu_ledger, blocker.id, dag_id, stored, warned=warned)

    dag_run = dagbag.get_dag(dag_id).test()

    helper.join(timeout=40)
    assert str(dag_run.state) == "success"
    (forecast,) = stored
    assert forecast.status == "forecast" and forecast.p10 is not None
    started = dag_run.start_date.timestamp()
    out, err = capfd.readouterr()
    xcoms = deadline_xcoms(dag_id)
    if not warned:
        assert started + 2 * 3600 > forecast.p10  # the example's deadline is reachable
        assert xcoms == []
        assert "cannot start before the DAG's deadline" not in out + err
        return
    assert started + 60 < forecast.p10  # the case is what it claims: the deadline lies before p10
    (xcom,) = xcoms
    (missed,) = xcom["unreachable"]
    assert missed["name"] == "within a minute"
    assert missed["at"] == pytest.approx(started + 60, abs=1)
    assert missed["message"].startswith("cannot start before the DAG's deadline 'within a minute' (")
    assert "(10 %), is later; expected start" in missed["message"]
    assert xcom["forecast"] == forecast.to_dict()
    assert missed["message"] in out + err  # the trigger's warning, and the task's
