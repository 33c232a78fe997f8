"""Pods this project did not make, counted by the controller's pod watch, on the emulator (SQLite and PostgreSQL)."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from airflow_gpupool.controller.external_pods import ExternalPodCounter
from airflow_gpupool.controller.pod_watch import PodWatch
from airflow_gpupool.exceptions import WatchExpiredError
from airflow_gpupool.inventory.sync import sync_inventory
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node

COUNTED_WITHIN = 2.0  # the p99 from a pod's creation to the ledger counting it


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    nodes = [gpu_node("gpu-a", gpus=4), gpu_node("gpu-b", gpus=4)]
    with KubernetesEmulatorServer(nodes=nodes, default_duration_seconds=600) as server:
        yield server


@pytest.fixture
def core(emulator: KubernetesEmulatorServer) -> Any:
    emulator.reset()
    return client.CoreV1Api(config.new_client_from_config(emulator.kubeconfig_path))


@pytest.fixture
def counted(ledger: Ledger, core: Any) -> Iterator[ExternalPodCounter]:
    sync_inventory(ledger, core)
    counter = ExternalPodCounter(ledger, core)
    counter.start()
    wait_for(lambda: counter.watch.stats.lists >= 1, "the first list")
    yield counter
    counter.stop()


def wait_for(check: Callable[[], object], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def foreign_pod(name: str, gpus: int | str, node: str | None = None, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {"name": "main", "image": "jupyter:1", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
        ],
    }
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **extra}, "spec": spec}


def external_gpus(ledger: Ledger) -> dict[str, list[tuple[str, int]]]:
    out: dict[str, list[tuple[str, int]]] = {}
    for r in ledger.external_holds():
        assert r.grant is not None
        out.setdefault(r.holder, []).extend((r.grant.node, i) for i in r.grant.gpu_indices)
    return out


def test_a_pod_applied_with_kubectl_is_counted_before_the_next_grant_and_given_back_once_gone(
    ledger: Ledger, core: Any, counted: ExternalPodCounter, emulator: KubernetesEmulatorServer, tmp_path: Path
) -> None:
    manifest = tmp_path / "notebook.yaml"
    manifest.write_text(yaml.safe_dump(foreign_pod("notebook", 4, node="gpu-a")))
    created = time.monotonic()
    # --validate=false: the emulator serves no OpenAPI document for kubectl's client-side validation.
    subprocess.run(
        [
            "kubectl",
            "--kubeconfig",
            emulator.kubeconfig_path,
            "apply",
            "--validate=false",
            "-f",
            str(manifest),
        ],
        check=True,
        capture_output=True,
    )
    wait_for(lambda: external_gpus(ledger), "the notebook counted")
    assert counted.written_at["default/notebook"] - created < COUNTED_WITHIN
    assert external_gpus(ledger) == {"external:default/notebook": [("gpu-a", i) for i in range(4)]}

    grant = ledger.reserve(GpuRequest(gpus=4), "train").grant
    assert grant is not None and grant.node == "gpu-b"
    waiting = ledger.reserve(GpuRequest(gpus=4), "evaluate", timeout=600)
    assert waiting.state is ReservationState.WAITING

    subprocess.run(
        ["kubectl", "--kubeconfig", emulator.kubeconfig_path, "delete", "pod", "notebook", "--wait=false"],
        check=True,
        capture_output=True,
    )
    # Terminating, the pod still holds its GPUs; gone, they go to the waiting request.
    emulator.wait_for_pod_gone("notebook", timeout=60)
    gone = time.monotonic()
    wait_for(lambda: ledger.get(waiting.id).state is ReservationState.GRANTED, "the waiting request granted")
    assert counted.written_at["default/notebook"] - gone < COUNTED_WITHIN
    assert ledger.external_holds() == []
    assert ledger.check_invariants() == []


def test_a_pod_placed_by_the_scheduler_is_counted_on_the_node_it_lands_on(
    ledger: Ledger, core: Any, counted: ExternalPodCounter, emulator: KubernetesEmulatorServer
) -> None:
    core.create_namespaced_pod("default", foreign_pod("infer", 2))
    running = emulator.wait_for_pod("infer", phases={"Running"})
    node = running["spec"]["nodeName"]
    wait_for(lambda: external_gpus(ledger), "the inference pod counted")
    assert external_gpus(ledger) == {"external:default/infer": [(node, 0), (node, 1)]}
    emulator.finish_pod("infer")
    wait_for(lambda: not ledger.external_holds(), "the finished pod released")


def test_a_pod_of_a_grant_is_not_counted_twice(
    ledger: Ledger, core: Any, counted: ExternalPodCounter, emulator: KubernetesEmulatorServer
) -> None:
    held = ledger.reserve(GpuRequest(gpus=1), "train")
    assert held.grant is not None
    ledger.bind(held.id, namespace="default", name="ours", uid=None)
    core.create_namespaced_pod("default", foreign_pod("ours", 1, node=held.grant.node))
    emulator.wait_for_pod("ours", phases={"Running"})
    core.create_namespaced_pod("default", foreign_pod("theirs", 1, node=held.grant.node))
    wait_for(lambda: external_gpus(ledger), "the other pod counted")
    assert list(external_gpus(ledger)) == ["external:default/theirs"]
    assert ledger.check_invariants() == []


def test_malformed_gpu_counts_are_held_conservatively_and_logged_once(
    ledger: Ledger,
    core: Any,
    counted: ExternalPodCounter,
    emulator: KubernetesEmulatorServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    odd = foreign_pod("odd", "1", node="gpu-b")
    odd["metadata"]["annotations"] = {"gpu-fraction": "lots"}
    odd["spec"]["containers"][0]["resources"] = {}
    core.create_namespaced_pod("default", odd)
    wait_for(lambda: external_gpus(ledger), "the unreadable pod counted")
    assert external_gpus(ledger) == {"external:default/odd": [("gpu-b", i) for i in range(4)]}
    assert sum("default/odd" in r.message and "'lots'" in r.message for r in caplog.records) == 1
    assert counted.running


def test_a_watch_resumed_from_a_compacted_version_is_told_410_gone(
    core: Any, emulator: KubernetesEmulatorServer
) -> None:
    lists: list[int] = []
    watch = PodWatch(core, lambda pods: lists.append(len(pods)), lambda kind, pod: None, watch_seconds=1)
    version = watch.list_now()
    emulator.cordon("gpu-b")  # history moves on, then is compacted past the version listed
    emulator.compact()
    with pytest.raises(WatchExpiredError, match="410"):
        watch.watch_from(version)
    assert watch.stats.gone == 1 and lists == [0]


def test_bookmarks_move_the_watch_on_without_events(core: Any, emulator: KubernetesEmulatorServer) -> None:
    watch = PodWatch(core, lambda pods: None, lambda kind, pod: None, watch_seconds=1)
    version = watch.list_now()
    emulator.cordon("gpu-b")  # a node changes: no pod event, but the version moves on
    deadline = time.monotonic() + 3
    for event in watch._stream(version, 1):
        if event["type"] == "BOOKMARK" or time.monotonic() > deadline:
            break
    assert event["type"] == "BOOKMARK"
    assert int(event["object"]["metadata"]["resourceVersion"]) > int(version)


def test_a_watch_goes_on_past_its_bookmarks_to_its_timeout(
    core: Any, emulator: KubernetesEmulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bookmark used to cancel the stream's pending read, which closed it: the next read ended
    # the response with a 500 in the middle of the stream, and every watch relisted after 5 s.
    monkeypatch.setattr("airflow_gpupool.testing.api.watches.BOOKMARK_SECONDS", 0.2)
    watch = PodWatch(core, lambda pods: None, lambda kind, pod: None)
    version = watch.list_now()
    late = threading.Timer(0.7, core.create_namespaced_pod, ("default", foreign_pod("late", 1, node="gpu-a")))
    late.start()
    seen = [event["type"] for event in watch._stream(version, 2)]  # to the server's timeout, no error
    late.join()
    assert seen.count("BOOKMARK") >= 3
    assert "ADDED" in seen and seen.index("ADDED") > seen.index("BOOKMARK")


class _StreamHeldOpen:
    """The real client, whose watch requests wait at a gate before they are sent."""

    def __init__(self, core: Any) -> None:
        self._core = core
        self.opening = threading.Event()
        self.gate = threading.Event()

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        if kwargs.get("watch"):
            self.opening.set()
            self.gate.wait(10)
        return self._core.list_pod_for_all_namespaces(**kwargs)


def test_a_watch_stopped_while_its_stream_opens_ends_though_it_is_started_again(core: Any) -> None:
    # The stop found no stream to close; the restart then cleared the one stop event both runs
    # shared, and the first run watched on for good: after its emulator was gone, it logged
    # urllib3's retries into whatever test ran next.
    api = _StreamHeldOpen(core)
    watch = PodWatch(api, lambda pods: None, lambda kind, pod: None, watch_seconds=30)
    watch.start()
    first = watch._thread
    assert first is not None and api.opening.wait(10)
    watch.stop(timeout=0.1)  # the first run waits at the gate: no response yet
    api.opening.clear()
    watch.start()
    second = watch._thread
    api.gate.set()
    try:
        wait_for(lambda: not first.is_alive(), "the first run to end")
        assert api.opening.wait(10) and second is not None and second.is_alive()  # the second watches
    finally:
        watch.stop()
    assert second is not None and not second.is_alive()


def test_a_relist_counts_what_changed_while_nobody_watched(
    ledger: Ledger, core: Any, counted: ExternalPodCounter, emulator: KubernetesEmulatorServer
) -> None:
    core.create_namespaced_pod("default", foreign_pod("before", 1, node="gpu-a"))
    wait_for(lambda: external_gpus(ledger), "the first pod counted")
    counted.stop()
    core.delete_namespaced_pod("before", "default", grace_period_seconds=0)
    core.create_namespaced_pod("default", foreign_pod("during", 2, node="gpu-b"))
    emulator.compact()

    counted.count_once()

    assert external_gpus(ledger) == {"external:default/during": [("gpu-b", 0), ("gpu-b", 1)]}


def test_the_kubelet_refuses_a_pod_bound_past_its_nodes_gpus(
    core: Any, emulator: KubernetesEmulatorServer
) -> None:
    core.create_namespaced_pod("default", foreign_pod("first", 3, node="gpu-a"))
    emulator.wait_for_pod("first", phases={"Running"})
    core.create_namespaced_pod("default", foreign_pod("second", 2, node="gpu-a"))
    refused = emulator.wait_for_pod("second", phases={"Failed"})
    assert refused["status"]["reason"] == "OutOfnvidia.com/gpu"
    assert "requested: 2, used: 3, capacity: 4" in refused["status"]["message"]
