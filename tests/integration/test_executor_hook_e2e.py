"""A plain KubernetesPodOperator with ``nvidia.com/gpu: 1`` goes through the ledger, end to end.

The hook is installed as a deployment would: an ``airflow_local_settings.py`` with the documented
one-line import, loaded by Airflow's own ``import_local_settings``. Under ``dag.test()`` the pod is
created gated, waits while the pool is full, and runs pinned once the gatekeeper (here in a thread,
as inside ``gpupool controller run``) admits it; SQLite and PostgreSQL ledgers. A KubernetesExecutor
worker pod built by the executor's own pod generator from a ``pod_override`` is gated the same way,
admitted by the gatekeeper, recorded with its task try and shown on the GPU pool page.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.controller.gatekeeper import gatekeep
from airflow_gpupool.inventory.sync import core_v1_api
from airflow_gpupool.labels import BINDING_ANNOTATION, REQUEST_ANNOTATION, RESERVATION_LABEL, SCHEDULING_GATE
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer
from tests.integration.conftest import ledger_inventory

LOCAL_SETTINGS = "from airflow_gpupool.executor_hook import pod_mutation_hook  # noqa: F401\n"


@pytest.fixture
def local_settings(tmp_path: Path) -> Iterator[None]:
    """Install the hook through airflow_local_settings.py for one test, then take it out again."""
    from airflow import settings

    (tmp_path / "airflow_local_settings.py").write_text(LOCAL_SETTINGS)
    sys.path.insert(0, str(tmp_path))
    manager = settings.get_policy_plugin_manager()
    before = set(manager.get_plugins())
    settings.import_local_settings()
    try:
        yield
    finally:
        for plugin in set(manager.get_plugins()) - before:
            manager.unregister(plugin)
        sys.path.remove(str(tmp_path))
        sys.modules.pop("airflow_local_settings", None)


@pytest.fixture
def pool(ledger_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    """A ledger of the emulated cluster on each backend, named by the default gpupool connection."""
    ledger = Ledger.create(ledger_url)
    ledger.upsert_nodes(ledger_inventory())
    extra = {"ledger_url": ledger_url, "poll_interval_seconds": 0.2}
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({"conn_type": "gpupool", "extra": extra}))
    yield ledger
    ledger.close()


def fill(ledger: Ledger) -> list[str]:
    """Reserve single GPUs until the pool is full; return the ids granted."""
    held = []
    for i in range(32):
        reservation = ledger.reserve(GpuRequest(gpus=1, cpu_milli=0), "filler", reservation_id=f"gp-fill-{i}")
        if reservation.state is not ReservationState.GRANTED:
            ledger.release(reservation.id)
            return held
        held.append(reservation.id)
    raise AssertionError("the pool never filled")


class Gatekeeper(threading.Thread):
    """``gpupool controller run``'s gatekeeper step, every 0.2 s, until stopped."""

    def __init__(self, ledger: Ledger, kubeconfig: str) -> None:
        super().__init__(daemon=True)
        self.ledger, self.core = ledger, core_v1_api(kubeconfig)
        self.stop = threading.Event()
        self.waited = 0
        self.errors: list[BaseException] = []

    def run(self) -> None:
        while not self.stop.wait(0.2):
            try:
                self.waited += len(gatekeep(self.ledger, self.core).waiting)
            except BaseException as e:  # reported by the test
                self.errors.append(e)


