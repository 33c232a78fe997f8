from __future__ import annotations

from airflow_gpupool.testing import hami_pool


def test_run_dag_returns_the_dag_run(gpu_cluster):
    cluster = gpu_cluster(nodes=[hami_pool("t4-shared", gpus=2)])
    run = cluster.run_dag("embed_on_t4", run_conf={"dataset": "small"})
    assert run.state == "success"  # or "failed": a failed task does not raise
    assert (run.dag_id, run.conf) == ("embed_on_t4", {"dataset": "small"})
    (ti,) = run.get_task_instances()
    assert (ti.task_id, ti.state, ti.try_number) == ("embed", "success", 1)
