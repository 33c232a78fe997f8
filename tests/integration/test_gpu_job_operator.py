"""GpuJobOperator end to end: a gang of 3 pods, one Indexed Job, ``dag.test()`` on the emulator and a real ledger."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from airflow_gpupool.exceptions import ConfigurationError, InvalidGangError
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.operators import GpuJobOperator
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer
from tests.integration import gang_jobs
from tests.integration.gang_jobs import (
    INDEX,
    assert_gang_released,
    assert_pinned_to_members,
    leader_of,
    open_gang_ledger,
    the_job,
)

# The shared fixtures, found by pytest under these names.
gang_k8s = gang_jobs.gang_k8s
gang_ledger = gang_jobs.gang_ledger


@pytest.mark.parametrize("dag_id", ["gang_job", "gang_job_deferrable"])
def test_a_gang_of_three_runs_each_pod_pinned_to_its_member(
    gang_k8s: KubernetesEmulatorServer, gang_ledger: Ledger, run_dag: Callable[[str], Any], dag_id: str
) -> None:
    run = run_dag(dag_id)
    assert run.state == "success"
    job = the_job(gang_k8s)
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == (
        "Indexed",
        3,
        3,
    )
    assert job["status"]["succeeded"] == 3
    assert_pinned_to_members(gang_k8s, gang_ledger, job)
    assert_gang_released(gang_ledger, job)
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    name = job["metadata"]["name"]
    assert env["MASTER_ADDR"]["value"] == env["PET_MASTER_ADDR"]["value"] == f"{name}-0.{name}"
    assert (env["WORLD_SIZE"]["value"], env["PET_NNODES"]["value"], env["MASTER_PORT"]["value"]) == (
        "3",
        "3",
        "29500",
    )
    index_ref = f"metadata.annotations['{INDEX}']"
    assert env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == index_ref
    assert env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == index_ref
    assert (
        env["GPUPOOL_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.annotations['gpupool.io/node']"
    )
    assert job["spec"]["template"]["spec"]["subdomain"] == name
    assert job["spec"]["template"]["metadata"]["labels"]["gpupool.io/gang-reservation"] == leader_of(job)
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"


def test_the_core_case_on_postgresql(
    gang_k8s: KubernetesEmulatorServer,
    pg_schema_url: str,
    monkeypatch: pytest.MonkeyPatch,
    run_dag: Callable[[str], Any],
) -> None:
    ledger = open_gang_ledger(pg_schema_url, monkeypatch)
    try:
        assert run_dag("gang_job_deferrable").state == "success"
        job = the_job(gang_k8s)
        assert_pinned_to_members(gang_k8s, ledger, job)
        assert_gang_released(ledger, job)
    finally:
        ledger.close()


def test_a_gang_the_pool_cannot_hold_never_ungates_a_pod_and_times_out(
    gang_k8s: KubernetesEmulatorServer, gang_ledger: Ledger, run_dag: Callable[[str], Any]
) -> None:
    gang_ledger.reserve(GpuRequest(gpus=2), "someone else", reservation_id="busy")  # 2 of 4 GPUs held
    run = run_dag("gang_job_too_busy")
    assert run.state == "failed"
    assert gang_k8s.jobs("default") == [] and gang_k8s.pods("default") == []  # no Job, no pod, ever
    assert not [r for r in gang_k8s.requests if r.method in ("POST", "PATCH")]
    assert gang_ledger.get("busy").state is ReservationState.GRANTED  # the other holder is untouched
    assert [r.id for r in gang_ledger.snapshot().queue] == []  # the gang withdrew
    assert gang_ledger.check_invariants() == []


def test_a_queued_gang_runs_once_capacity_frees(
    gang_k8s: KubernetesEmulatorServer, gang_ledger: Ledger, run_dag: Callable[[str], Any]
) -> None:
    gang_ledger.reserve(GpuRequest(gpus=2), "someone else", reservation_id="busy")
    released = threading.Timer(1.5, lambda: gang_ledger.release("busy", reason="done"))
    released.start()
    try:
        run = run_dag("gang_job_queued")
    finally:
        released.cancel()
    assert run.state == "success"
    job = the_job(gang_k8s)
    first_job_request = next(
        r.time for r in gang_k8s.requests if r.method == "POST" and r.path.endswith("/jobs")
    )
    freed_at = gang_ledger.get("busy").ended_at
    assert freed_at is not None
    assert first_job_request >= freed_at  # the Job exists only once the gang is granted
    assert_pinned_to_members(gang_k8s, gang_ledger, job)
    assert_gang_released(gang_ledger, job)


def test_a_failed_job_fails_the_task_and_releases_the_gang(
    gang_k8s: KubernetesEmulatorServer, gang_ledger: Ledger, run_dag: Callable[[str], Any]
) -> None:
    run = run_dag("gang_job_failing")
    assert run.state == "failed"
    job = the_job(gang_k8s)
    assert any(c["type"] == "Failed" and c["status"] == "True" for c in job["status"]["conditions"])
    assert_gang_released(gang_ledger, job)


def test_arguments_the_gang_decides_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="parallelism=3"):
        GpuJobOperator(task_id="t", members=3, gpus=1, image="x", parallelism=2)
    with pytest.raises(ConfigurationError, match="wait_until_job_complete"):
        GpuJobOperator(task_id="t", members=3, gpus=1, image="x", wait_until_job_complete=False)
    with pytest.raises(InvalidGangError):
        GpuJobOperator(task_id="t", members=0, gpus=1, image="x")
    op = GpuJobOperator(task_id="t", members=2, gpus=1, image="x", completions=2)
    request = op.gpu_request()
    assert request.gang is not None and (request.gang.members, request.gang.min_members) == (2, 2)
    assert (op.completion_mode, op.completions, op.parallelism, op.backoff_limit) == ("Indexed", 2, 2, 0)


def test_on_kill_deletes_the_job_and_releases_the_gang(
    gang_k8s: KubernetesEmulatorServer, gang_ledger: Ledger
) -> None:
    from kubernetes import client, config

    batch = client.BatchV1Api(config.new_client_from_config(gang_k8s.kubeconfig_path))
    gang_ledger.reserve(
        GpuJobOperator(task_id="t", members=3, gpus=1, image="x").gpu_request(), "me", reservation_id="g"
    )
    body = {
        "metadata": {"name": "job-killed", "namespace": "default"},
        "spec": {
            "template": {
                "metadata": {"annotations": {"gpupool.emulator/duration-seconds": "30"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "base", "image": "x"}]},
            }
        },
    }
    created = batch.create_namespaced_job("default", body)
    op = GpuJobOperator(
        task_id="t", members=3, gpus=1, image="x", config_file=gang_k8s.kubeconfig_path, in_cluster=False
    )
    op._held_id, op.job = "g", created
    op.on_kill()
    assert gang_k8s.job("job-killed") is None and gang_k8s.pods("default") == []
    assert [m.state for m in gang_ledger.gang("g").members] == [ReservationState.RELEASED] * 3
