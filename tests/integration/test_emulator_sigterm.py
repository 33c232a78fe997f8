"""The emulator's emergency checkpoint on SIGTERM (issue 16 item 3), over HTTP with the kubernetes client.

A running training pod that opts in (``gpupool.emulator/checkpoint-on-sigterm`` or
``GPUPOOL_EMULATOR_CHECKPOINT_ON_SIGTERM=1``) and is deleted with a grace period writes its next
step as an emergency checkpoint, ends ``Failed`` with exit code 143, then is gone. A delete with
no grace, or of a pod that did not opt in, writes nothing more.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node

ANNOTATION = "gpupool.emulator/"
STEPS = 200  # far more than a test lets run: every run is cut short by its delete


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    with KubernetesEmulatorServer(nodes=[gpu_node("gpu-a100-0", gpus=8)]) as server:
        yield server


@pytest.fixture
def core(emulator: KubernetesEmulatorServer) -> Any:
    from kubernetes import client, config

    emulator.reset()
    return client.CoreV1Api(config.new_client_from_config(emulator.kubeconfig_path))


def training_pod(
    name: str, checkpoints: Path, *, annotation: str | None = None, env: str | None = None
) -> dict[str, Any]:
    """A training pod writing a step every 0.1 s into ``checkpoints``, opted in as asked."""
    annotations = {
        ANNOTATION + "checkpoint-dir": checkpoints.as_uri(),
        ANNOTATION + "checkpoint-steps": str(STEPS),
        ANNOTATION + "duration-seconds": str(STEPS * 0.1),
    }
    if annotation is not None:
        annotations[ANNOTATION + "checkpoint-on-sigterm"] = annotation
    container: dict[str, Any] = {"name": "train", "image": "registry.example/train:1"}
    if env is not None:
        container["env"] = [{"name": "GPUPOOL_EMULATOR_CHECKPOINT_ON_SIGTERM", "value": env}]
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }


def run_until_step(k8s: KubernetesEmulatorServer, core: Any, pod: dict[str, Any], root: Path) -> None:
    """Create the pod and return once it runs and has written its first periodic checkpoint."""
    core.create_namespaced_pod("default", pod)
    k8s.wait_for_pod(pod["metadata"]["name"], phases={"Running"})
    deadline = time.monotonic() + 10
    while not (root / "step-000001" / "manifest.json").exists():  # a file: no event to wait on
        assert time.monotonic() < deadline, "the pod wrote no checkpoint"
        time.sleep(0.02)


def manifests(root: Path) -> dict[int, dict[str, Any]]:
    return {
        int(d.name.split("-")[1]): json.loads((d / "manifest.json").read_text())
        for d in root.iterdir()
        if d.name.startswith("step-") and (d / "manifest.json").exists()
    }


def watch_until_deleted(core: Any, name: str, root: Path) -> tuple[list[tuple[str, Any]], threading.Thread]:
    """Watch a pod in a thread: each event with whether an emergency checkpoint existed when it came."""
    from kubernetes import watch

    seen: list[tuple[str, Any]] = []
    ready = threading.Event()

    def follow() -> None:
        w = watch.Watch()
        stream = w.stream(
            core.list_namespaced_pod, "default", field_selector=f"metadata.name={name}", timeout_seconds=20
        )
        for event in stream:
            ready.set()  # the watch is open (its first event is the running pod): the delete may come
            pod = event["object"]
            statuses = pod.status.container_statuses or []
            terminated = statuses[0].state.terminated if statuses else None
            emergency = any(m.get("emergency") for m in manifests(root).values())
            seen.append((event["type"], (pod.status.phase, terminated and terminated.exit_code, emergency)))
            if event["type"] == "DELETED":
                w.stop()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    assert ready.wait(timeout=20), "the watch saw nothing of the pod"
    return seen, thread


def test_an_opted_in_pod_writes_its_emergency_checkpoint_before_it_is_gone(
    emulator: KubernetesEmulatorServer, core: Any, tmp_path: Path
) -> None:
    run_until_step(emulator, core, training_pod("sigterm-ann", tmp_path, annotation="true"), tmp_path)
    seen, watcher = watch_until_deleted(core, "sigterm-ann", tmp_path)
    core.delete_namespaced_pod("sigterm-ann", "default", grace_period_seconds=5)
    watcher.join(timeout=20)

    written = manifests(tmp_path)
    last = max(written)
    assert written[last].get("emergency") is True and last < STEPS
    assert sorted(written) == list(range(1, last + 1))  # the next step, right after the periodic ones
    assert not any(written[s].get("emergency") for s in range(1, last))
    assert not (tmp_path / "COMPLETE").exists()
    # Watched: terminating, then Failed with 143 once the checkpoint is there, then gone.
    assert seen[-1][0] == "DELETED"
    failed = [i for i, (_, (phase, code, _)) in enumerate(seen) if phase == "Failed" and code == 143]
    assert failed and seen[failed[0]][1][2] is True
    history = emulator.pod_history("sigterm-ann")
    terminating = [v for v in history if v["metadata"].get("deletionTimestamp")]
    assert terminating and terminating[0]["metadata"]["deletionGracePeriodSeconds"] == 5
    final = history[-1]
    assert final["status"]["phase"] == "Failed"
    terminated = final["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 143 and terminated["reason"] == "Error"


def test_the_env_variable_opts_in_and_a_delete_options_body_gives_the_grace(
    emulator: KubernetesEmulatorServer, core: Any, tmp_path: Path
) -> None:
    from kubernetes import client

    run_until_step(emulator, core, training_pod("sigterm-env", tmp_path, env="1"), tmp_path)
    core.delete_namespaced_pod("sigterm-env", "default", body=client.V1DeleteOptions(grace_period_seconds=3))
    emulator.wait_for_pod_gone("sigterm-env")  # the DELETE answered while the pod terminated
    written = manifests(tmp_path)
    assert written[max(written)].get("emergency") is True
    assert emulator.pod_history("sigterm-env")[-1]["status"]["phase"] == "Failed"


@pytest.mark.parametrize(
    ("annotation", "grace"),
    [
        pytest.param("true", 0, id="opted-in-grace-0"),
        pytest.param(None, 5, id="not-opted-in"),
        pytest.param("false", 5, id="opted-out"),
    ],
)
def test_no_emergency_checkpoint_without_a_grace_or_the_opt_in(
    emulator: KubernetesEmulatorServer, core: Any, tmp_path: Path, annotation: str | None, grace: int
) -> None:
    run_until_step(emulator, core, training_pod("sigterm-none", tmp_path, annotation=annotation), tmp_path)
    core.delete_namespaced_pod("sigterm-none", "default", grace_period_seconds=grace)
    emulator.wait_for_pod_gone("sigterm-none")
    written = manifests(tmp_path)
    assert written and not any(m.get("emergency") for m in written.values())
    history = emulator.pod_history("sigterm-none")
    if grace == 0:  # removed at once: never terminating, never Failed
        assert not any(v["metadata"].get("deletionTimestamp") for v in history)
        assert all(v["status"]["phase"] != "Failed" for v in history)
    else:  # terminating, then its containers exit on SIGTERM (143) without a checkpoint
        assert any(v["metadata"].get("deletionTimestamp") for v in history)
        terminated = history[-1]["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == 143
