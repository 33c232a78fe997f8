"""The controller computes each node's drift from its pod watch's cache and stores it for the page (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from airflow_gpupool.controller.leader import LeaderElector, LeaseSettings
from airflow_gpupool.controller.run import ControllerIntervals, GpuPoolController
from airflow_gpupool.inventory.sync import core_v1_api
from airflow_gpupool.ledger import Ledger, LedgerDriftRecords
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.integration.test_external_pods import wait_for


def pod(name: str, gpus: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeName": "gpu-a",
            "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}],
        },
    }


@pytest.fixture
def running(ledger: Ledger) -> Iterator[tuple[GpuPoolController, Any]]:
    with KubernetesEmulatorServer(nodes=[gpu_node("gpu-a", gpus=4)], default_duration_seconds=600) as k8s:
        core = core_v1_api(k8s.kubeconfig_path)
        elector = LeaderElector(client.CoordinationV1Api(core.api_client), LeaseSettings("default", "one"))
        tiny = 0.01
        intervals = ControllerIntervals(60, 60, tiny, autoscale=60, forecast=60, drift=tiny)
        controller = GpuPoolController(ledger, core, elector, intervals)
        try:
            yield controller, core
        finally:
            if controller.external_pods is not None:
                controller.external_pods.stop()


def test_drift_follows_the_watched_pods(ledger: Ledger, running: tuple[GpuPoolController, Any]) -> None:
    controller, core = running
    controller.run_pass()  # syncs gpu-a and starts the watch
    ledger.reserve(GpuRequest(gpus=2), "train", reservation_id="gp-1")  # its pod is not there

    def stored() -> dict[str, Any]:
        controller.run_pass()
        return {n: (r.running, r.drift) for n, r in LedgerDriftRecords(ledger).get().items()}

    wait_for(lambda: stored() == {"gpu-a": (0.0, 2.0)}, "the grant without its pod is drift")
    assert LedgerDriftRecords(ledger).get()["gpu-a"].mismatched == ("grant gp-1: 2 → 0",)

    core.create_namespaced_pod("default", pod("gp-1", 2, {"gpupool.io/reservation-id": "gp-1"}))
    core.create_namespaced_pod("default", pod("notebook", 1))  # counted as an external hold: no drift
    wait_for(lambda: stored() == {"gpu-a": (3.0, 0.0)}, "the pods counted, no drift")
    assert LedgerDriftRecords(ledger).get()["gpu-a"].since is None
    # From the watch's events: one list when it started, none since (no fresh list per pass).
    assert controller.external_pods is not None and controller.external_pods.watch.stats.lists == 1
