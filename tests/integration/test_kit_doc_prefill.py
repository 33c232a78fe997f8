from __future__ import annotations

from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import hami_pool


def test_a_busy_node_sends_the_task_to_the_free_one(gpu_cluster):
    cluster = gpu_cluster(nodes=[hami_pool("t4-shared", nodes=2, gpus=2)])
    # Another team holds both T4s of one node before the DAG runs.
    held = cluster.ledger.reserve(GpuRequest(gpus=2, gpu_models=["Tesla-T4"]), "another team")
    busy = held.grant.node
    run = cluster.run_dag("embed_on_t4")
    assert run.state == "success"
    (pod,) = cluster.created_pods()
    affinity = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert affinity["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] != [busy]
    assert [r.grant.node for r in cluster.ledger.snapshot().grants] == [busy]  # the task gave its slice back
    cluster.ledger.release(held.id)
