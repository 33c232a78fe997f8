"""delete_pod_until_gone and settle_deleted_pod against the emulator, which deletes as Kubernetes does."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_gpupool.controller.pod_deletion import PodGone, delete_pod_until_gone, settle_deleted_pod
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    with KubernetesEmulatorServer(nodes=[gpu_node("gpu-a", gpus=2)], default_duration_seconds=60) as server:
        yield server


@pytest.fixture
def core(emulator: KubernetesEmulatorServer) -> Any:
    from kubernetes import client, config

    emulator.reset()
    return client.CoreV1Api(config.new_client_from_config(emulator.kubeconfig_path))


def running(k8s: KubernetesEmulatorServer, core: Any, name: str, exit_seconds: float) -> None:
    core.create_namespaced_pod(
        "default",
        {
            "metadata": {
                "name": name,
                "annotations": {"gpupool.emulator/sigterm-exit-seconds": str(exit_seconds)},
            },
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "train:1"}]},
        },
    )
    k8s.wait_for_pod(name, phases={"Running"})


def test_it_returns_once_the_pod_is_gone_not_when_the_delete_answers(
    emulator: KubernetesEmulatorServer, core: Any
) -> None:
    running(emulator, core, "slow", 1.5)
    started = time.monotonic()
    assert delete_pod_until_gone(core, "default", "slow", grace_seconds=20, why="test") is PodGone.ENDED
    assert time.monotonic() - started >= 1.4
    assert emulator.pod("slow") is None
    (record,) = emulator.pod_records()
    assert record.end == "Failed"  # its containers exited on SIGTERM: not killed


def test_a_pod_outliving_its_grace_and_the_margin_is_force_deleted(
    emulator: KubernetesEmulatorServer, core: Any
) -> None:
    running(emulator, core, "stuck", 60)
    # A 30 s grace the kubelet does not keep (here: a margin of -29 s gives it 1 s).
    gone = delete_pod_until_gone(core, "default", "stuck", grace_seconds=30, why="test", margin_seconds=-29)
    assert gone is PodGone.FORCED
    graces = [r.query.get("gracePeriodSeconds") for r in emulator.requests if r.method == "DELETE"]
    assert graces == ["30", "0"]
    assert emulator.pod("stuck") is None


def test_a_pod_already_gone_and_one_not_being_deleted_are_left_alone(
    emulator: KubernetesEmulatorServer, core: Any
) -> None:
    assert delete_pod_until_gone(core, "default", "nobody", grace_seconds=5, why="test") is PodGone.ALREADY
    running(emulator, core, "kept", 1.0)
    assert settle_deleted_pod(core, "default", "kept", why="test") is PodGone.ALREADY
    assert emulator.pod("kept") is not None  # not deleted by anyone: not waited for, not deleted
    core.delete_namespaced_pod("kept", "default", grace_period_seconds=10)  # as KPO's clean-up does
    assert settle_deleted_pod(core, "default", "kept", why="test") is PodGone.ENDED
    assert emulator.pod("kept") is None
