"""``prefer_node_labels``: of two nodes that both fit, the grant (and the pod) lands on the preferred one."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_gpupool.ledger import Ledger
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.integration.compat.driver import emulated_gpu_pod, run_task
from tests.ledger_fixtures import node

V100 = "Tesla-V100-SXM2-32GB"
CACHE = {"gpupool.io/dataset-cache": "imagenet"}
HOSTNAME_PIN = "kubernetes.io/hostname"


def pinned_node(pod: dict[str, Any]) -> str:
    required = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = required["nodeSelectorTerms"]
    (expression,) = [e for e in term["matchExpressions"] if e["key"] == HOSTNAME_PIN]
    (name,) = expression["values"]
    return str(name)


@pytest.mark.parametrize("cached", ["gpu-v100-a", "gpu-v100-b"])
def test_the_grant_lands_on_the_preferred_node_when_both_fit(
    k8s: KubernetesEmulatorServer, gpu_ledger: Ledger, cached: str
) -> None:
    # Two identical V100 nodes; only the label tells them apart (each order, so the name cannot decide).
    names = ("gpu-v100-a", "gpu-v100-b")
    gpu_ledger.upsert_nodes(
        [node(n, gpus=2, model=V100, memory_mib=32768, labels=CACHE if n == cached else {}) for n in names]
    )
    for n in names:
        k8s.add_node(gpu_node(n, gpus=2, product=V100, memory_mib=32768))
    task_id = f"prefer-{cached}"
    op = emulated_gpu_pod(k8s.kubeconfig_path, task_id, gpus=1, gpu_models=[V100], prefer_node_labels=CACHE)

    ti = run_task(op, "prefer")

    assert ti.xcoms["gpupool_grant"]["node"] == cached
    (pod,) = k8s.created_pods()
    assert pinned_node(pod) == cached and pod["spec"].get("nodeName") in (None, cached)
    assert k8s.pod_history(task_id)[-1]["status"]["phase"] == "Succeeded"
    assert gpu_ledger.snapshot().grants == ()
