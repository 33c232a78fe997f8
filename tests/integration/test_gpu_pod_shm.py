"""``shm_size``: a memory-backed /dev/shm on the emulator, counted in the slice's memory in the ledger."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.testing import KubernetesEmulatorServer
from tests.integration.compat.driver import emulated_gpu_pod, run_task


def shm_task(k8s: KubernetesEmulatorServer, task_id: str, **kwargs: Any) -> Any:
    return emulated_gpu_pod(
        k8s.kubeconfig_path,
        task_id,
        gpus=1,
        container_resources={"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
        **kwargs,
    )


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferrable"])
def test_shm_is_mounted_and_counted_in_the_memory(
    k8s: KubernetesEmulatorServer, gpu_ledger: Ledger, deferrable: bool
) -> None:
    task_id = f"shm-{'def' if deferrable else 'sync'}"
    op = shm_task(k8s, task_id, deferrable=deferrable, shm_size="2Gi")
    ti = run_task(op, "shm")

    (pod,) = k8s.created_pods()
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "gpupool-dshm"]
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": "2048Mi"}
    container = pod["spec"]["containers"][0]
    assert {"name": "gpupool-dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert container["resources"]["requests"] == {"cpu": "2", "memory": "6144Mi"}
    assert container["resources"]["limits"]["memory"] == "10240Mi"
    reservation = gpu_ledger.get(ti.xcoms["gpupool_grant"]["reservation_id"])
    assert reservation.request.memory_mib == 6144, "the ledger accounts the shm as memory"


@pytest.mark.parametrize("size", ["64", 64, "lots", "0Mi", "-1Gi"])
def test_a_bad_shm_size_fails_at_parse_time(k8s: KubernetesEmulatorServer, size: Any) -> None:
    with pytest.raises(InvalidRequestError, match="shm_size"):
        shm_task(k8s, "shm-bad", shm_size=size)
