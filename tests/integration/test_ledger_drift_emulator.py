"""Drift made visible on the emulator (SQLite and PostgreSQL): `gpupool status` and the exporter's gauge."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from airflow_gpupool.cli import main
from airflow_gpupool.cli.cluster import cluster_pods
from airflow_gpupool.cli.metrics import serve
from airflow_gpupool.controller.external_pods import ExternalPodCounter
from airflow_gpupool.inventory.sync import sync_inventory
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.integration.multiworker.harness import free_port
from tests.integration.test_external_pods import wait_for


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    with KubernetesEmulatorServer(
        nodes=[gpu_node("gpu-a", gpus=4), gpu_node("gpu-b", gpus=4)], default_duration_seconds=600
    ) as server:
        yield server


@pytest.fixture
def core(emulator: KubernetesEmulatorServer) -> Any:
    emulator.reset()
    return client.CoreV1Api(config.new_client_from_config(emulator.kubeconfig_path))


def apply_notebook(emulator: KubernetesEmulatorServer, tmp_path: Path) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "notebook"},
        "spec": {
            "nodeName": "gpu-a",
            "containers": [
                {"name": "main", "image": "jupyter:1", "resources": {"limits": {"nvidia.com/gpu": "4"}}}
            ],
        },
    }
    manifest = tmp_path / "notebook.yaml"
    manifest.write_text(yaml.safe_dump(pod))
    # --validate=false: the emulator serves no OpenAPI document for kubectl's client-side validation.
    kubectl = [
        "kubectl",
        "--kubeconfig",
        emulator.kubeconfig_path,
        "apply",
        "--validate=false",
        "-f",
        str(manifest),
    ]
    subprocess.run(kubectl, check=True, capture_output=True)


def status(capsys: pytest.CaptureFixture[str], ledger: Ledger, *extra: str) -> str:
    capsys.readouterr()
    assert main(["status", "--url", ledger.url, *extra]) == 0
    return capsys.readouterr().out


def drift_json(
    capsys: pytest.CaptureFixture[str], ledger: Ledger, kubeconfig: str
) -> dict[str, dict[str, Any]]:
    out = json.loads(status(capsys, ledger, "--json", "--kubeconfig", kubeconfig))
    assert out["drift"]["cluster_read"] is True
    return {row["node"]: row for row in out["drift"]["nodes"]}


def scraped_drift(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("gpupool_ledger_drift_gpus{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('node="', 1)[1].split('"', 1)[0]] = float(value)
    return out


def test_a_counted_foreign_pod_is_no_drift_and_a_lost_hold_shows_in_status_and_the_gauge(
    ledger: Ledger,
    core: Any,
    emulator: KubernetesEmulatorServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sync_inventory(ledger, core)
    counter = ExternalPodCounter(ledger, core)
    counter.start()
    port, stop = free_port(), threading.Event()
    exporter = threading.Thread(
        target=serve,
        args=(port, ledger.url),
        kwargs={"stop": stop, "pods": cluster_pods(emulator.kubeconfig_path, None)},
        daemon=True,
    )
    exporter.start()
    try:
        apply_notebook(emulator, tmp_path)
        wait_for(lambda: ledger.external_holds(), "the notebook counted")

        rows = drift_json(capsys, ledger, emulator.kubeconfig_path)
        assert {n: (r["external_gpus"], r["running_gpus"], r["drift_gpus"]) for n, r in rows.items()} == {
            "gpu-a": (4, 4, 0),
            "gpu-b": (0, 0, 0),
        }
        assert wait_for(lambda: scraped_drift(port), "the exporter up") == {"gpu-a": 0, "gpu-b": 0}

        # The books made wrong on purpose: the watch stopped, the notebook's hold ended as if its pod were gone.
        counter.stop()
        ledger.sync_external([], gone=["default/notebook"])

        rows = drift_json(capsys, ledger, emulator.kubeconfig_path)
        assert (rows["gpu-a"]["external_gpus"], rows["gpu-a"]["free_gpus"], rows["gpu-a"]["drift_gpus"]) == (
            0,
            4,
            4,
        )
        assert rows["gpu-a"]["mismatched"] == ["external:default/notebook: 0 → 4"]
        assert scraped_drift(port) == {"gpu-a": 4, "gpu-b": 0}
        text = status(capsys, ledger, "--kubeconfig", emulator.kubeconfig_path)
        assert "external:default/notebook: 0 → 4" in text

        # A relist heals the books: no drift again.
        counter.count_once()
        assert ledger.external_holds(), "relisted"
        assert scraped_drift(port) == {"gpu-a": 0, "gpu-b": 0}
    finally:
        stop.set()
        exporter.join(10)
        counter.stop()


def test_without_a_kubeconfig_status_shows_the_ledger_side_and_says_so(
    ledger: Ledger, core: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    sync_inventory(ledger, core)

    text = status(capsys, ledger)
    out = json.loads(status(capsys, ledger, "--json"))

    assert "the cluster's pods not read: pass --kubeconfig" in text
    assert out["drift"]["cluster_read"] is False
    assert [(r["node"], r["free_gpus"], r["drift_gpus"]) for r in out["drift"]["nodes"]] == [
        ("gpu-a", 4, None),
        ("gpu-b", 4, None),
    ]


def test_a_kubeconfig_that_cannot_be_read_is_refused_before_anything_is_shown(
    ledger: Ledger, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["status", "--url", ledger.url, "--kubeconfig", str(tmp_path / "missing")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "cannot configure a Kubernetes client" in err
