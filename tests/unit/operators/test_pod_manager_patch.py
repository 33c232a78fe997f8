"""A DAG author's test that patches ``KubernetesPodOperator.pod_manager`` reaches the GPU operators.

The cncf provider's own tests (and many users') replace the parent's ``pod_manager``; an operator
that defined its own would silently run the real one instead. The unschedulable fail-fast watches
the start-up reads of whatever manager the parent has, and leaves it as it found it.
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest
from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import PodLaunchFailedException
from airflow.providers.cncf.kubernetes.utils.pod_manager import PodManager
from kubernetes.client import V1Node, V1NodeStatus, V1ObjectMeta

from airflow_gpupool.operators import GpuJobOperator, GpuPodOperator
from tests.unit.operators.test_unschedulable import pod

KPO_POD_MANAGER = "airflow.providers.cncf.kubernetes.operators.pod.KubernetesPodOperator.pod_manager"


def gpu_pod_operator() -> GpuPodOperator:
    return GpuPodOperator(task_id="train", image="busybox", gpus=1, startup_check_interval_seconds=1)


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(gpu_pod_operator, id="GpuPodOperator"),
        pytest.param(
            lambda: GpuJobOperator(task_id="sweep", image="busybox", gpus=1, members=2), id="GpuJobOperator"
        ),
    ],
)
def test_the_patched_parent_pod_manager_is_the_operators(build: object) -> None:
    with mock.patch(KPO_POD_MANAGER) as patched:
        operator = build()  # type: ignore[operator]
        assert operator.pod_manager is patched


def test_the_start_up_wait_runs_on_the_patched_manager_and_is_still_watched() -> None:
    manager = mock.create_autospec(PodManager, instance=True)
    unschedulable = pod()
    manager.read_pod.return_value = unschedulable
    read_pod = manager.read_pod

    async def await_pod_start(**kwargs: object) -> None:  # as the real one: it reads the pod
        manager.read_pod(kwargs["pod"])

    manager.await_pod_start.side_effect = await_pod_start
    with mock.patch(KPO_POD_MANAGER, new=manager):
        operator = gpu_pod_operator()
        operator._grant = SimpleNamespace(node="t4-0")  # type: ignore[assignment]
        client = mock.Mock()
        client.read_node.return_value = V1Node(
            metadata=V1ObjectMeta(name="t4-0"), status=V1NodeStatus(allocatable={"nvidia.com/gpu": "2"})
        )
        operator.__dict__["client"] = client
        operator.log_events_on_failure = False
        with pytest.raises(PodLaunchFailedException, match="advertises 0 nvidia.com/gpucores"):
            operator.await_pod_start(unschedulable)
    manager.await_pod_start.assert_awaited_once_with(
        pod=unschedulable,
        schedule_timeout=operator.schedule_timeout_seconds,
        startup_timeout=operator.startup_timeout_seconds,
        check_interval=1,
    )
    read_pod.assert_called_once_with(unschedulable)
    client.read_node.assert_called_once_with("t4-0")
    assert manager.read_pod is read_pod  # the wrapper is gone: the manager is as it was
