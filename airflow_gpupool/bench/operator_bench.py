"""`gpupool bench operator`: the wall time GpuPodOperator adds over a plain KubernetesPodOperator.

Runs ``tasks`` pairs of the same pod against the Kubernetes emulator, alternating a
GpuPodOperator (reserve → pinned pod → release, SQLite ledger) and a plain
KubernetesPodOperator, each through ``execute()`` with the same minimal task context, and
reports the median of the per-pair ratios (ours / plain). Nothing waits: the pool is empty.
"""

from __future__ import annotations

import datetime
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from airflow_gpupool.resources import GpuDevice, NodeInventory


class _TaskInstance:
    """The task-instance fields the operators read, with an in-memory XCom."""

    def __init__(self, task_id: str, try_number: int) -> None:
        self.dag_id, self.task_id, self.map_index, self.try_number = "bench_operator", task_id, -1, try_number
        self.run_id = f"bench__{try_number}"
        self.start_date = datetime.datetime.now(tz=datetime.UTC)
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def _context(task_id: str, index: int) -> dict[str, Any]:
    ti = _TaskInstance(task_id, index)
    return {"ti": ti, "task_instance": ti, "run_id": ti.run_id, "dag": SimpleNamespace(dag_id=ti.dag_id)}


def _timed(operator: Any, context: dict[str, Any]) -> float:
    started = time.perf_counter()
    operator.execute(context)
    return time.perf_counter() - started


def run_operator_bench(tasks: int = 10, duration_s: float = 0.5) -> dict[str, Any]:
    """Run the benchmark and return its numbers."""
    import os

    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    from airflow_gpupool.ledger import Ledger
    from airflow_gpupool.operators import GpuPodOperator
    from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node

    workdir = Path(tempfile.mkdtemp(prefix="gpupool-bench-operator-"))
    url = f"sqlite:///{workdir / 'ledger.db'}"
    Ledger.create(url).upsert_nodes(
        [
            NodeInventory(
                "gpu-0", 96000, 1048576, tuple(GpuDevice(i, f"GPU-{i}", "A100", 81920) for i in range(8))
            )
        ]
    )
    os.environ["GPUPOOL_LEDGER_URL"] = url
    ours, plain, ratios = [], [], []
    with KubernetesEmulatorServer(
        nodes=[gpu_node("gpu-0", gpus=8)], default_duration_seconds=duration_s
    ) as k8s:
        common: dict[str, Any] = {
            "namespace": "default",
            "image": "bench:1",
            "cmds": ["true"],
            "config_file": k8s.kubeconfig_path,
            "in_cluster": False,
            "get_logs": True,
            "startup_check_interval_seconds": 1,
        }
        for i in range(1, tasks + 1):
            gpu_task = GpuPodOperator(
                task_id=f"ours-{i}", name=f"ours-{i}", gpus=1, ledger_conn_id=None, **common
            )
            kpo_task = KubernetesPodOperator(
                task_id=f"plain-{i}", name=f"plain-{i}", container_resources=None, **common
            )
            # Alternate which goes first, so drift on a shared machine hits both alike.
            if i % 2:
                t_ours, t_plain = (
                    _timed(gpu_task, _context(f"ours-{i}", i)),
                    _timed(kpo_task, _context(f"plain-{i}", i)),
                )
            else:
                t_plain, t_ours = (
                    _timed(kpo_task, _context(f"plain-{i}", i)),
                    _timed(gpu_task, _context(f"ours-{i}", i)),
                )
            ours.append(t_ours)
            plain.append(t_plain)
            ratios.append(t_ours / t_plain)
    leaked = len(Ledger(url).snapshot().grants)
    return {
        "tasks": tasks,
        "pod_seconds": duration_s,
        "ours_median_s": round(statistics.median(ours), 3),
        "plain_median_s": round(statistics.median(plain), 3),
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_max": round(max(ratios), 3),
        "grants_leaked": leaked,
    }
