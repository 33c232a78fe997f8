"""A pod whose grant is released behind its back is deleted, and its try fails with LeaseLostError:
real dag.test(), the real KubernetesPodOperator over HTTP to the emulator, a real SQLite ledger."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.attempts import TaskAttempts
from airflow_gpupool.testing import KubernetesEmulatorServer


def release_once_running(k8s: KubernetesEmulatorServer, ledger: Ledger, pod_name: str) -> threading.Thread:
    """Start a thread that releases the pod's grant, as someone else would, once the pod runs."""
    released: dict[str, Any] = {}

    def run() -> None:
        pod = k8s.wait_for_pod(pod_name, ("Running",), timeout=60)
        rid = pod["metadata"]["labels"]["gpupool.io/reservation-id"]
        released["rid"] = rid
        released["result"] = ledger.release(rid, reason="taken back by an operator")

    thread = threading.Thread(target=run, name="release-grant", daemon=True)
    thread.released = released  # type: ignore[attr-defined]
    thread.start()
    return thread


@pytest.mark.parametrize("dag_id", ["gpu_lease_lost", "gpu_lease_lost_deferrable"])
def test_a_lost_lease_deletes_the_pod_and_fails_the_try(
    run_dag: Any, k8s: KubernetesEmulatorServer, gpu_ledger: Ledger, dag_id: str
) -> None:
    pod_name = dag_id.replace("_", "-")
    releaser = release_once_running(k8s, gpu_ledger, pod_name)

    started = time.monotonic()
    dag_run = run_dag(dag_id)
    took = time.monotonic() - started
    releaser.join(timeout=5)

    (ti,) = dag_run.get_task_instances()
    assert str(ti.state) == "failed"
    rid = releaser.released["rid"]  # type: ignore[attr-defined]
    assert releaser.released["result"].released  # type: ignore[attr-defined]
    # The pod would have run 60 s; it was deleted at once, without a grace period, by the operator.
    assert took < 45
    assert k8s.pod(pod_name) is None
    history = k8s.pod_history(pod_name)
    assert [p["status"].get("phase") for p in history][-1] != "Succeeded"
    deletes = [r for r in k8s.requests if r.method == "DELETE" and r.path.endswith(f"/pods/{pod_name}")]
    assert any(
        r.query.get("gracePeriodSeconds") == "0" or (r.body or {}).get("gracePeriodSeconds") == 0
        for r in deletes
    ), deletes
    (attempt,) = TaskAttempts(gpu_ledger).history(f"{dag_id}/train/{dag_run.run_id}/map--1")
    assert (attempt.failure_class, attempt.remedy, attempt.reservation_id) == ("lease_lost", "retry", rid)
    assert "lease of" in attempt.message
    assert gpu_ledger.get(rid).state is ReservationState.RELEASED
    snap = gpu_ledger.snapshot()
    assert snap.grants == () and snap.queue == ()
    assert gpu_ledger.check_invariants() == []
