"""A granted pod the scheduler cannot place fails fast with the scheduler's reason (issue 15)."""

from __future__ import annotations

import time
from typing import Any

from airflow_gpupool.ledger import TaskAttempts
from airflow_gpupool.testing import GpuPool, gpu_node


def test_a_hami_pod_on_a_node_without_hami_resources_fails_fast_with_the_reason(gpu_cluster: Any) -> None:
    # A HAMi pool whose nodes lack nvidia.com/gpumem and nvidia.com/gpucores (the device plugin
    # is missing): the ledger grants the slice, the scheduler can never place the pod.
    t4 = gpu_node("t4-0", gpus=2, product="Tesla-T4", memory_mib=15360, pool="t4-shared")
    cluster = gpu_cluster(nodes=[GpuPool("t4-shared", "hami", (t4,))])
    started = time.monotonic()
    run = cluster.run_dag("embed_on_t4")
    elapsed = time.monotonic() - started

    assert run.state == "failed"
    assert elapsed < 60, f"took {elapsed:.0f} s: the 120 s schedule timeout was waited out"
    (attempt,) = TaskAttempts(cluster.ledger).history(f"embed_on_t4/embed/{run.run_id}/map--1")
    assert "unschedulable: 0/1 nodes are available" in attempt.message
    assert "Insufficient nvidia.com/gpu" in attempt.message
    assert cluster.ledger.snapshot().grants == ()
