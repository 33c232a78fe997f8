"""The real ``kubectl`` binary against the emulator: discovery, get, describe, logs and ``-o yaml``.

CI installs ``kubectl`` (``.ci/run``); without it these tests skip here and fail under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from airflow_gpupool.testing.api.discovery import EMULATED_MINOR
from tests.skips import skip_or_fail

LOG_LINES = ["epoch 1 loss 0.9", "epoch 2 loss 0.4"]


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    nodes = [
        gpu_node("gpu-a100-0", gpus=8, pool="a100"),
        gpu_node("gpu-mig-0", gpus=7, mig={"1g.10gb": 7}, pool="a100", unschedulable=True),
    ]
    with KubernetesEmulatorServer(nodes=nodes, default_duration_seconds=0.2) as server:
        server.configure_pod(name="train-*", log_lines=LOG_LINES)
        core = _core(server)
        core.create_namespace({"metadata": {"name": "ml"}})
        for name, namespace, gpus in (
            ("train-a", "default", 1),
            ("train-b", "ml", 2),
            ("huge", "default", 64),
        ):
            core.create_namespaced_pod(namespace, _pod(name, gpus))
        server.wait_for_pod("train-a")
        server.wait_for_pod("train-b", namespace="ml")
        yield server


def _core(server: KubernetesEmulatorServer) -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(server.kubeconfig_path))


def _pod(name: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "base", "image": "trainer:1", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }


@pytest.fixture(scope="module")
def kubectl(emulator: KubernetesEmulatorServer, tmp_path_factory: pytest.TempPathFactory) -> Any:
    binary = shutil.which("kubectl")
    if binary is None:
        skip_or_fail(
            "kubectl is not installed (Debian: apt-get install kubernetes-client)", what="the kubectl tests"
        )
    home = tmp_path_factory.mktemp("kubectl-home")

    def run(*args: str) -> str:
        env = {**os.environ, "KUBECONFIG": emulator.kubeconfig_path, "HOME": str(home)}
        done = subprocess.run(
            [str(binary), *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, f"kubectl {' '.join(args)} failed: {done.stderr}"
        return done.stdout

    return run


def _table(text: str) -> list[dict[str, str]]:
    """Parse kubectl's column output into dicts keyed by header (columns split on 2+ spaces)."""
    import re

    lines = [line for line in text.splitlines() if line.strip()]
    header = re.split(r"\s{2,}", lines[0].strip())
    return [dict(zip(header, re.split(r"\s{2,}", line.strip()), strict=False)) for line in lines[1:]]


def test_version_is_honest(kubectl: Any) -> None:
    server = json.loads(kubectl("version", "-o", "json"))["serverVersion"]
    assert server["minor"] == EMULATED_MINOR
    assert "gpupool-emulator" in server["gitVersion"]
    assert "k3s" not in json.dumps(server)
    assert server["compiler"] == "python"


def test_get_nodes(kubectl: Any) -> None:
    rows = _table(kubectl("get", "nodes"))
    assert [(r["NAME"], r["STATUS"]) for r in rows] == [
        ("gpu-a100-0", "Ready"),
        ("gpu-mig-0", "Ready,SchedulingDisabled"),
    ]
    assert {r["VERSION"] for r in rows} == {f"v1.{EMULATED_MINOR}.0"}


def test_get_pods_all_namespaces_wide(kubectl: Any) -> None:
    rows = {r["NAME"]: r for r in _table(kubectl("get", "pods", "-A", "-o", "wide"))}
    assert set(rows) == {"train-a", "train-b", "huge"}
    assert rows["train-b"]["NAMESPACE"] == "ml"
    assert rows["train-a"]["STATUS"] == "Completed"
    assert rows["train-a"]["NODE"] == "gpu-a100-0"
    assert rows["train-a"]["IP"].startswith("10.")
    assert (rows["huge"]["STATUS"], rows["huge"]["NODE"]) == ("Pending", "<none>")


def test_describe_node_lists_its_pods_and_capacity(kubectl: Any) -> None:
    text = kubectl("describe", "node", "gpu-a100-0")
    assert "Name:               gpu-a100-0" in text
    assert "nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB" in text
    assert "nvidia.com/gpu:  8" in text
    mig = kubectl("describe", "node", "gpu-mig-0")
    assert "nvidia.com/mig-1g.10gb:  7" in mig
    assert "Unschedulable:      true" in mig


def test_describe_pod_shows_scheduler_events(kubectl: Any) -> None:
    ran = kubectl("describe", "pod", "train-a")
    assert "Node:         gpu-a100-0/" in ran
    assert "Successfully assigned default/train-a to gpu-a100-0" in ran
    stuck = kubectl("describe", "pod", "huge")
    assert "FailedScheduling" in stuck
    assert "Insufficient nvidia.com/gpu" in stuck


def test_logs(kubectl: Any) -> None:
    assert kubectl("logs", "train-a").splitlines()[-len(LOG_LINES) :] == LOG_LINES
    assert kubectl("logs", "-n", "ml", "train-b", "--tail=1").strip() == LOG_LINES[-1]


def test_output_yaml_and_events(kubectl: Any) -> None:
    pod = yaml.safe_load(kubectl("get", "pod", "train-a", "-o", "yaml"))
    assert (pod["kind"], pod["status"]["phase"]) == ("Pod", "Succeeded")
    node = yaml.safe_load(kubectl("get", "node", "gpu-a100-0", "-o", "yaml"))
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    events = _table(kubectl("get", "events"))
    assert any(e["OBJECT"] == "pod/train-a" and e["REASON"] == "Scheduled" for e in events)
    assert [r["NAME"] for r in _table(kubectl("get", "namespaces"))] == ["default", "ml"]


def test_missing_objects_read_like_the_api_server(kubectl: Any) -> None:
    with pytest.raises(AssertionError, match='pods "nope" not found'):
        kubectl("get", "pod", "nope")
