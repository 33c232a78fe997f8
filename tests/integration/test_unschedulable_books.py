"""A granted pod the scheduler cannot place is evidence (issue 36, item 2): the ledger's books were wrong.

The emulated gpu-a100 runs a pod the ledger does not know (a notebook holding its four GPUs,
``spec.nodeName`` set directly). The ledger still calls the node free, so a ``GpuPodOperator`` try
is granted there; its pod stays ``Pending`` (``Insufficient nvidia.com/gpu``). Sync and deferrable,
on SQLite and PostgreSQL: the try fails within the grace, classed ``ledger_drift`` (retried, not
the application's fault), the node is reported suspect before the slice is released, the retry's
request is not placed there, and the controller's next pass resyncs the node at once (not at its
sync interval), after which the request is served.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, config

from airflow_gpupool.controller.external_pods import ExternalPodCounter
from airflow_gpupool.controller.leader import LeaderElector, LeaseSettings
from airflow_gpupool.controller.run import ControllerIntervals, GpuPoolController
from airflow_gpupool.ledger import Ledger, ReservationState, TaskAttempts
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer
from tests.integration.conftest import A100, ledger_inventory
from tests.ledger_fixtures import FakeClock

GRACE_S = 2  # the DAGs' unschedulable_grace_seconds (tests/integration/dags/gpu_operator_dags.py)


@pytest.fixture
def books_ledger(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    """A ledger of the emulated cluster on each backend, named by the default gpupool connection."""
    ledger = Ledger.create(ledger_url)
    ledger.upsert_nodes(ledger_inventory())
    extra = {"ledger_url": ledger_url, "poll_interval_seconds": 0.2}
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({"conn_type": "gpupool", "extra": extra}))
    yield ledger
    ledger.close()


def foreign_notebook(core: Any) -> None:
    """Run a pod that holds gpu-a100's four GPUs, made by nobody the ledger knows; wait until it runs."""
    core.create_namespaced_pod(
        "default",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "notebook", "annotations": {"gpupool.emulator/duration-seconds": "600"}},
            "spec": {
                "nodeName": "gpu-a100",
                "containers": [
                    {"name": "nb", "image": "jupyter", "resources": {"limits": {"nvidia.com/gpu": "4"}}}
                ],
            },
        },
    )
    deadline = time.monotonic() + 10
    while core.read_namespaced_pod("notebook", "default").status.phase != "Running":
        assert time.monotonic() < deadline, "the notebook never ran"
        time.sleep(0.1)


def controller(
    ledger: Ledger, k8s: KubernetesEmulatorServer, core: Any, clock: FakeClock
) -> GpuPoolController:
    """A controller whose full sync is an hour apart: only the resync of suspect nodes can be quick.

    It does not watch pods: the books are wrong because nobody counted the notebook (a controller
    that was down, a pod on GPUs the watch has not seen yet).
    """
    leases = client.CoordinationV1Api(config.new_client_from_config(config_file=k8s.kubeconfig_path))
    elector = LeaderElector(leases, LeaseSettings("default", "books-test", lease_duration=600), clock=clock)
    intervals = ControllerIntervals(sync=3600, reconcile=3600, gate=3600)
    return GpuPoolController(ledger, core, elector, intervals, clock=clock, count_external_pods=False)


@pytest.mark.parametrize(
    "dag_id", ["gpu_books_wrong_sync", "gpu_books_wrong_deferred"], ids=["sync", "deferrable"]
)
def test_a_pod_the_scheduler_cannot_place_is_evidence_against_the_books(
    run_dag: Callable[[str], Any], k8s: KubernetesEmulatorServer, core: Any, books_ledger: Ledger, dag_id: str
) -> None:
    clock = FakeClock(0)
    control = controller(books_ledger, k8s, core, clock)
    first = control.run_pass()  # the full sync, now; the next is an hour away
    assert first.synced is not None and not first.errors
    foreign_notebook(core)

    started = time.monotonic()
    dag_run = run_dag(dag_id)
    elapsed = time.monotonic() - started

    assert dag_run.state == "failed"
    assert elapsed < 30, f"took {elapsed:.0f} s: the 120 s startup timeout was waited out"
    (attempt,) = TaskAttempts(books_ledger).history(f"{dag_id}/train/{dag_run.run_id}/map--1")
    assert (attempt.failure_class, attempt.remedy) == ("ledger_drift", "retry")
    assert "node gpu-a100 lacks the GPUs the ledger granted" in attempt.message
    assert "Insufficient nvidia.com/gpu" in attempt.message
    (ours,) = [p for p in k8s.created_pods() if p["metadata"]["name"] != "notebook"]
    assert books_ledger.get(ours["metadata"]["labels"]["gpupool.io/reservation-id"]).state is (
        ReservationState.RELEASED
    )
    assert list(books_ledger.suspect_nodes()) == ["gpu-a100"]

    # The retry's request: gpu-a100 is the only A100 node with whole GPUs, and it is suspect.
    retry = books_ledger.reserve(GpuRequest(gpus=1, gpu_models=[A100]), "the-retry", timeout=600)
    assert retry.state is ReservationState.WAITING
    assert "gpu-a100: node is suspect until the controller resyncs it" in books_ledger.explain(retry.id)

    # The pod watch comes back (its relist counts the notebook), then the next pass, a second
    # later, resyncs the node: no full sync is due.
    ExternalPodCounter(books_ledger, core).count_once()
    clock.advance(1)
    after = control.run_pass()

    assert after.synced is None and not after.errors
    assert after.resynced is not None and after.resynced.cleared == ("gpu-a100",)
    assert books_ledger.suspect_nodes() == {}
    # The books are right now: the retry is not granted the notebook's GPUs, it waits for them.
    assert books_ledger.get(retry.id).state is ReservationState.WAITING
    assert [r.holder for r in books_ledger.external_holds()] == ["external:default/notebook"] * 4
    books_ledger.release(retry.id, reason="test over")
