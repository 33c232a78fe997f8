"""The ladder chooses ``cpu_fallback``: a try that failed for a GPU reason is retried without a GPU.

Real Airflow (``dag.test()`` retries each failed try in the same run, ``retry_delay=0``; the DAGs are
in ``dags/ladder_fallback_dags.py``), the real KubernetesPodOperator code over HTTP to the emulator, a
real SQLite ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from airflow_gpupool.ledger import Ledger, TaskAttempts
from airflow_gpupool.testing import KubernetesEmulatorServer

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."
CUDA_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}


def on_a_gpu(pod: dict[str, Any]) -> bool:
    return "GPUPOOL_RESERVATION_ID" in env_of(pod)


def the_ti(dag_run: Any) -> Any:
    (ti,) = dag_run.get_task_instances()
    return ti


def device_xcom(dag_run: Any) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id).all()
        return {row.key: XComModel.deserialize_value(row) for row in rows}


def history(ledger: Ledger, dag_run: Any) -> list[Any]:
    return TaskAttempts(ledger).history(f"{dag_run.dag_id}/train/{dag_run.run_id}/map--1")


def assert_nothing_held(ledger: Ledger) -> None:
    snap = ledger.snapshot()
    assert snap.grants == () and snap.queue == () and ledger.check_invariants() == []


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferrable"])
def test_a_gpu_fault_is_retried_on_the_cpu_fallback(
    run_dag: Callable[[str], Any], k8s: KubernetesEmulatorServer, gpu_ledger: Ledger, deferrable: bool
) -> None:
    k8s.configure_pod(predicate=on_a_gpu, exit_code=1, log_lines=["step 3", XID_79])
    dag_id = f"ladder_gpu_fault_{'def' if deferrable else 'sync'}"

    dag_run = run_dag(dag_id)

    ti = the_ti(dag_run)
    assert (str(ti.state), ti.try_number) == ("success", 2)
    on_gpu, on_cpu = k8s.created_pods()
    assert on_a_gpu(on_gpu) and env_of(on_gpu).get("GPUPOOL_DEVICE") is None
    assert env_of(on_cpu)["GPUPOOL_DEVICE"] == "cpu" and not on_a_gpu(on_cpu)
    assert "nvidia.com/gpu" not in str(on_cpu["spec"]["containers"][0].get("resources"))
    assert not on_cpu["spec"].get("affinity"), "the fallback is not pinned to a GPU node"
    (attempt,) = history(gpu_ledger, dag_run)
    assert (attempt.try_number, attempt.failure_class, attempt.remedy) == (1, "gpu_fault", "cpu_fallback")
    assert "retrying on the CPU fallback" in attempt.message and "Xid" in attempt.message
    assert device_xcom(dag_run)["gpupool_device"] == "cpu"
    assert_nothing_held(gpu_ledger)


def test_without_cpu_fallback_a_gpu_fault_retries_on_a_gpu(
    run_dag: Callable[[str], Any], k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    k8s.configure_pod(predicate=on_a_gpu, exit_code=1, log_lines=[XID_79])
    dag_run = run_dag("ladder_gpu_fault_no_fallback")

    assert str(the_ti(dag_run).state) == "failed"
    assert [on_a_gpu(p) for p in k8s.created_pods()] == [True, True]
    assert [(a.failure_class, a.remedy) for a in history(gpu_ledger, dag_run)] == [
        ("gpu_fault", "retry"),
        ("gpu_fault", "retry"),
    ]
    assert_nothing_held(gpu_ledger)


def test_gpu_out_of_memory_with_no_larger_slice_falls_back_to_the_cpu(
    run_dag: Callable[[str], Any], k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    # Four whole A100s of 80 GB: the largest the inventory holds, so retry_larger has no rung left.
    k8s.configure_pod(predicate=on_a_gpu, exit_code=1, log_lines=[CUDA_OOM])

    dag_run = run_dag("ladder_gpu_oom")

    assert (str(the_ti(dag_run).state), the_ti(dag_run).try_number) == ("success", 2)
    assert [on_a_gpu(p) for p in k8s.created_pods()] == [True, False]
    (attempt,) = history(gpu_ledger, dag_run)
    assert (attempt.failure_class, attempt.remedy) == ("out_of_memory", "cpu_fallback")
    assert_nothing_held(gpu_ledger)


def test_once_chosen_the_rest_of_the_run_stays_on_the_cpu(
    run_dag: Callable[[str], Any], k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    k8s.configure_pod(predicate=on_a_gpu, exit_code=1, log_lines=[XID_79])
    k8s.configure_pod(predicate=lambda pod: not on_a_gpu(pod), exit_code=2, log_lines=["RuntimeError: boom"])

    dag_run = run_dag("ladder_sticky_cpu")

    assert (str(the_ti(dag_run).state), the_ti(dag_run).try_number) == ("failed", 3)
    assert [on_a_gpu(p) for p in k8s.created_pods()] == [True, False, False]
    assert [(a.failure_class, a.remedy) for a in history(gpu_ledger, dag_run)] == [
        ("gpu_fault", "cpu_fallback"),
        ("application_error", "retry"),
        ("application_error", "retry"),
    ]
    assert_nothing_held(gpu_ledger)
