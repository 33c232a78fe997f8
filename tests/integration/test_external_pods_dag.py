"""The walk of issue 36: a GPU pod applied with kubectl fills the A100 node, then ``gpu_retraining`` runs.

With the controller's pod watch counting the foreign pod, ``train`` waits for the node instead of
being granted GPUs the pod holds: its pod is never ``Pending`` on a full node, and starts only
once the foreign pod has ended.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_gpupool.controller.external_pods import ExternalPodCounter
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.testing import KubernetesEmulatorServer
from tests.integration.test_external_pods import wait_for

FOREIGN_SECONDS = 4.0


@pytest.fixture
def counting(gpu_ledger: Ledger, k8s: KubernetesEmulatorServer, core: Any) -> Iterator[ExternalPodCounter]:
    counter = ExternalPodCounter(gpu_ledger, core)
    counter.start()
    wait_for(lambda: counter.watch.stats.lists >= 1, "the pod watch's first list")
    yield counter
    counter.stop()


def unschedulable(pod_versions: list[dict[str, Any]]) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
        for version in pod_versions
        for c in (version.get("status") or {}).get("conditions") or []
    )


def test_train_waits_for_the_node_a_foreign_pod_fills_and_is_never_pending_on_it(
    run_dag: Any,
    k8s: KubernetesEmulatorServer,
    gpu_ledger: Ledger,
    counting: ExternalPodCounter,
    tmp_path: Path,
) -> None:
    notebook = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "notebook",
            "annotations": {"gpupool.emulator/duration-seconds": str(FOREIGN_SECONDS)},
        },
        "spec": {
            "restartPolicy": "Never",
            "nodeName": "gpu-a100",
            "containers": [
                {"name": "lab", "image": "jupyter:1", "resources": {"limits": {"nvidia.com/gpu": "4"}}}
            ],
        },
    }
    manifest = tmp_path / "notebook.yaml"
    manifest.write_text(yaml.safe_dump(notebook))
    # --validate=false: the emulator serves no OpenAPI document for kubectl's client-side validation.
    subprocess.run(
        ["kubectl", "--kubeconfig", k8s.kubeconfig_path, "apply", "--validate=false", "-f", str(manifest)],
        check=True,
        capture_output=True,
    )
    wait_for(lambda: gpu_ledger.external_holds(), "the notebook counted")

    dag_run = run_dag("gpu_retraining")

    assert str(dag_run.state) == "success"
    records = {r.name: r for r in k8s.pod_records()}
    foreign = records["notebook"]
    assert foreign.ended_at is not None
    trains = [r for r in k8s.pod_records() if r.name.startswith("train")]
    assert trains, "train never ran"
    for train in trains:
        assert not unschedulable(k8s.pod_history(train.name)), f"{train.name} sat Pending on a full node"
        assert train.started_at is not None and train.started_at >= foreign.ended_at
    assert gpu_ledger.external_holds() == []
    assert gpu_ledger.check_invariants() == []