def test_plain_kpo_waits_gated_then_runs_pinned(
    run_dag: Any, k8s: KubernetesEmulatorServer, pool: Ledger, local_settings: None
) -> None:
    held = fill(pool)
    keeper = Gatekeeper(pool, k8s.kubeconfig_path)
    keeper.start()

    def free_when_seen_waiting() -> None:
        deadline = time.monotonic() + 60
        while keeper.waited < 3 and time.monotonic() < deadline:  # several passes saw it waiting
            time.sleep(0.1)
        for rid in held:
            pool.release(rid)

    freer = threading.Thread(target=free_when_seen_waiting, daemon=True)
    freer.start()
    try:
        dag_run = run_dag("plain_kpo_gpu")
    finally:
        freer.join(5)
        time.sleep(0.5)  # one more gatekeeper pass: the pod is gone, its grant is released
        keeper.stop.set()
        keeper.join(5)
    assert keeper.errors == []
    assert str(dag_run.state) == "success"
    assert keeper.waited >= 3
    (created,) = k8s.created_pods()
    assert created["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]  # created gated
    assert created["metadata"]["annotations"][BINDING_ANNOTATION] == "whole"
    (history,) = {p["metadata"]["name"] for p in k8s.created_pods()}
    final = k8s.pod_history(history)[-1]
    node = final["spec"]["nodeName"]
    assert final["spec"]["nodeSelector"] == {"kubernetes.io/hostname": node}
    rid = final["metadata"]["labels"][RESERVATION_LABEL]
    reservation = pool.get(rid)
    assert reservation.state is ReservationState.RELEASED
    assert reservation.holder == f"plain_kpo_gpu/legacy_train/{dag_run.run_id}/map--1/try-1@gatekeeper"
    assert reservation.grant is not None and reservation.grant.node == node
    assert "gone" in reservation.message or "finished" in reservation.message
    assert pool.snapshot().grants == ()


def executor_worker_pod() -> Any:
    """A KubernetesExecutor worker pod as the executor builds it: its pod generator, a GPU ``pod_override``."""
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
    from kubernetes.client import models as k8s

    override = k8s.V1Pod(
        spec=k8s.V1PodSpec(
            containers=[
                k8s.V1Container(
                    name="base", resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": "2"})
                )
            ]
        )
    )
    return PodGenerator.construct_pod(
        dag_id="etl",
        task_id="embed",
        pod_id="etl-embed-1",
        try_number=3,
        kube_image="airflow:3",
        date=None,
        args=["airflow", "tasks", "run"],
        pod_override_object=override,
        base_worker_pod=k8s.V1Pod(metadata=k8s.V1ObjectMeta(), spec=k8s.V1PodSpec(containers=[])),
        namespace="default",
        scheduler_job_id="1",
        run_id="scheduled__2026-12-01T00:00:00+00:00",
        map_index=2,
        with_mutation_hook=True,
    )


def test_kubernetes_executor_pod_override_is_gated(local_settings: None) -> None:
    pod = executor_worker_pod()
    assert [g.name for g in pod.spec.scheduling_gates] == [SCHEDULING_GATE]
    annotations = pod.metadata.annotations
    assert json.loads(annotations[REQUEST_ANNOTATION])["gpus"] == 2
    assert annotations["gpupool.io/run-id"] == "scheduled__2026-12-01T00:00:00+00:00"  # the raw id
    assert (annotations["gpupool.io/try-number"], annotations["gpupool.io/map-index"]) == ("3", "2")


def test_kubernetes_executor_worker_pod_is_admitted_recorded_and_shown(
    k8s: KubernetesEmulatorServer, pool: Ledger, local_settings: None
) -> None:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.testclient import TestClient
    from kubernetes.client import ApiClient

    from airflow_gpupool.plugins.app import create_app

    core = core_v1_api(k8s.kubeconfig_path)
    pod = core.create_namespaced_pod("default", ApiClient().sanitize_for_serialization(executor_worker_pod()))
    name = pod.metadata.name
    (created,) = [p for p in k8s.created_pods() if p["metadata"]["name"] == name]
    assert created["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]

    outcome = gatekeep(pool, core)

    assert outcome.admitted == [f"default/{name}"], outcome.summary()
    admitted = k8s.pod(name)
    assert admitted is not None
    assert not admitted["spec"].get("schedulingGates")
    rid = admitted["metadata"]["labels"][RESERVATION_LABEL]
    reservation = pool.get(rid)
    assert reservation.state is ReservationState.GRANTED
    assert reservation.holder == "etl/embed/scheduled__2026-12-01T00:00:00+00:00/map-2/try-3@gatekeeper"
    assert reservation.grant is not None and len(reservation.grant.gpu_indices) == 2
    assert admitted["spec"]["nodeSelector"] == {"kubernetes.io/hostname": reservation.grant.node}
    # The GPU pool page names the task try the executor's pod runs.
    app = create_app(lambda: pool)
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer", role="viewer")
    page = TestClient(app).get("/")
    assert page.status_code == 200
    assert "etl / embed [2] · try 3" in page.text


def test_plain_kpo_with_a_node_selector_is_granted_only_where_it_can_run(
    run_dag: Any,
    k8s: KubernetesEmulatorServer,
    ledger_url: str,
    monkeypatch: pytest.MonkeyPatch,
    local_settings: None,
) -> None:
    from airflow_gpupool.inventory.sync import sync_inventory

    ledger = Ledger.create(ledger_url)  # synced from the cluster: the nodes' labels, pools included
    sync_inventory(ledger, core_v1_api(k8s.kubeconfig_path))
    extra = {"ledger_url": ledger_url, "poll_interval_seconds": 0.2}
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({"conn_type": "gpupool", "extra": extra}))
    keeper = Gatekeeper(ledger, k8s.kubeconfig_path)
    keeper.start()
    try:
        dag_run = run_dag("plain_kpo_gpu_pool")
    finally:
        time.sleep(0.5)
        keeper.stop.set()
        keeper.join(5)
    try:
        assert keeper.errors == []
        assert str(dag_run.state) == "success"
        (created,) = k8s.created_pods()
        request = json.loads(created["metadata"]["annotations"][REQUEST_ANNOTATION])
        assert request["gpu_models"] == ["Tesla-T4"]
        assert request["node_labels"] == {"gpupool.io/pool": "t4-shared"}
        final = k8s.pod_history(created["metadata"]["name"])[-1]
        assert final["spec"]["nodeName"] == "gpu-t4"
        assert final["spec"]["nodeSelector"] == {
            "gpupool.io/pool": "t4-shared",
            "nvidia.com/gpu.product": "Tesla-T4",
            "kubernetes.io/hostname": "gpu-t4",
        }
        (reservation,) = ledger.history()
        assert reservation.grant is not None and reservation.grant.node == "gpu-t4"
        assert ledger.snapshot().grants == ()
    finally:
        ledger.close()
