"""GpuPodOperator binds its pod to its grant: real dag.test(), the real KubernetesPodOperator over HTTP
to the Kubernetes emulator, a real SQLite ledger. Sync and deferrable pod modes."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.testing import KubernetesEmulatorServer


@pytest.mark.parametrize("dag_id", ["gpu_bind_whole", "gpu_deferrable_pod"])
def test_the_operator_binds_its_pod_to_the_grant(
    run_dag: Any, k8s: KubernetesEmulatorServer, gpu_ledger: Ledger, dag_id: str
) -> None:
    dag_run = run_dag(dag_id)

    (ti,) = dag_run.get_task_instances()
    assert str(ti.state) == "success"
    (created,) = k8s.created_pods()
    name = created["metadata"]["name"]
    stored = k8s.pod_history(name)
    uid = stored[-1]["metadata"]["uid"]
    assert uid
    (reservation,) = gpu_ledger.history()
    assert reservation.id == created["metadata"]["labels"]["gpupool.io/reservation-id"]
    assert reservation.state is ReservationState.RELEASED
    grant = reservation.grant
    assert grant is not None
    assert (grant.pod_namespace, grant.pod_name, grant.pod_uid) == ("default", name, uid)
    assert grant.bound_at is not None and grant.granted_at <= grant.bound_at
