"""GpuPodOperator end to end: real Airflow (dag.test), the real KubernetesPodOperator code over HTTP
to the Kubernetes emulator, and a real SQLite ledger."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_gpupool.agent.collect import NvmlCollector
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer
from airflow_gpupool.testing.fake_nvml import FakeNvml, node_spec

A100 = "NVIDIA-A100-SXM4-80GB"
HOSTNAME_PIN = "kubernetes.io/hostname"


def only_pod(k8s: KubernetesEmulatorServer) -> dict[str, Any]:
    (pod,) = k8s.created_pods()
    return pod


def container(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["containers"][0]


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container(pod).get("env", [])}


def gpupool_env(pod: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in env_of(pod).items() if k.startswith(("GPUPOOL_", "NVIDIA_"))}


def pinned_to(node: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": HOSTNAME_PIN, "operator": "In", "values": [node]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def the_reservation(ledger: Ledger, pod: dict[str, Any]) -> Any:
    rid = pod["metadata"]["labels"]["gpupool.io/reservation-id"]
    assert pod["metadata"]["annotations"]["gpupool.io/reservation-id"] == rid
    return ledger.get(rid)


def assert_nothing_held(ledger: Ledger) -> None:
    snap = ledger.snapshot()
    assert snap.grants == () and snap.queue == ()
    assert ledger.check_invariants() == []


def task_state(dag_run: Any) -> str:
    (ti,) = dag_run.get_task_instances()
    return str(ti.state)


def xcom_grant(dag_run: Any) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (
            session.query(XComModel)
            .filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id, key="gpupool_grant")
            .one()
        )
        return XComModel.deserialize_value(row)


def test_whole_gpus_pod_is_pinned_and_released(run_dag, k8s, gpu_ledger: Ledger) -> None:
    dag_run = run_dag("gpu_bind_whole")

    assert task_state(dag_run) == "success"
    pod = only_pod(k8s)
    reservation = the_reservation(gpu_ledger, pod)
    assert reservation.state is ReservationState.RELEASED
    assert reservation.grant.node == "gpu-a100" and reservation.grant.gpu_indices == (0, 1)
    assert pod["spec"]["affinity"] == pinned_to("gpu-a100")
    assert container(pod)["resources"] == {
        "requests": {"cpu": "1000m", "memory": "1024Mi"},
        "limits": {"nvidia.com/gpu": "2"},
    }
    assert gpupool_env(pod) == {
        "GPUPOOL_RESERVATION_ID": reservation.id,
        "GPUPOOL_NODE": "gpu-a100",
        "GPUPOOL_GPU_INDICES": "0,1",
        "GPUPOOL_GPU_UUIDS": "GPU-gpu-a100-0,GPU-gpu-a100-1",
        "GPUPOOL_GPU_MILLI": "1000",
        "GPUPOOL_GPU_MEMORY_MIB": "81920",
    }
    assert pod["spec"]["priorityClassName"] == "gpupool-training"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]
    assert pod["metadata"]["labels"]["gpupool.io/workload-class"] == "training"
    assert pod["metadata"]["annotations"]["gpupool.io/team"] == "vision"
    assert pod["metadata"]["annotations"]["gpupool.io/gpus"] == "0,1"
    assert xcom_grant(dag_run)["reservation_id"] == reservation.id
    assert xcom_grant(dag_run)["gpu_uuids"] == ["GPU-gpu-a100-0", "GPU-gpu-a100-1"]
    assert_nothing_held(gpu_ledger)


def test_mig_slice_binding_from_node_pool_config(run_dag, k8s, gpu_ledger: Ledger) -> None:
    dag_run = run_dag("gpu_bind_mig")

    assert task_state(dag_run) == "success"
    pod = only_pod(k8s)
    grant = the_reservation(gpu_ledger, pod).grant
    assert (grant.node, grant.mig_profile) == ("gpu-mig", "1g.10gb")
    assert pod["spec"]["affinity"] == pinned_to("gpu-mig")
    assert container(pod)["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert gpupool_env(pod)["GPUPOOL_MIG_PROFILE"] == "1g.10gb"
    assert gpupool_env(pod)["GPUPOOL_MIG_SLICE"] == grant.mig_slice
    assert pod["spec"]["priorityClassName"] == "gpupool-inference"
    assert_nothing_held(gpu_ledger)


def test_hami_fraction_binding(run_dag, k8s, gpu_ledger: Ledger) -> None:
    dag_run = run_dag("gpu_bind_hami")

    assert task_state(dag_run) == "success"
    pod = only_pod(k8s)
    assert the_reservation(gpu_ledger, pod).grant.node == "gpu-t4"
    assert pod["spec"]["affinity"] == pinned_to("gpu-t4")
    assert container(pod)["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "10240",
        "nvidia.com/gpucores": "25",
    }
    assert "priorityClassName" not in pod["spec"]
    assert_nothing_held(gpu_ledger)


def test_kai_fraction_binding(run_dag, k8s, gpu_ledger: Ledger) -> None:
    dag_run = run_dag("gpu_bind_kai")

    assert task_state(dag_run) == "success"
    pod = only_pod(k8s)
    assert pod["spec"]["schedulerName"] == "kai-scheduler"
    assert pod["metadata"]["annotations"]["gpu-fraction"] == "0.5"
    assert container(pod)["resources"] == {"requests": {"cpu": "1000m", "memory": "1024Mi"}}
    assert pod["spec"]["affinity"] == pinned_to("gpu-a100")
    assert_nothing_held(gpu_ledger)


def test_device_pinning_binding(run_dag, k8s, gpu_ledger: Ledger) -> None:
    # The node agent (on the fake NVML) reports the node's real UUIDs first.
    spec = node_spec("gpu-a100", 4)
    collector = NvmlCollector(FakeNvml(spec), "gpu-a100")
    collector.open()
    gpu_ledger.record_report(collector.sample(30.0))

    dag_run = run_dag("gpu_bind_device")

    assert task_state(dag_run) == "success"
    pod = only_pod(k8s)
    grant = the_reservation(gpu_ledger, pod).grant
    assert grant.gpu_uuids_verified
    assert env_of(pod)["NVIDIA_VISIBLE_DEVICES"] == grant.gpu_uuids[0]
    assert grant.gpu_uuids[0] == spec["gpus"][grant.gpu_indices[0]]["uuid"]
    assert grant.gpu_uuids[0].startswith("GPU-") and len(grant.gpu_uuids[0]) == 40
    assert "limits" not in container(pod)["resources"]
    assert pod["spec"]["affinity"] == pinned_to(grant.node)
    assert_nothing_held(gpu_ledger)


def test_device_pinning_refuses_uuids_no_agent_reported(run_dag, k8s, gpu_ledger: Ledger) -> None:
    dag_run = run_dag("gpu_bind_device")

    assert task_state(dag_run) == "failed"
    assert k8s.created_pods() == []  # refused before any pod exists
    assert_nothing_held(gpu_ledger)


def test_deferrable_pod_mode_runs_and_releases(run_dag, k8s, gpu_ledger: Ledger) -> None:
    dag_run = run_dag("gpu_deferrable_pod")

    assert task_state(dag_run) == "success"
    reservation = the_reservation(gpu_ledger, only_pod(k8s))
    assert reservation.state is ReservationState.RELEASED and "pod succeeded" in reservation.message
    assert_nothing_held(gpu_ledger)


def test_failing_pod_fails_the_task_and_releases(run_dag, k8s, gpu_ledger: Ledger) -> None:
    dag_run = run_dag("gpu_failing_pod")

    assert task_state(dag_run) == "failed"
    reservation = the_reservation(gpu_ledger, only_pod(k8s))
    assert reservation.state is ReservationState.RELEASED and "task failed" in reservation.message
    assert_nothing_held(gpu_ledger)


def test_pod_never_scheduled_hits_launch_timeout_and_releases(run_dag, k8s, gpu_ledger: Ledger) -> None:
    dag_run = run_dag("gpu_never_scheduled")

    assert task_state(dag_run) == "failed"
    pod = only_pod(k8s)
    assert the_reservation(gpu_ledger, pod).state is ReservationState.RELEASED
    assert_nothing_held(gpu_ledger)


def release_when_queued(ledger: Ledger, blocker_id: str) -> threading.Thread:
    """Release ``blocker_id`` once a request waits behind it (the other task's release)."""

    def release() -> None:
        deadline = time.monotonic() + 60
        while not ledger.snapshot().queue and time.monotonic() < deadline:
            time.sleep(0.05)
        ledger.release(blocker_id, reason="the other task finished")

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("dag_id", ["gpu_queued", "gpu_queued_in_place"], ids=["deferred", "in-place"])
def test_full_cluster_waits_then_runs_after_release(
    run_dag: Callable[[str], Any], k8s, gpu_ledger: Ledger, dag_id: str
) -> None:
    blocker = gpu_ledger.reserve(GpuRequest(gpus=4, gpu_models=[A100]), "other-task")
    releaser = release_when_queued(gpu_ledger, blocker.id)

    dag_run = run_dag(dag_id)

    releaser.join(timeout=5)
    assert task_state(dag_run) == "success"
    reservation = the_reservation(gpu_ledger, only_pod(k8s))
    assert reservation.created_at < reservation.grant.granted_at, "it waited in the queue first"
    assert_nothing_held(gpu_ledger)


def test_reservation_timeout_fails_and_names_the_blocker(run_dag, k8s, gpu_ledger: Ledger) -> None:
    blocker = gpu_ledger.reserve(GpuRequest(gpus=4, gpu_models=[A100]), "other-task")

    dag_run = run_dag("gpu_times_out")

    assert task_state(dag_run) == "failed"
    assert k8s.created_pods() == []
    (timed_out,) = gpu_ledger.history(states=[ReservationState.TIMED_OUT])
    assert "gpu-a100: needs 1 free GPUs, 0 free of 4" in timed_out.message
    gpu_ledger.release(blocker.id)
    assert_nothing_held(gpu_ledger)


class FakeTaskInstance:
    """The task-instance fields GpuPodOperator and KubernetesPodOperator read, with an in-memory XCom."""

    def __init__(self, task_id: str) -> None:
        import datetime

        self.dag_id, self.task_id, self.map_index, self.try_number = "kill_test", task_id, -1, 1
        self.run_id = "manual__2026-01-01T00:00:00+00:00"
        self.start_date = datetime.datetime.now(tz=datetime.UTC)
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def test_on_kill_deletes_the_pod_and_releases(
    k8s, gpu_ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from airflow_gpupool.operators import GpuPodOperator

    monkeypatch.setenv("GPUPOOL_LEDGER_URL", gpu_ledger.url)
    task = GpuPodOperator(
        task_id="long-train",
        name="long-train",
        namespace="default",
        image="train:1",
        config_file=k8s.kubeconfig_path,
        in_cluster=False,
        get_logs=False,
        startup_check_interval_seconds=1,
        gpus=1,
        ledger_conn_id=None,
        annotations={"gpupool.emulator/duration-seconds": "60"},
    )
    ti = FakeTaskInstance("long-train")
    context = {"ti": ti, "task_instance": ti, "run_id": ti.run_id, "dag": SimpleNamespace(dag_id=ti.dag_id)}
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            task.execute(context)  # type: ignore[arg-type]
        except BaseException as e:  # the kill makes the task fail
            outcome.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    while not (k8s.created_pods() and k8s.pods()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pod_name = only_pod(k8s)["metadata"]["name"]
    k8s.wait_for_pod(pod_name, phases={"Running"}, timeout=10)
    assert len(gpu_ledger.snapshot().grants) == 1

    task.on_kill()
    worker.join(timeout=30)

    assert k8s.pod(pod_name) is None, "on_kill deletes the pod"
    (reservation,) = gpu_ledger.history()
    assert reservation.state is ReservationState.RELEASED and reservation.message == "task killed"
    assert ti.xcoms["gpupool_grant"]["reservation_id"] == reservation.id
    assert_nothing_held(gpu_ledger)


def test_on_kill_keeping_the_pod_keeps_its_slice_until_the_pod_ends(
    k8s, gpu_ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from airflow_gpupool.operators import GpuPodOperator

    monkeypatch.setenv("GPUPOOL_LEDGER_URL", gpu_ledger.url)
    task = GpuPodOperator(
        task_id="kept-train",
        name="kept-train",
        namespace="default",
        image="train:1",
        config_file=k8s.kubeconfig_path,
        in_cluster=False,
        get_logs=False,
        startup_check_interval_seconds=1,
        gpus=1,
        ledger_conn_id=None,
        on_kill_action="keep_pod",
        on_finish_action="keep_pod",
        annotations={"gpupool.emulator/duration-seconds": "8"},
    )
    ti = FakeTaskInstance("kept-train")
    context = {"ti": ti, "task_instance": ti, "run_id": ti.run_id, "dag": SimpleNamespace(dag_id=ti.dag_id)}
    worker = threading.Thread(target=task.execute, args=(context,), daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    while not (k8s.created_pods() and k8s.pods()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pod_name = only_pod(k8s)["metadata"]["name"]
    k8s.wait_for_pod(pod_name, phases={"Running"}, timeout=10)
    (held,) = gpu_ledger.snapshot().grants

    task.on_kill()

    # The pod was kept and runs on: its slice is not released under it.
    pod = k8s.pod(pod_name)
    assert pod is not None and pod["status"]["phase"] == "Running"
    assert "deletionTimestamp" not in pod["metadata"]
    assert gpu_ledger.get(held.id).state is ReservationState.GRANTED
    # The pod's end frees it (here the task itself, still waiting on the pod, releases it).
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert [p["status"]["phase"] for p in k8s.pod_history(pod_name)][-1] == "Succeeded"
    assert gpu_ledger.get(held.id).state is ReservationState.RELEASED
    assert_nothing_held(gpu_ledger)


def test_example_dag_runs_under_dag_test(run_dag, k8s, gpu_ledger: Ledger) -> None:
    dag_run = run_dag("example_gpu_pod")

    assert task_state(dag_run) == "success"
    pod = only_pod(k8s)
    assert container(pod)["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "10240",
        "nvidia.com/gpucores": "25",
    }
    assert_nothing_held(gpu_ledger)
