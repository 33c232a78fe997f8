"""Checkpoints, retries and escalation end to end: dag.test() retries each failed try in the same
run (``retry_delay=0``), against the Kubernetes emulator and a SQLite ledger."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.checkpoints import CheckpointStore
from airflow_gpupool.ledger import Ledger, TaskAttempts
from airflow_gpupool.testing import KubernetesEmulatorServer

ESCALATIONS = Path(os.environ["AIRFLOW_HOME"]) / "escalations.jsonl"


@pytest.fixture(autouse=True)
def no_escalations() -> Iterator[None]:
    ESCALATIONS.unlink(missing_ok=True)
    yield
    ESCALATIONS.unlink(missing_ok=True)


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}


def ti_of(dag_run: Any, task_id: str = "train") -> Any:
    return next(ti for ti in dag_run.get_task_instances() if ti.task_id == task_id)


def checkpoint_dir(dag_run: Any) -> Path:
    return Path(os.environ["AIRFLOW_HOME"]) / "checkpoints" / dag_run.dag_id / dag_run.run_id


def assert_nothing_held(ledger: Ledger) -> None:
    snap = ledger.snapshot()
    assert snap.grants == () and snap.queue == ()
    assert ledger.check_invariants() == []


def escalations() -> list[dict[str, Any]]:
    return [json.loads(line) for line in ESCALATIONS.read_text().splitlines()] if ESCALATIONS.exists() else []


def test_failed_step_retries_and_resumes_from_newest_checkpoint(run_dag, k8s, gpu_ledger: Ledger) -> None:
    dag_run = run_dag("ckpt_resume")

    assert str(ti_of(dag_run).state) == "success" and ti_of(dag_run).try_number == 2
    first, retry = k8s.created_pods()
    root = checkpoint_dir(dag_run)
    assert "GPUPOOL_RESUME_FROM" not in env_of(first)
    assert env_of(retry)["GPUPOOL_CHECKPOINT_DIR"] == str(root)
    assert env_of(retry)["GPUPOOL_RESUME_FROM"] == f"{root}/step-000003"
    assert (root / "COMPLETE").exists()
    # Retention (keep_checkpoints=2): exactly the newest two, the resumed-from step 3 unpinned and gone.
    assert sorted(p.name for p in root.glob("step-*")) == ["step-000004", "step-000005"]
    assert not list(root.glob(".gpupool-pins/*"))
    assert str(ti_of(dag_run, "watch").state) == "success"
    (attempt,) = TaskAttempts(gpu_ledger).history(f"ckpt_resume/train/{dag_run.run_id}/map--1")
    assert (attempt.failure_class, attempt.exit_code, attempt.checkpoint_step) == ("application_error", 1, 3)
    assert escalations() == []
    assert_nothing_held(gpu_ledger)


def test_out_of_memory_retries_on_the_next_larger_slice(
    run_dag, k8s: KubernetesEmulatorServer, gpu_ledger
) -> None:
    k8s.configure_pod(predicate=lambda pod: env_of(pod).get("GPUPOOL_GPU_MILLI") == "250", oom_killed=True)

    dag_run = run_dag("ckpt_oom")

    assert str(ti_of(dag_run).state) == "success"
    first, retry = k8s.created_pods()
    assert env_of(first)["GPUPOOL_GPU_MILLI"] == "250"
    assert env_of(retry)["GPUPOOL_GPU_MILLI"] == "500"
    assert env_of(retry)["GPUPOOL_RESUME_FROM"].endswith("step-000002")
    assert retry["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "8192",
        "nvidia.com/gpucores": "50",
    }
    grant = gpu_ledger.get(retry["metadata"]["labels"]["gpupool.io/reservation-id"]).grant
    assert (grant.milli_per_gpu, grant.gpu_memory_mib) == (500, 8192)
    (attempt,) = TaskAttempts(gpu_ledger).history(f"ckpt_oom/train/{dag_run.run_id}/map--1")
    assert (attempt.failure_class, attempt.remedy) == ("out_of_memory", "retry_larger")
    assert attempt.next_request is not None and attempt.next_request.gpu_milli == 500
    assert_nothing_held(gpu_ledger)


def test_evicted_pod_retries_and_resumes(run_dag, k8s: KubernetesEmulatorServer, gpu_ledger: Ledger) -> None:
    k8s.configure_pod(predicate=lambda pod: "GPUPOOL_RESUME_FROM" not in env_of(pod), evict=True)

    dag_run = run_dag("ckpt_preempted")

    assert str(ti_of(dag_run).state) == "success"
    first, retry = k8s.created_pods()
    (attempt,) = TaskAttempts(gpu_ledger).history(f"ckpt_preempted/train/{dag_run.run_id}/map--1")
    assert (attempt.failure_class, attempt.remedy, attempt.next_request) == ("evicted", "retry", None)
    assert attempt.checkpoint_step is not None and attempt.checkpoint_step >= 1
    assert env_of(retry)["GPUPOOL_RESUME_FROM"].endswith(f"step-{attempt.checkpoint_step:06d}")
    assert (checkpoint_dir(dag_run) / "COMPLETE").exists()
    assert_nothing_held(gpu_ledger)


def test_after_two_evictions_the_next_try_runs_on_on_demand_capacity_only(
    run_dag, k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    from airflow_gpupool.labels import CAPACITY_TYPE_LABEL
    from airflow_gpupool.task_try import TaskTry

    k8s.configure_pod(predicate=lambda pod: pod["metadata"]["labels"]["try_number"] in {"1", "2"}, evict=True)

    dag_run = run_dag("ckpt_evicted_twice")

    assert str(ti_of(dag_run).state) == "success"
    attempts = TaskAttempts(gpu_ledger).history(f"ckpt_evicted_twice/train/{dag_run.run_id}/map--1")
    assert [(a.try_number, a.failure_class) for a in attempts] == [(1, "evicted"), (2, "evicted")]
    requests = {
        n: gpu_ledger.get(
            TaskTry("ckpt_evicted_twice", "train", dag_run.run_id, -1, n).reservation_id
        ).request
        for n in (1, 2, 3)
    }
    assert [dict(requests[n].node_labels).get(CAPACITY_TYPE_LABEL) for n in (1, 2, 3)] == [
        None,
        None,
        "on-demand",
    ]
    # Each retry resumed from the newest checkpoint the evicted try left.
    *_, third = k8s.created_pods()
    assert "GPUPOOL_RESUME_FROM" in env_of(third)
    assert_nothing_held(gpu_ledger)


def test_image_pull_error_fails_at_once(run_dag, k8s, gpu_ledger: Ledger) -> None:
    dag_run = run_dag("ckpt_image_pull")

    ti = ti_of(dag_run)
    assert str(ti.state) == "failed" and ti.try_number == 1, "retries=2, yet no retry"
    assert len(k8s.created_pods()) == 1
    (attempt,) = TaskAttempts(gpu_ledger).history(f"ckpt_image_pull/train/{dag_run.run_id}/map--1")
    assert (attempt.failure_class, attempt.remedy) == ("image_pull", "fail")
    assert escalations() == []
    assert_nothing_held(gpu_ledger)


def test_exhausted_retries_notify_exactly_once(run_dag, k8s, gpu_ledger: Ledger) -> None:
    dag_run = run_dag("ckpt_exhausted")

    assert str(ti_of(dag_run).state) == "failed" and ti_of(dag_run).try_number == 2
    assert len(k8s.created_pods()) == 2
    (escalation,) = escalations()
    assert escalation["dag_id"] == "ckpt_exhausted" and escalation["task_id"] == "train"
    assert escalation["run_id"] == dag_run.run_id and escalation["try_number"] == 2
    assert (escalation["failure_class"], escalation["exit_code"]) == ("application_error", 1)
    assert escalation["last_checkpoint_step"] == 2
    assert "RuntimeError: boom" in escalation["log_tail"]
    assert [t["failure_class"] for t in escalation["tried"]] == ["application_error", "application_error"]
    assert escalation["decision"] == "application_error: retries exhausted"
    assert_nothing_held(gpu_ledger)


def test_retention_prunes_to_newest_n_but_never_a_pinned_step(tmp_path: Path) -> None:
    from airflow_gpupool.testing.pods.checkpoints import write_step

    for step in range(1, 8):
        write_step(tmp_path, step)
    store = CheckpointStore(str(tmp_path))
    store.pin(2, "gp-retry")

    assert store.prune(3) == [1, 3, 4]
    assert sorted(p.name for p in tmp_path.glob("step-*")) == [
        "step-000002",
        "step-000005",
        "step-000006",
        "step-000007",
    ]
