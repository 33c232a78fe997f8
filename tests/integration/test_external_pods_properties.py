"""Foreign pods, grants and deletes mixed at random: the cluster, not the ledger, judges the outcome.

Each example runs a random sequence on the emulator (two 4-GPU nodes) with a fresh SQLite ledger
and a running :class:`~airflow_gpupool.controller.external_pods.ExternalPodCounter`: foreign pods
(placed by the scheduler or bound to a node by their author), grants whose pods are launched bound
to the granted node, deletes with and without a grace period, releases. Judged from the cluster:

* every pod of a grant is admitted by its node's kubelet (a grant on GPUs a live pod holds is
  refused ``OutOfnvidia.com/gpu``): the ledger never grants a GPU a live pod holds;
* no node ever runs more GPUs than it has (from the pods' own requests over their lives).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client, config

from airflow_gpupool.controller.external_pods import ExternalPodCounter
from airflow_gpupool.inventory.sync import sync_inventory
from airflow_gpupool.labels import RESERVATION_LABEL
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node

NODES = {"gpu-a": 4, "gpu-b": 4}
SETTLE_SECONDS = 3.0

foreign = st.tuples(st.just("foreign"), st.integers(1, 3), st.sampled_from([None, "gpu-a", "gpu-b"]))
grant = st.tuples(st.just("grant"), st.integers(1, 3), st.none())
delete = st.tuples(st.just("delete"), st.integers(0, 9), st.sampled_from([0, 1]))
steps = st.lists(st.one_of(foreign, grant, delete), min_size=2, max_size=8)


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    nodes = [gpu_node(name, gpus=n) for name, n in NODES.items()]
    with KubernetesEmulatorServer(nodes=nodes, default_duration_seconds=600) as server:
        yield server


def gpu_pod(name: str, gpus: int, node: str | None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {"name": "main", "image": "app:1", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
        ],
    }
    if node:
        spec["nodeName"] = node
    # With a grace, the containers take half a second to exit: the pod is Terminating meanwhile.
    annotations = {"gpupool.emulator/sigterm-exit-seconds": "0.5"}
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations}, "spec": spec}


def live_foreign(emulator: KubernetesEmulatorServer) -> set[str]:
    return {
        f"external:default/{p['metadata']['name']}"
        for p in emulator.pods()
        if p["spec"].get("nodeName")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and not (p["metadata"].get("labels") or {}).get(RESERVATION_LABEL)
    }


def decided(pod: dict[str, Any]) -> bool:
    """Whether kube-scheduler and the kubelet are done with a pod: placed, refused, or unschedulable."""
    status = pod.get("status") or {}
    unschedulable = any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )
    return (
        bool(pod["spec"].get("nodeName")) or status.get("phase") in ("Succeeded", "Failed") or unschedulable
    )


def settle(ledger: Ledger, emulator: KubernetesEmulatorServer) -> None:
    """Wait until the cluster is still and the ledger holds exactly its live foreign pods.

    A pod the scheduler has not placed yet is not counted (nobody knows its node): a grant made
    meanwhile may lose the race to it, in Kubernetes as here. Waiting for a still cluster (every
    pod placed, refused or unschedulable, twice in a row) leaves that race out of the judgement.
    """
    deadline, still = time.monotonic() + SETTLE_SECONDS, 0
    while time.monotonic() < deadline:
        pods = emulator.pods()
        held = {r.holder for r in ledger.external_holds()}
        still = still + 1 if all(decided(p) for p in pods) and held == live_foreign(emulator) else 0
        if still >= 3:
            return
        time.sleep(0.05)
    raise AssertionError(f"the ledger holds {held}, the cluster runs {live_foreign(emulator)}")


def overcommits(emulator: KubernetesEmulatorServer, requested: dict[str, int]) -> list[str]:
    """Times a node ran more GPUs than it has, from each pod's request over its running life."""
    spans: dict[str, list[tuple[float, float, int]]] = {}
    now = time.time()
    for record in emulator.pod_records():
        life = record.running_between(now)
        if life is not None and record.node is not None and record.name in requested:
            spans.setdefault(record.node, []).append((*life, requested[record.name]))
    problems = []
    for node, uses in spans.items():
        for start, _, _ in uses:
            load = sum(n for s, e, n in uses if s <= start < e)
            if load > NODES[node]:
                problems.append(f"{node} ran {load} GPUs at {start:.2f}")
    return problems


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps)
def test_grants_never_land_on_gpus_a_live_pod_holds(
    emulator: KubernetesEmulatorServer, steps: list[tuple[str, int, Any]]
) -> None:
    emulator.reset()
    core = client.CoreV1Api(config.new_client_from_config(emulator.kubeconfig_path))
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger.create(f"sqlite:///{tmp}/ledger.db")
        sync_inventory(ledger, core)
        counter = ExternalPodCounter(ledger, core)
        counter.start()
        requested: dict[str, int] = {}  # live pods: what each asked for
        ever: dict[str, int] = {}  # every pod created
        ours: dict[str, str] = {}  # pod name -> reservation id
        try:
            for n, (action, amount, where) in enumerate(steps):
                settle(ledger, emulator)
                name = f"p{n}"
                if action == "foreign":
                    core.create_namespaced_pod("default", gpu_pod(name, amount, where))
                    requested[name] = ever[name] = amount
                elif action == "grant":
                    held = ledger.reserve(GpuRequest(gpus=amount), name, timeout=1)
                    if held.state is not ReservationState.GRANTED or held.grant is None:
                        ledger.release(held.id, reason="test: no room")
                        continue
                    ledger.bind(held.id, namespace="default", name=name, uid=None)
                    pod = gpu_pod(name, amount, held.grant.node, {RESERVATION_LABEL: held.id})
                    core.create_namespaced_pod("default", pod)
                    requested[name] = ever[name] = amount
                    ours[name] = held.id
                    admitted = emulator.wait_for_pod(name, phases={"Running", "Failed"})
                    assert admitted["status"]["phase"] == "Running", (
                        f"the ledger granted {held.grant.node} GPUs a live pod holds: {admitted['status']}"
                    )
                else:
                    live = sorted(requested)
                    if not live:
                        continue
                    victim = live[amount % len(live)]
                    core.delete_namespaced_pod(victim, "default", grace_period_seconds=where)
                    emulator.wait_for_pod_gone(victim, timeout=30)
                    if victim in ours:
                        ledger.release(ours.pop(victim), reason="test: pod gone")
                    del requested[victim]
            settle(ledger, emulator)
            assert overcommits(emulator, ever) == []
            assert ledger.check_invariants() == []
        finally:
            counter.stop()
            ledger.close()
