"""The autoscale step inside ``GpuPoolController`` and ``gpupool controller run``: its interval, leader-only, faults retried."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from airflow_gpupool.cli import main
from airflow_gpupool.controller.autoscale.pools import ScalablePool
from airflow_gpupool.controller.autoscale.step import Autoscaler, AutoscaleSettings
from airflow_gpupool.controller.leader import LeaderElector, LeaseSettings
from airflow_gpupool.controller.run import ControllerIntervals, GpuPoolController
from airflow_gpupool.inventory.sync import core_v1_api, sync_inventory
from airflow_gpupool.labels import SCALE_UP_LABEL
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.ledger_fixtures import FakeClock

PRODUCT = "NVIDIA-A100-SXM4-80GB"
POOL = {"burst": {"gpu_model": PRODUCT, "gpus": 8, "gpu_memory_mib": 81920, "cpu": "96", "memory": "1024Gi"}}
GROUP = ("autoscaling.x-k8s.io", "v1", "default", "provisioningrequests")


@pytest.fixture
def k8s() -> Iterator[KubernetesEmulatorServer]:
    with KubernetesEmulatorServer(nodes=[gpu_node("gpu-a-0", gpus=8, product=PRODUCT)]) as server:
        yield server


@pytest.fixture
def waiting_url(tmp_path: Path, k8s: KubernetesEmulatorServer) -> str:
    """A SQLite ledger of the emulated cluster whose one node is granted and one request waits."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger.create(url) as ledger:
        sync_inventory(ledger, core_v1_api(k8s.kubeconfig_path))
        ledger.reserve(GpuRequest(gpus=8), "filler", reservation_id="filler")
        waiting = ledger.reserve(GpuRequest(gpus=2), "train", reservation_id="train-9")
        assert waiting.state is ReservationState.WAITING
    return url


def provisioning_requests(k8s: KubernetesEmulatorServer) -> list[str]:
    api = client.CustomObjectsApi(core_v1_api(k8s.kubeconfig_path).api_client)
    return [
        o["metadata"]["labels"][SCALE_UP_LABEL] for o in api.list_namespaced_custom_object(*GROUP)["items"]
    ]


def test_the_step_runs_on_its_interval_while_leading(k8s: KubernetesEmulatorServer, waiting_url: str) -> None:
    core = core_v1_api(k8s.kubeconfig_path)
    clock = FakeClock(0)
    leases = client.CoordinationV1Api(core.api_client)
    elector = LeaderElector(leases, LeaseSettings("default", "one", lease_duration=60), clock=clock)
    other = LeaderElector(leases, LeaseSettings("default", "two", lease_duration=60), clock=clock)
    with Ledger(waiting_url) as ledger:
        settings = AutoscaleSettings(pools=(ScalablePool("burst", PRODUCT, 8, 81920),))
        intervals = ControllerIntervals(60, 60, 60, autoscale=5)
        follower = GpuPoolController(
            ledger, core, other, intervals, clock=clock, autoscaler=Autoscaler(ledger, core, settings)
        )
        controller = GpuPoolController(
            ledger, core, elector, intervals, clock=clock, autoscaler=Autoscaler(ledger, core, settings)
        )
        with follower, controller:
            first = controller.run_pass()
            assert first.autoscaled is not None and first.autoscaled.created == ["train-9"]
            assert "autoscale: 1 asked" in first.summary()
            assert follower.run_pass().autoscaled is None  # not leading: nothing asked
            clock.advance(1)
            assert controller.run_pass().autoscaled is None  # not due yet
            clock.advance(5)
            assert controller.run_pass().autoscaled.kept == ["train-9"]  # type: ignore[union-attr]
            ledger.release("train-9", reason="cancelled")
            clock.advance(5)
            assert controller.run_pass().autoscaled.deleted == ["train-9"]  # type: ignore[union-attr]
    assert provisioning_requests(k8s) == []


def test_a_failing_step_is_logged_and_retried(waiting_url: str) -> None:
    # A ProvisioningRequest asked for on a cluster that does not serve them: the step fails each
    # pass with the configuration error, and the other steps go on.
    with KubernetesEmulatorServer(
        nodes=[gpu_node("gpu-a-0", gpus=8, product=PRODUCT)], unserved_groups=["autoscaling.x-k8s.io"]
    ) as bare:
        core = core_v1_api(bare.kubeconfig_path)
        clock = FakeClock(0)
        leases = client.CoordinationV1Api(core.api_client)
        elector = LeaderElector(leases, LeaseSettings("default", "one", lease_duration=60), clock=clock)
        with Ledger(waiting_url) as ledger:
            settings = AutoscaleSettings(
                pools=(ScalablePool("burst", PRODUCT, 8, 81920),), mode="provisioning-request"
            )
            passes = []
            with GpuPoolController(
                ledger,
                core,
                elector,
                ControllerIntervals(autoscale=1),
                clock=clock,
                autoscaler=Autoscaler(ledger, core, settings),
            ) as controller:
                for _ in range(2):
                    passes.append(controller.run_pass())
                    clock.advance(1)
            assert [[step for step, _ in p.errors] for p in passes] == [["autoscale"], ["autoscale"]]
            assert "does not serve autoscaling.x-k8s.io/v1" in passes[1].errors[0][1]
            assert passes[0].synced is not None and passes[0].reaped is not None  # the other steps went on


def test_controller_run_once_asks_for_the_pool(
    k8s: KubernetesEmulatorServer, waiting_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__SCALABLE_NODE_POOLS", json.dumps(POOL))
    args = ["controller", "run", "--once", "--url", waiting_url, "--kubeconfig", k8s.kubeconfig_path]
    assert main([*args, "--identity", "cli", "--namespace", "default"]) == 0
    assert provisioning_requests(k8s) == ["train-9"]


def test_bad_pool_configuration_stops_the_controller_before_its_loop(
    k8s: KubernetesEmulatorServer, waiting_url: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    bad = {"burst": {**POOL["burst"], "gpus": "eight"}}
    monkeypatch.setenv("AIRFLOW__GPUPOOL__SCALABLE_NODE_POOLS", json.dumps(bad))
    args = ["controller", "run", "--once", "--url", waiting_url, "--kubeconfig", k8s.kubeconfig_path]
    assert main([*args, "--identity", "cli", "--namespace", "default"]) == 2
    assert "scalable_node_pools 'burst'.gpus: 'eight'" in capsys.readouterr().err
    assert provisioning_requests(k8s) == []


def test_an_unknown_discovery_source_stops_the_controller(
    k8s: KubernetesEmulatorServer, waiting_url: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__DISCOVER_NODE_POOLS", "gke")
    args = ["controller", "run", "--once", "--url", waiting_url, "--kubeconfig", k8s.kubeconfig_path]
    assert main([*args, "--identity", "cli", "--namespace", "default"]) == 2
    assert "discover_node_pools: 'gke'" in capsys.readouterr().err
