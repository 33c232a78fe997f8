"""``prefer_node_labels``: of two nodes that both fit, the grant (and the pod) lands on the preferred one."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_gpupool.ledger import Ledger
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.integration.compat.driver import FakeTaskInstance, drive
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
    from airflow_gpupool.operators import GpuPodOperator

    # Two identical V100 nodes; only the label tells them apart (each order, so the name cannot decide).
    names = ("gpu-v100-a", "gpu-v100-b")
    gpu_ledger.upsert_nodes(
        [node(n, gpus=2, model=V100, memory_mib=32768, labels=CACHE if n == cached else {}) for n in names]
    )
    for n in names:
        k8s.add_node(gpu_node(n, gpus=2, product=V100, memory_mib=32768))
    task_id = f"prefer-{cached}"
    op = GpuPodOperator(
        task_id=task_id,
        name=task_id,
        random_name_suffix=False,
        namespace="default",
        image="registry.example/train:1",
        config_file=k8s.kubeconfig_path,
        in_cluster=False,
        startup_check_interval_seconds=1,
        poll_interval=0.2,
        gpus=1,
        gpu_models=[V100],
        prefer_node_labels=CACHE,
    )
    ti = FakeTaskInstance(task_id, 0)

    drive(op, {"ti": ti, "task_instance": ti, "run_id": ti.run_id, "dag": DAG("prefer", schedule=None)})

    assert ti.xcoms["gpupool_grant"]["node"] == cached
    (pod,) = k8s.created_pods()
    assert pinned_node(pod) == cached and pod["spec"].get("nodeName") in (None, cached)
    assert k8s.pod_history(task_id)[-1]["status"]["phase"] == "Succeeded"
    assert gpu_ledger.snapshot().grants == ()
