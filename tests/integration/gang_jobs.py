"""The gang Job tests' cluster, ledger and checks: two A100 nodes of 2 GPUs, a gang of 3 spans both."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.integration.conftest import A100, cluster_nodes
from tests.ledger_fixtures import node

INDEX = "batch.kubernetes.io/job-completion-index"
NODES = ("gpu-a", "gpu-b")


@pytest.fixture
def gang_k8s(emulator: KubernetesEmulatorServer) -> Iterator[KubernetesEmulatorServer]:
    """The emulator with two A100 nodes of 2 GPUs each: a gang of 3 spans both."""
    emulator.reset(nodes=[gpu_node(n, gpus=2, product=A100, memory_mib=81920, pool="a100") for n in NODES])
    yield emulator
    emulator.reset(nodes=cluster_nodes())


def open_gang_ledger(url: str, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    ledger = Ledger.create(url)
    ledger.upsert_nodes([node(n, gpus=2, model=A100, cpu=96000, mem=1048576, pool="a100") for n in NODES])
    extra = {"ledger_url": url, "poll_interval_seconds": 0.2}
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({"conn_type": "gpupool", "extra": extra}))
    return ledger


@pytest.fixture
def gang_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    ledger = open_gang_ledger(f"sqlite:///{tmp_path}/ledger.db", monkeypatch)
    yield ledger
    ledger.close()


def the_job(k8s: KubernetesEmulatorServer) -> dict[str, Any]:
    (job,) = k8s.jobs("default")
    return job


def leader_of(job: dict[str, Any]) -> str:
    return str(job["spec"]["template"]["metadata"]["annotations"]["gpupool.io/gang-reservation"])


def job_pod_versions(k8s: KubernetesEmulatorServer, job: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """Every stored version of each pod of the Job (the pods are deleted when the task ends), by index."""
    names = {
        p["metadata"]["name"]
        for r in k8s.requests
        if r.method == "PATCH" and r.path.startswith("/api/v1/namespaces/default/pods/")
        for p in [{"metadata": {"name": r.path.rsplit("/", 1)[1]}}]
    }
    versions: dict[int, list[dict[str, Any]]] = {}
    for name in names:
        history = k8s.pod_history(name)
        if (
            history
            and history[0]["metadata"]["labels"].get("batch.kubernetes.io/job-name")
            == job["metadata"]["name"]
        ):
            versions[int(history[0]["metadata"]["annotations"][INDEX])] = history
    return versions


def assert_pinned_to_members(k8s: KubernetesEmulatorServer, ledger: Ledger, job: dict[str, Any]) -> None:
    gang = ledger.gang(leader_of(job))
    versions = job_pod_versions(k8s, job)
    assert sorted(versions) == [0, 1, 2]
    for member in gang.members:
        assert member.grant is not None
        history = versions[int(member.gang_index or 0)]
        assert history[0]["spec"]["schedulingGates"] == [{"name": "gpupool.io/reservation"}]  # created gated
        scheduled = [v for v in history if v["spec"].get("nodeName")]
        assert scheduled, f"member {member.id}'s pod never ran"
        for version in scheduled:  # never on a node while gated, always on its member's node
            assert not version["spec"].get("schedulingGates")
            assert version["spec"]["nodeName"] == member.grant.node
            assert version["metadata"]["annotations"]["gpupool.io/reservation-id"] == member.id
            assert version["metadata"]["annotations"]["gpupool.io/gpus"] == ",".join(
                map(str, member.grant.gpu_indices)
            )
        assert scheduled[-1]["status"]["phase"] in ("Running", "Succeeded", "Failed")
    assert sorted(m.grant.node for m in gang.members if m.grant) == ["gpu-a", "gpu-a", "gpu-b"]


def assert_gang_released(ledger: Ledger, job: dict[str, Any]) -> None:
    gang = ledger.gang(leader_of(job))
    assert [m.state for m in gang.members] == [ReservationState.RELEASED] * 3
    assert ledger.snapshot().grants == ()
    assert ledger.check_invariants() == []
