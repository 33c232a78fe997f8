"""Integration fixtures: one migrated Airflow DB and one Kubernetes emulator for the session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.inventory import sync_inventory
from airflow_gpupool.inventory.sync import core_v1_api
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.ledger_fixtures import node
from tests.s3_fixtures import moto_s3  # noqa: F401  (a real S3 API for the s3:// checkpoint tests)

DAGS_FOLDER = Path(__file__).parent / "dags"
A100 = "NVIDIA-A100-SXM4-80GB"
T4 = "Tesla-T4"


def cluster_nodes() -> list[dict[str, Any]]:
    """The emulated cluster: an A100 node, a MIG node, and a T4 node shared through HAMi."""
    t4 = gpu_node("gpu-t4", gpus=2, product=T4, memory_mib=15360, pool="t4-shared")
    # HAMi's device plugin advertises GPU memory and cores as resources of their own.
    t4["status"]["allocatable"].update({"nvidia.com/gpumem": "30720", "nvidia.com/gpucores": "200"})
    return [
        gpu_node("gpu-a100", gpus=4, product=A100, memory_mib=81920, pool="a100"),
        gpu_node("gpu-mig", gpus=1, product=A100, memory_mib=81920, mig={"1g.10gb": 7}, pool="a100-mig"),
        t4,
    ]


def ledger_inventory() -> list[Any]:
    """The same cluster as the ledger sees it."""
    return [
        node("gpu-a100", gpus=4, model=A100, cpu=96000, mem=1048576, pool="a100"),
        node(
            "gpu-mig", gpus=1, model=A100, cpu=96000, mem=1048576, mig={0: ["1g.10gb"] * 7}, pool="a100-mig"
        ),
        node("gpu-t4", gpus=2, model=T4, memory_mib=15360, cpu=96000, mem=1048576, pool="t4-shared"),
    ]


@pytest.fixture(autouse=True)
def _no_pod_watch_outlives_its_test() -> Iterator[None]:
    """Fail a test that leaves a pod watch running: it lists a cluster long gone, and its client's
    retries land in the logs of whatever test runs next (a CLI test's stderr, in CI once)."""
    before = set(_pod_watch_threads())
    yield
    deadline = time.monotonic() + 5  # PodWatch.stop waits as long for its thread
    while (left := _pod_watch_threads() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"{len(left)} pod watch thread(s) still run after the test: stop what you start"


def _pod_watch_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "gpupool-pod-watch"}


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Migrate the session's Airflow metadata DB (SQLite under the test AIRFLOW_HOME)."""
    assert os.environ["AIRFLOW__CORE__DAGS_FOLDER"] == str(DAGS_FOLDER), "set in tests/conftest.py"
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        check=True,
        capture_output=True,
        env=os.environ.copy(),
    )


@pytest.fixture(scope="session")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    with KubernetesEmulatorServer(nodes=cluster_nodes(), default_duration_seconds=0.3) as server:
        os.environ["GPUPOOL_TEST_KUBECONFIG"] = server.kubeconfig_path
        os.environ["KUBECONFIG"] = server.kubeconfig_path  # read by the example DAGs in dags/
        yield server


@pytest.fixture(scope="session")
def dagbag(airflow_db: None, emulator: KubernetesEmulatorServer) -> Any:
    from airflow_gpupool.testing.dagbag import dag_bag_class

    DagBag = dag_bag_class()

    bag = DagBag(str(DAGS_FOLDER))
    assert bag.import_errors == {}
    return bag


@pytest.fixture
def k8s(emulator: KubernetesEmulatorServer) -> KubernetesEmulatorServer:
    emulator.reset()
    return emulator


@pytest.fixture(scope="module")
def core(emulator: KubernetesEmulatorServer) -> Any:
    """A CoreV1Api of the module's emulator."""
    return core_v1_api(emulator.kubeconfig_path)


@pytest.fixture
def synced(ledger: Ledger, k8s: KubernetesEmulatorServer, core: Any) -> Ledger:
    """The test's ledger, its inventory synced from the (reset) emulator."""
    sync_inventory(ledger, core)
    return ledger


@pytest.fixture
def gpu_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    """A fresh SQLite ledger of the emulated cluster, named by the default gpupool connection."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger = Ledger.create(url)
    ledger.upsert_nodes(ledger_inventory())
    extra = {
        "ledger_url": url,
        "poll_interval_seconds": 0.2,
        "node_pool_bindings": "a100-mig=mig,t4-shared=hami",
    }
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({"conn_type": "gpupool", "extra": extra}))
    yield ledger
    ledger.close()


@pytest.fixture
def run_dag(dagbag: Any) -> Callable[[str], Any]:
    """Run a test DAG with ``dag.test()`` and return its DagRun."""

    def run(dag_id: str) -> Any:
        return dagbag.get_dag(dag_id).test()

    return run
