"""``--health-port`` of ``gpupool controller run`` and ``gpupool agent run``, as the kubelet probes them.

The processes run as in their pods (a subprocess each), against the Kubernetes emulator and a
SQLite ledger; the probes' paths are those of ``deploy/kustomize/base``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_gpupool.inventory.sync import core_v1_api, sync_inventory
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from airflow_gpupool.testing.fake_nvml import node_spec, write_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def k8s() -> Iterator[KubernetesEmulatorServer]:
    with KubernetesEmulatorServer(
        nodes=[gpu_node("gpu-a-0", gpus=2)], default_duration_seconds=0.1
    ) as server:
        yield server


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/ledger.db"
    Ledger.create(url).close()
    return url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def probe(port: int, path: str) -> int | None:
    """Return the status code of ``GET path``, or None when nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def wait_for(port: int, path: str, status: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while probe(port, path) != status:
        assert time.monotonic() < deadline, f"{path} never answered {status}"
        time.sleep(0.2)


def run_until_ready_then_stop(args: list[str], tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "process.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_gpupool.cli", *args, "--health-port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            wait_for(port, "/readyz", 200)
            assert probe(port, "/healthz") == 200
            assert probe(port, "/nothing") == 404
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, log_path.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert probe(port, "/healthz") is None  # the server stopped with the process


def test_the_controller_serves_its_probes_and_stops_them_on_sigterm(
    k8s: KubernetesEmulatorServer, url: str, tmp_path: Path
) -> None:
    args = ["controller", "run", "--url", url, "--kubeconfig", k8s.kubeconfig_path]
    run_until_ready_then_stop([*args, "--sync-interval", "0.5", "--reconcile-interval", "0.5"], tmp_path)


def test_the_agent_serves_its_probes_and_stops_them_on_sigterm(
    k8s: KubernetesEmulatorServer, url: str, tmp_path: Path
) -> None:
    ledger = Ledger(url)
    try:
        sync_inventory(ledger, core_v1_api(k8s.kubeconfig_path))
    finally:
        ledger.close()
    spec = tmp_path / "gpu-a-0.yaml"
    write_spec(spec, node_spec("gpu-a-0", 2))
    args = ["agent", "run", "--url", url, "--node", "gpu-a-0", "--interval", "1"]
    run_until_ready_then_stop([*args, "--backend", "fake", "--fake-spec", str(spec)], tmp_path)
