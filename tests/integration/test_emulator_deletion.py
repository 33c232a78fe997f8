"""Pod deletion on the emulator as Kubernetes does it (issue 36 item 3), over HTTP with the kubernetes client.

A graceful ``DELETE`` answers at once with ``deletionTimestamp`` and ``deletionGracePeriodSeconds``
set; the pod stays listed (``Terminating``) and keeps its GPUs in the scheduler's eyes until its
containers exit on SIGTERM or its grace runs out (then killed); watches see ``MODIFIED`` then
``DELETED``. ``gracePeriodSeconds=0``, an unscheduled pod and a finished one are removed at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node

ANNOTATION = "gpupool.emulator/"


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    with KubernetesEmulatorServer(nodes=[gpu_node("gpu-a", gpus=2)], default_duration_seconds=60) as server:
        yield server


@pytest.fixture
def core(emulator: KubernetesEmulatorServer) -> Any:
    from kubernetes import client, config

    emulator.reset()
    return client.CoreV1Api(config.new_client_from_config(emulator.kubeconfig_path))


def gpu_pod(name: str, gpus: int = 2, **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "annotations": {ANNOTATION + k.replace("_", "-"): v for k, v in annotations.items()},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "base", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }


def watch_pod(core: Any, name: str) -> tuple[list[tuple[str, bool]], threading.Thread]:
    """Watch a pod in a thread: each event's type and whether the pod was terminating."""
    from kubernetes import watch

    seen: list[tuple[str, bool]] = []
    ready = threading.Event()

    def follow() -> None:
        w = watch.Watch()
        for event in w.stream(
            core.list_namespaced_pod, "default", field_selector=f"metadata.name={name}", timeout_seconds=30
        ):
            ready.set()
            seen.append((event["type"], event["object"].metadata.deletion_timestamp is not None))
            if event["type"] == "DELETED":
                w.stop()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    assert ready.wait(timeout=20)
    return seen, thread


def test_a_graceful_delete_answers_at_once_and_the_pod_keeps_its_gpus_until_its_containers_exit(
    emulator: KubernetesEmulatorServer, core: Any
) -> None:
    core.create_namespaced_pod("default", gpu_pod("old", sigterm_exit_seconds="1.5"))
    emulator.wait_for_pod("old", phases={"Running"})
    seen, watcher = watch_pod(core, "old")

    started, deleted_at = time.monotonic(), time.time()
    answer = core.delete_namespaced_pod("old", "default", grace_period_seconds=20)
    assert time.monotonic() - started < 1.0  # not blocked until the pod ended
    assert answer.metadata.deletion_timestamp is not None
    assert answer.metadata.deletion_grace_period_seconds == 20
    # Still listed, Terminating, and its two GPUs still taken: a new pod wanting them waits.
    (listed,) = core.list_namespaced_pod("default").items
    assert listed.metadata.name == "old" and listed.metadata.deletion_timestamp is not None
    core.create_namespaced_pod("default", gpu_pod("new"))
    emulator.wait_for_pod_gone("old", timeout=10)
    watcher.join(timeout=10)
    new = emulator.wait_for_pod("new", phases={"Running"})

    types = [t for t, _ in seen]
    assert types[0] == "ADDED" and types[-1] == "DELETED" and "MODIFIED" in types[1:-1]
    assert seen[1] == ("MODIFIED", True)  # the first change after the delete: terminating
    old, new_record = emulator.pod_records()
    assert old.end == "Failed"  # exited on SIGTERM (143), after its 1.5 s
    assert old.ended_at is not None and old.ended_at - deleted_at >= 1.4
    assert new_record.started_at is not None and new_record.started_at >= old.ended_at
    assert new["spec"]["nodeName"] == "gpu-a"
    events = [e for e in emulator.events() if e["reason"] == "FailedScheduling"]
    assert any("Insufficient nvidia.com/gpu" in e["message"] for e in events)


def test_a_pod_outliving_its_grace_is_killed_at_its_end(
    emulator: KubernetesEmulatorServer, core: Any
) -> None:
    core.create_namespaced_pod("default", gpu_pod("stubborn", sigterm_exit_seconds="60"))
    emulator.wait_for_pod("stubborn", phases={"Running"})
    started = time.monotonic()
    core.delete_namespaced_pod("stubborn", "default", grace_period_seconds=1)
    assert core.read_namespaced_pod("stubborn", "default").metadata.deletion_timestamp is not None
    emulator.wait_for_pod_gone("stubborn", timeout=10)
    assert 0.9 <= time.monotonic() - started < 5
    (record,) = emulator.pod_records()
    assert record.end == "Killed"


def test_a_shorter_second_delete_wins_and_grace_0_removes_at_once(
    emulator: KubernetesEmulatorServer, core: Any
) -> None:
    from kubernetes.client.exceptions import ApiException

    core.create_namespaced_pod("default", gpu_pod("slow", sigterm_exit_seconds="60"))
    emulator.wait_for_pod("slow", phases={"Running"})
    core.delete_namespaced_pod("slow", "default", grace_period_seconds=30)
    longer = core.delete_namespaced_pod("slow", "default", grace_period_seconds=60)
    assert longer.metadata.deletion_grace_period_seconds == 30  # a longer grace changes nothing
    core.delete_namespaced_pod("slow", "default", grace_period_seconds=0)
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_pod("slow", "default")
    assert gone.value.status == 404


@pytest.mark.parametrize("how", ["unscheduled", "finished", "grace-0"])
def test_these_are_removed_at_once_with_no_terminating_state(
    emulator: KubernetesEmulatorServer, core: Any, how: str
) -> None:
    from kubernetes.client.exceptions import ApiException

    annotations = {"never_schedule": "true"} if how == "unscheduled" else {}
    if how == "finished":
        annotations["duration_seconds"] = "0.1"
    core.create_namespaced_pod("default", gpu_pod("quick", **annotations))
    phase = {"unscheduled": "Pending", "finished": "Succeeded", "grace-0": "Running"}[how]
    emulator.wait_for_pod("quick", phases={phase})
    if how == "unscheduled":  # the scheduler's verdict first, so the watch starts after it
        deadline = time.monotonic() + 10
        while (
            not (emulator.pod("quick") or {}).get("status", {}).get("conditions")
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)
    seen, watcher = watch_pod(core, "quick")
    core.delete_namespaced_pod("quick", "default", grace_period_seconds=0 if how == "grace-0" else 30)
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_pod("quick", "default")
    assert gone.value.status == 404
    watcher.join(timeout=10)
    assert [t for t, _ in seen] == ["ADDED", "DELETED"]


def test_a_watch_from_a_read_resource_version_sees_a_deletion_in_between(
    emulator: KubernetesEmulatorServer, core: Any
) -> None:
    from kubernetes import watch

    core.create_namespaced_pod("default", gpu_pod("brief"))
    emulator.wait_for_pod("brief", phases={"Running"})
    version = core.read_namespaced_pod("brief", "default").metadata.resource_version
    core.delete_namespaced_pod("brief", "default", grace_period_seconds=0)
    stream = watch.Watch().stream(
        core.list_namespaced_pod,
        "default",
        field_selector="metadata.name=brief",
        resource_version=version,
        timeout_seconds=2,
    )
    assert [e["type"] for e in stream] == ["DELETED"]
