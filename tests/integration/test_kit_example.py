from __future__ import annotations

from airflow_gpupool.testing import hami_pool, whole_gpu_pool


def test_embed_runs_on_a_shared_t4(gpu_cluster):
    cluster = gpu_cluster(nodes=[whole_gpu_pool("a100", gpus=8), hami_pool("t4-shared", gpus=2)])
    run = cluster.run_dag("embed_on_t4")
    assert run.state == "success"
    (pod,) = cluster.created_pods()
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] == "4096"
    assert cluster.ledger.snapshot().grants == ()
