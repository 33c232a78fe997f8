"""Inventory sync and reconcile against the Kubernetes emulator over HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_gpupool.controller.reconcile import reconcile, reconcile_grant
from airflow_gpupool.inventory import sync_inventory
from airflow_gpupool.labels import RESERVATION_LABEL
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, cpu_node, gpu_node
from tests.ledger_fixtures import FakeClock, node

GPU_NODES = ["gpu-a100-0", "gpu-cordoned-0", "gpu-h100-0", "gpu-mig-0", "gpu-mixed-0", "gpu-tainted-0"]


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    nodes = [
        gpu_node("gpu-a100-0", gpus=8, pool="a100"),
        gpu_node("gpu-mig-0", gpus=1, mig={"1g.10gb": 7}, pool="a100"),
        gpu_node("gpu-mixed-0", gpus=4, mig={"3g.40gb": 2}, pool="a100"),
        gpu_node(
            "gpu-h100-0",
            gpus=8,
            product="NVIDIA-H100-80GB-HBM3",
            memory_mib=81559,
            taints=["nvidia.com/gpu=present:NoSchedule"],
            labels={"cloud.google.com/gke-nodepool": "h100-pool"},
        ),
        gpu_node("gpu-cordoned-0", gpus=2, unschedulable=True),
        gpu_node("gpu-tainted-0", gpus=2, taints=["dedicated=inference:NoSchedule"]),
        cpu_node("cpu-0"),
    ]
    with KubernetesEmulatorServer(nodes=nodes, default_duration_seconds=0.1) as server:
        yield server


def pinned(node_name: str, gpus: int = 1) -> GpuRequest:
    return GpuRequest(gpus=gpus, node_labels=(("kubernetes.io/hostname", node_name),))


def make_pod(core: Any, name: str, reservation_id: str, **annotations: str) -> None:
    core.create_namespaced_pod(
        "default",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {RESERVATION_LABEL: reservation_id},
                "annotations": {f"gpupool.emulator/{k.replace('_', '-')}": v for k, v in annotations.items()},
            },
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "train:1"}]},
        },
    )


# -- sync -------------------------------------------------------------------------------------


def test_sync_reads_gpu_nodes(ledger: Ledger, k8s: KubernetesEmulatorServer, core: Any) -> None:
    result = sync_inventory(ledger, core)

    assert sorted(result.added) == GPU_NODES
    assert (result.updated, result.unchanged, result.drained, result.removed, result.errors) == (
        (),
        (),
        (),
        (),
        (),
    )
    records = {r.name: r for r in ledger.snapshot().nodes}
    assert sorted(records) == GPU_NODES  # cpu-0 has no GPU
    a100, h100 = records["gpu-a100-0"], records["gpu-h100-0"]
    assert (a100.node_pool, a100.health, len(a100.gpus), a100.cpu_milli, a100.memory_mib) == (
        "a100",
        "healthy",
        8,
        96000,
        1024 * 1024,
    )
    assert {(g["model"], g["memory_mib"]) for g in a100.gpus} == {("NVIDIA-A100-SXM4-80GB", 81920)}
    assert [g["uuid"] for g in a100.gpus] == [f"gpu-a100-0-gpu{i}" for i in range(8)]
    assert a100.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert {(g["model"], g["memory_mib"]) for g in h100.gpus} == {("NVIDIA-H100-80GB-HBM3", 81559)}
    assert (h100.node_pool, h100.health) == ("h100-pool", "healthy")  # the GPU taint is tolerated
    assert records["gpu-cordoned-0"].health == "cordoned"
    assert records["gpu-tainted-0"].health == "cordoned"
    assert [g["partitioned"] for g in records["gpu-mig-0"].gpus] == [True]
    assert [g["partitioned"] for g in records["gpu-mixed-0"].gpus] == [False, False, False, True]
    mig = {n.name: [[s.profile for s in g.mig_slices] for g in n.gpus] for n in result.nodes}
    assert mig["gpu-mig-0"] == [["1g.10gb"] * 7]
    assert mig["gpu-mixed-0"] == [[], [], [], ["3g.40gb", "3g.40gb"]]

    # The slices are grantable: a 1g.10gb request lands on the MIG node.
    grant = ledger.reserve(GpuRequest(mig_profile="1g.10gb"), "t1").grant
    assert grant is not None and (grant.node, grant.mig_profile) == ("gpu-mig-0", "1g.10gb")


def test_second_sync_is_unchanged(ledger: Ledger, k8s: KubernetesEmulatorServer, core: Any) -> None:
    sync_inventory(ledger, core)
    before = ledger.snapshot().nodes

    again = sync_inventory(ledger, core)

    assert (again.added, again.updated, again.drained, again.removed) == ((), (), (), ())
    assert sorted(again.unchanged) == GPU_NODES
    assert ledger.snapshot().nodes == before


def test_cordon_in_kubernetes_stops_grants(ledger: Ledger, k8s: KubernetesEmulatorServer, core: Any) -> None:
    sync_inventory(ledger, core)
    k8s.cordon("gpu-a100-0")

    result = sync_inventory(ledger, core)

    assert result.updated == ("gpu-a100-0",)
    assert {r.name: r.health for r in ledger.snapshot().nodes}["gpu-a100-0"] == "cordoned"
    waiting = ledger.reserve(pinned("gpu-a100-0"), "t1", timeout=60)
    assert waiting.grant is None


def test_vanished_nodes_are_removed_or_drained(
    ledger: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    sync_inventory(ledger, core)
    held = ledger.reserve(pinned("gpu-a100-0"), "t1")
    assert held.grant is not None
    k8s.delete_node("gpu-a100-0")
    k8s.delete_node("gpu-h100-0")

    result = sync_inventory(ledger, core)

    assert (result.drained, result.removed) == (("gpu-a100-0",), ("gpu-h100-0",))
    records = {r.name: r.health for r in ledger.snapshot().nodes}
    assert records["gpu-a100-0"] == "draining" and "gpu-h100-0" not in records
    ledger.release(held.id)
    assert "gpu-a100-0" not in {r.name for r in ledger.snapshot().nodes}
    assert ledger.check_invariants() == []


def test_conflicting_node_is_reported_and_others_stored(
    ledger: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    sync_inventory(ledger, core)
    held = ledger.reserve(pinned("gpu-a100-0", gpus=2), "t1")
    assert held.grant is not None
    keep = str(max(held.grant.gpu_indices))
    # The device plugin withdraws a held GPU: the ledger must not lose it under a live grant.
    k8s.patch_node("gpu-a100-0", lambda n: n["status"]["allocatable"].update({"nvidia.com/gpu": keep}))
    k8s.cordon("gpu-h100-0")

    result = sync_inventory(ledger, core)

    assert [name for name, _ in result.errors] == ["gpu-a100-0"]
    assert result.updated == ("gpu-h100-0",)
    records = {r.name: r for r in ledger.snapshot().nodes}
    assert len(records["gpu-a100-0"].gpus) == 8 and records["gpu-h100-0"].health == "cordoned"


# -- reconcile --------------------------------------------------------------------------------


def test_reconcile(ledger: Ledger, clock: FakeClock, k8s: KubernetesEmulatorServer, core: Any) -> None:
    sync_inventory(ledger, core)
    ledger.upsert_nodes(
        [node("other-cluster-0", gpus=1, labels={"kubernetes.io/hostname": "other-cluster-0"})]
    )
    ids = {}
    for name, where in [
        ("succeeded", "gpu-a100-0"),
        ("failed", "gpu-a100-0"),
        ("running", "gpu-a100-0"),
        ("retried", "gpu-a100-0"),
        ("vanished", "gpu-h100-0"),
        ("elsewhere", "other-cluster-0"),
    ]:
        ids[name] = ledger.reserve(pinned(where), name, reservation_id=f"gp-{name}").id
    make_pod(core, "succeeded", ids["succeeded"], duration_seconds="0.05")
    make_pod(core, "failed", ids["failed"], duration_seconds="0.05", exit_code="1")
    make_pod(core, "running", ids["running"], duration_seconds="60")
    make_pod(core, "retried-1", ids["retried"], duration_seconds="0.05", exit_code="1")
    make_pod(core, "retried-2", ids["retried"], duration_seconds="60")
    for pod in ("succeeded", "failed", "retried-1"):
        k8s.wait_for_pod(pod)
    for pod in ("running", "retried-2"):
        k8s.wait_for_pod(pod, phases={"Running"})
    clock.advance(301)
    ids["fresh"] = ledger.reserve(pinned("gpu-h100-0"), "fresh", reservation_id="gp-fresh").id

    result = reconcile(ledger, core)

    assert sorted(result.released) == [
        ("gp-failed", "pod default/failed finished (Failed: application_error (Error, exit code 1))"),
        ("gp-succeeded", "pod default/succeeded finished (Succeeded)"),
        ("gp-vanished", "no pod for 300s"),
    ]
    assert sorted(result.kept) == ["gp-fresh", "gp-retried", "gp-running"]
    assert result.ignored == ("gp-elsewhere",)
    assert sorted(r.id for r in ledger.snapshot().grants) == [
        "gp-elsewhere",
        "gp-fresh",
        "gp-retried",
        "gp-running",
    ]
    assert ledger.get("gp-succeeded").message == "reconcile: pod default/succeeded finished (Succeeded)"

    again = reconcile(ledger, core, all_nodes=True, grace_seconds=0)
    assert sorted(again.released) == [("gp-elsewhere", "no pod for 0s"), ("gp-fresh", "no pod for 0s")]
    assert ledger.check_invariants() == []


def test_reconcile_grant(ledger: Ledger, clock: FakeClock, k8s: KubernetesEmulatorServer, core: Any) -> None:
    sync_inventory(ledger, core)
    done = ledger.reserve(pinned("gpu-a100-0"), "done").id
    alive = ledger.reserve(pinned("gpu-a100-0"), "alive").id
    make_pod(core, "done", done, duration_seconds="0.05")
    make_pod(core, "alive", alive, duration_seconds="60")
    k8s.wait_for_pod("done")
    k8s.wait_for_pod("alive", phases={"Running"})

    assert reconcile_grant(ledger, core, alive, now=clock()) is None
    assert reconcile_grant(ledger, core, done, now=clock()) == "pod default/done finished (Succeeded)"
    assert reconcile_grant(ledger, core, done, now=clock()) is None  # already released
    assert [r.id for r in ledger.snapshot().grants] == [alive]


# -- CLI --------------------------------------------------------------------------------------


def test_cli_sync_and_reconcile(
    tmp_path: Any, k8s: KubernetesEmulatorServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_gpupool.cli import main

    url = f"sqlite:///{tmp_path}/cli.db"
    cluster = ["--url", url, "--kubeconfig", k8s.kubeconfig_path]

    assert main(["inventory", "sync", *cluster]) == 0
    out = capsys.readouterr().out
    assert "gpu-mig-0" in out and "MIG 7x1g.10gb" in out
    assert out.strip().splitlines()[-1].startswith("inventory from Kubernetes: 6 added")

    assert main(["inventory", "sync", *cluster, "--json"]) == 0
    assert sorted(json.loads(capsys.readouterr().out)["unchanged"]) == GPU_NODES

    assert main(["reserve", "--url", url, "--gpus", "1", "--id", "cli-1", "--json"]) == 0
    capsys.readouterr()
    assert main(["reconcile", *cluster, "--grace-seconds", "0", "--include-manual", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["released"] == [{"id": "cli-1", "reason": "no pod for 0s"}]
