"""A pod whose grant is released behind its back is deleted, and its try fails with LeaseLostError:
real dag.test(), the real KubernetesPodOperator over HTTP to the emulator, a real SQLite ledger.

Nothing here is timed from the test's start: on a loaded machine dag.test() may take tens of
seconds to launch the pod. What is timed is the release to the pod's deletion.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from airflow_gpupool.ledger import Ledger, ReservationState, TaskAttempts
from airflow_gpupool.testing import KubernetesEmulatorServer

#: How long the DAG run may take to get the pod running (the run's own start included).
_LAUNCH_TIMEOUT_S = 300.0
#: The pod's run (its emulator duration annotation in lease_dags.py).
_POD_SECONDS = 60.0


def release_once_running(k8s: KubernetesEmulatorServer, ledger: Ledger, pod_name: str) -> threading.Thread:
    """Start a thread that releases the pod's grant, as someone else would, once the pod runs.

    It waits as long as the DAG run may take to launch the pod (the test joins it after the run).
    """
    released: dict[str, Any] = {}

    def run() -> None:
        pod = k8s.wait_for_pod(pod_name, ("Running",), timeout=_LAUNCH_TIMEOUT_S)
        rid = pod["metadata"]["labels"]["gpupool.io/reservation-id"]
        released["rid"] = rid
        released["at"] = time.time()  # the emulator's request log is on time.time() too
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

    dag_run = run_dag(dag_id)
    releaser.join(timeout=_LAUNCH_TIMEOUT_S)  # the release may still be returning as the run ends
    assert not releaser.is_alive()

    (ti,) = dag_run.get_task_instances()
    assert str(ti.state) == "failed"
    rid = releaser.released["rid"]  # type: ignore[attr-defined]
    assert releaser.released["result"].released  # type: ignore[attr-defined]
    assert k8s.pod(pod_name) is None
    history = k8s.pod_history(pod_name)
    assert [p["status"].get("phase") for p in history][-1] != "Succeeded"
    deletes = [r for r in k8s.requests if r.method == "DELETE" and r.path.endswith(f"/pods/{pod_name}")]
    at_once = [
        r
        for r in deletes
        if r.query.get("gracePeriodSeconds") == "0" or (r.body or {}).get("gracePeriodSeconds") == 0
    ]
    assert at_once, deletes
    # The operator deleted the pod, without a grace period, well within the pod's 60 s after the
    # release (a renewal comes every second; the margin is for a loaded machine).
    released_at = releaser.released["at"]  # type: ignore[attr-defined]
    assert 0 < at_once[0].time - released_at < _POD_SECONDS / 2, (at_once[0].time, released_at)
    (attempt,) = TaskAttempts(gpu_ledger).history(f"{dag_id}/train/{dag_run.run_id}/map--1")
    assert (attempt.failure_class, attempt.remedy, attempt.reservation_id) == ("lease_lost", "retry", rid)
    assert "lease of" in attempt.message
    assert gpu_ledger.get(rid).state is ReservationState.RELEASED
    snap = gpu_ledger.snapshot()
    assert snap.grants == () and snap.queue == ()
    assert gpu_ledger.check_invariants() == []
