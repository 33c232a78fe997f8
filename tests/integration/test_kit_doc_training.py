from __future__ import annotations

from airflow_gpupool.ledger import TaskAttempts
from airflow_gpupool.testing import hami_pool


def test_a_training_run_that_crashes_fails_the_task_and_frees_the_slice(gpu_cluster):
    cluster = gpu_cluster(nodes=[hami_pool("t4-shared", gpus=2)])
    # The emulated kubelet runs the pod for 1 s, writes two log lines, then exits with status 1.
    cluster.k8s.configure_pod(
        name="embed-*", duration_seconds=1, log_lines=["epoch 1 loss 0.91", "epoch 2 loss nan"], exit_code=1
    )
    run = cluster.run_dag("embed_on_t4")
    assert run.state == "failed"
    (pod,) = cluster.created_pods()
    assert cluster.k8s.logs(pod["metadata"]["name"])[:2] == ["epoch 1 loss 0.91", "epoch 2 loss nan"]
    (attempt,) = TaskAttempts(cluster.ledger).history(f"embed_on_t4/embed/{run.run_id}/map--1")
    assert (attempt.failure_class, attempt.exit_code) == ("application_error", 1)
    assert cluster.ledger.snapshot().grants == ()
