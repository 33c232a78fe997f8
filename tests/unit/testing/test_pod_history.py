"""The emulator's pod history: what each pod was pinned to, when it ran, and GPU overlaps."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from airflow_gpupool.testing.pods.pod_history import GpuUse, PodHistory, PodRecord, gpu_overlaps, pinned_gpus


def pod(env: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    container = {"name": "base", "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}
    return {
        "metadata": {"name": "p", "uid": "u", "annotations": annotations or {}},
        "spec": {"containers": [container]},
    }


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(pod({"GPUPOOL_GPU_INDICES": "0,3"}), GpuUse(("0", "3")), id="whole GPUs from env"),
        pytest.param(
            pod({"GPUPOOL_GPU_INDICES": "1", "GPUPOOL_GPU_MILLI": "250"}), GpuUse(("1",), 250), id="fraction"
        ),
        pytest.param(
            pod(
                {"GPUPOOL_GPU_INDICES": "0", "GPUPOOL_MIG_SLICE": "n-g0-m2", "GPUPOOL_MIG_PROFILE": "1g.10gb"}
            ),
            GpuUse(("mig:n-g0-m2",)),
            id="MIG slice",
        ),
        pytest.param(pod(annotations={"gpupool.io/gpus": "2,1"}), GpuUse(("2", "1")), id="annotation"),
        pytest.param(pod(), GpuUse(()), id="not pinned"),
    ],
)
def test_pinned_gpus_read_what_pin_pod_writes(spec: dict[str, Any], expected: GpuUse) -> None:
    assert pinned_gpus(spec) == expected


def record(
    name: str, start: float | None, end: float | None, devices: tuple[str, ...] = ("0",), **kw: Any
) -> PodRecord:
    return PodRecord(
        uid=name,
        namespace="default",
        name=name,
        reservation_id=f"gp-{name}",
        gpus=GpuUse(devices, kw.pop("milli", 1000)),
        created_at=0.0,
        node=kw.pop("node", "n1"),
        started_at=start,
        ended_at=end,
    )


@pytest.mark.parametrize(
    ("records", "overlapping"),
    [
        pytest.param([record("a", 0, 5), record("b", 5, 9)], [], id="back to back"),
        pytest.param([record("a", 0, 5), record("b", 4, 9)], ["b"], id="overlap"),
        pytest.param([record("a", 0, None), record("b", 50, 60)], ["b"], id="still running"),
        pytest.param([record("a", 0, 5), record("b", 1, 4, ("1",))], [], id="other GPU"),
        pytest.param([record("a", 0, 5), record("b", 1, 4, node="n2")], [], id="other node"),
        pytest.param([record("a", 0, 5), record("b", None, None)], [], id="never ran"),
        pytest.param(
            [record("a", 0, 5, milli=500), record("b", 1, 4, milli=500)], [], id="fractions that fit"
        ),
        pytest.param(
            [record("a", 0, 5, milli=600), record("b", 1, 4, milli=500)], ["b"], id="fractions past 1000"
        ),
        pytest.param(
            [record("a", 0, 9, ("0", "1")), record("b", 2, 3, ("1",)), record("c", 4, 5)],
            ["b", "c"],
            id="two GPUs",
        ),
    ],
)
def test_gpu_overlaps(records: list[PodRecord], overlapping: list[str]) -> None:
    problems = gpu_overlaps(records, now=100.0)
    assert sorted(p.split("pod default/")[1].split(" ")[0] for p in problems) == overlapping
    assert all("still ran on it" in p for p in problems)


def test_the_first_end_wins_and_unknown_pods_are_ignored() -> None:
    times = iter([1.0, 2.0, 3.0, 4.0])
    history = PodHistory(clock=lambda: next(times))
    history.created(pod({"GPUPOOL_GPU_INDICES": "0"}))
    history.started("u", "n1")
    history.ended("u", "Succeeded")
    history.ended("u", "Deleted")
    history.started("other", "n1")
    [only] = history.records()
    assert (only.node, only.started_at, only.ended_at, only.end) == ("n1", 2.0, 3.0, "Succeeded")


def test_the_emulator_records_running_and_deleted_pods() -> None:
    from kubernetes import client, config

    with KubernetesEmulatorServer([gpu_node("gpu-a", gpus=2)], default_duration_seconds=30) as k8s:
        config.load_kube_config(config_file=k8s.kubeconfig_path)
        core = client.CoreV1Api()
        body = {
            "metadata": {"name": "train", "labels": {"gpupool.io/reservation-id": "gp-1"}},
            "spec": {
                "containers": [
                    {
                        "name": "base",
                        "image": "train:1",
                        "env": [{"name": "GPUPOOL_GPU_INDICES", "value": "1"}],
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ]
            },
        }
        core.create_namespaced_pod("default", body)
        k8s.wait_for_pod("train", phases={"Running"})
        core.delete_namespaced_pod("train", "default")  # answers while the pod terminates
        k8s.wait_for_pod_gone("train")
        [r] = k8s.pod_records()
    # It ran until its containers exited on SIGTERM (143: Failed), not until the DELETE came.
    assert (r.name, r.node, r.gpus, r.reservation_id, r.end) == (
        "train",
        "gpu-a",
        GpuUse(("1",)),
        "gp-1",
        "Failed",
    )
    assert r.started_at is not None and r.ended_at is not None and r.created_at <= r.started_at <= r.ended_at
    assert r.labels == {"gpupool.io/reservation-id": "gp-1"}
