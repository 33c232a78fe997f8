"""``cpu_fallback``: a reservation that times out runs the task without a GPU (GPUPOOL_DEVICE=cpu)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_gpupool.exceptions import ReservationTimeoutError
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer
from tests.integration.compat.driver import FakeTaskInstance, emulated_gpu_pod, run_task


def fallback_task(k8s: KubernetesEmulatorServer, task_id: str, **kwargs: Any) -> Any:
    return emulated_gpu_pod(
        k8s.kubeconfig_path,
        task_id,
        gpus=4,
        gpu_models=["NVIDIA-A100-SXM4-80GB"],
        reservation_timeout=1,
        **kwargs,
    )


@pytest.fixture
def a100_taken(gpu_ledger: Ledger) -> Ledger:
    gpu_ledger.reserve(GpuRequest(gpus=4), "someone-else", ttl=600, timeout=60, reservation_id="taken")
    return gpu_ledger


def run(op: Any, task_id: str) -> FakeTaskInstance:
    return run_task(op, "fb")


@pytest.mark.parametrize("deferrable", [False, True], ids=["in-place", "deferred"])
def test_a_timed_out_reservation_runs_the_cpu_fallback(
    k8s: KubernetesEmulatorServer, a100_taken: Ledger, deferrable: bool
) -> None:
    task_id = f"fallback-{'def' if deferrable else 'sync'}"
    ti = run(fallback_task(k8s, task_id, cpu_fallback=True, deferrable=deferrable), task_id)

    (pod,) = k8s.created_pods()
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["GPUPOOL_DEVICE"] == "cpu" and "GPUPOOL_RESERVATION_ID" not in env
    assert "nvidia.com/gpu" not in str(container.get("resources")) and not pod["spec"].get("affinity")
    assert k8s.pod_history(task_id)[-1]["status"]["phase"] == "Succeeded"
    assert ti.xcoms["gpupool_device"] == "cpu" and "gpupool_grant" not in ti.xcoms
    assert [r.id for r in a100_taken.snapshot().grants] == ["taken"], "the fallback holds no slice"


def test_without_it_the_timeout_fails_the_task(k8s: KubernetesEmulatorServer, a100_taken: Ledger) -> None:
    with pytest.raises(ReservationTimeoutError):
        run(fallback_task(k8s, "no-fallback"), "no-fallback")
    assert k8s.created_pods() == []
