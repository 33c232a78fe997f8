"""The pod's own outcome wins over reconcile: a grant released by the controller because its pod
ended is recorded as the pod ended (``released``, or its failure class), never as a lost lease.

Real ``dag.test()``, the real KubernetesPodOperator over HTTP to the emulator, the controller
reconciling every second in a thread, real SQLite and PostgreSQL ledgers. The DAGs
(``dags/outcome_dags.py``) leave the task seconds behind its pod, so reconcile releases the grant
first; the release message says so, and the test checks it did.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from airflow_gpupool.controller.leader import LeaderElector, LeaseSettings
from airflow_gpupool.controller.run import ControllerIntervals, GpuPoolController
from airflow_gpupool.inventory.sync import core_v1_api
from airflow_gpupool.ledger import HistoryFilter, Ledger, LedgerHistory, ReservationState, TaskAttempts
from airflow_gpupool.testing import KubernetesEmulatorServer
from tests.integration.conftest import ledger_inventory


@pytest.fixture
def shared_ledger(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    """A ledger of the emulated cluster on each backend, named by the default gpupool connection."""
    ledger = Ledger.create(ledger_url)
    ledger.upsert_nodes(ledger_inventory())
    extra = {"ledger_url": ledger_url, "poll_interval_seconds": 0.2}
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({"conn_type": "gpupool", "extra": extra}))
    yield ledger
    ledger.close()


@pytest.fixture
def reconciling(k8s: KubernetesEmulatorServer, shared_ledger: Ledger, ledger_url: str) -> Iterator[None]:
    """The controller, reconciling every second while the test runs (on a ledger of its own)."""
    leases = client.CoordinationV1Api(config.new_client_from_config(config_file=k8s.kubeconfig_path))
    elector = LeaderElector(leases, LeaseSettings("default", "outcome-test", lease_duration=15))
    ledger = Ledger(ledger_url)
    controller = GpuPoolController(
        ledger, core_v1_api(k8s.kubeconfig_path), elector, ControllerIntervals(600, 1, 600)
    )
    stop = threading.Event()
    thread = threading.Thread(target=controller.run, args=(stop,), name="controller", daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=60)
    ledger.close()
    assert not thread.is_alive()


def only_reservation(ledger: Ledger, dag_id: str) -> Any:
    (entry,) = LedgerHistory(ledger).entries(HistoryFilter(dag_id=dag_id))
    return entry


@pytest.mark.parametrize("dag_id", ["gpu_outcome_succeeds", "gpu_outcome_succeeds_deferrable"])
def test_a_succeeded_pod_released_by_reconcile_first_is_released_and_the_task_succeeds(
    run_dag: Any, reconciling: None, shared_ledger: Ledger, dag_id: str
) -> None:
    dag_run = run_dag(dag_id)

    (ti,) = dag_run.get_task_instances()
    assert (str(ti.state), ti.try_number) == ("success", 1)
    entry = only_reservation(shared_ledger, dag_id)
    # Reconcile got there first (the race this guards), and the history shows the pod's success.
    assert entry.message == f"reconcile: pod default/{dag_id.replace('_', '-')} finished (Succeeded)"
    assert (entry.state, entry.failure_class, entry.outcome) == ("released", None, "released")
    assert TaskAttempts(shared_ledger).history(f"{dag_id}/train/{dag_run.run_id}/map--1") == []
    assert shared_ledger.snapshot().grants == ()
    assert shared_ledger.check_invariants() == []


@pytest.mark.parametrize("dag_id", ["gpu_outcome_crashes", "gpu_outcome_crashes_deferrable"])
def test_a_crashed_pod_released_by_reconcile_first_is_an_application_error_and_the_ladder_follows_it(
    run_dag: Any, reconciling: None, shared_ledger: Ledger, dag_id: str
) -> None:
    dag_run = run_dag(dag_id)

    (ti,) = dag_run.get_task_instances()
    entry = only_reservation(shared_ledger, dag_id)
    assert entry.message == (
        f"reconcile: pod default/{dag_id.replace('_', '-')} finished "
        "(Failed: application_error (Error, exit code 1))"
    )
    (attempt,) = TaskAttempts(shared_ledger).history(f"{dag_id}/train/{dag_run.run_id}/map--1")
    assert (attempt.failure_class, attempt.exit_code, attempt.reservation_id) == (
        "application_error",
        1,
        entry.id,
    )
    # The ladder decided from the crash: the DAG's ladder fails an application error at once, though a
    # retry was left (a lost lease would have been retried).
    assert attempt.remedy == "fail"
    assert (str(ti.state), ti.try_number) == ("failed", 1)
    assert (entry.state, entry.outcome) == ("released", "released, application_error")
    assert shared_ledger.get(entry.id).state is ReservationState.RELEASED
    assert shared_ledger.snapshot().grants == ()
    assert shared_ledger.check_invariants() == []
