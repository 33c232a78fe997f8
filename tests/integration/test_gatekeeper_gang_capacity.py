"""The spot rule for pod groups: a group's gang is reserved where its pods, one by one, would be.

The emulator over HTTP with two on-demand and two spot nodes (Karpenter's label) in one zone,
inventory synced into SQLite and PostgreSQL ledgers; pod groups built as KubernetesPodOperator
builds them, gated by the executor hook, admitted by the gatekeeper.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_gpupool.controller.gatekeeper import gatekeep
from airflow_gpupool.labels import CAPACITY_TYPE_LABEL, HOSTNAME_LABEL, PRIORITY_KEY, REQUEST_ANNOTATION
from airflow_gpupool.ledger import Ledger, Reservation
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.integration.gatekeeper_fixtures import create_hooked_pod

ZONE = {"topology.kubernetes.io/zone": "zone-a"}
SPOT = {"karpenter.sh/capacity-type": "spot"}
TRAINING = '{"workload_class": "training", "preemptible": true}'
CKPT = {"GPUPOOL_CHECKPOINT_DIR": "s3://ckpt/train"}


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    nodes = [gpu_node(f"od-{i}", gpus=1, labels=ZONE) for i in range(2)]
    nodes += [gpu_node(f"spot-{i}", gpus=1, labels={**ZONE, **SPOT}) for i in range(2)]
    with KubernetesEmulatorServer(nodes=nodes, default_duration_seconds=0.2) as server:
        yield server


def create_group(
    core: Any,
    envs: list[dict[str, str] | None],
    node_selector: dict[str, str] | None = None,
    **annotations: str,
) -> list[str]:
    """Create one pod of group ``g`` per entry of ``envs`` (each its container's environment)."""
    group = {"gpupool.io/gang": "g", "gpupool.io/gang-size": str(len(envs))}
    for index, env in enumerate(envs):
        create_hooked_pod(
            core,
            f"g-{index}",
            {"nvidia.com/gpu": "1"},
            duration="30",
            env=env,
            node_selector=node_selector,
            **group,
            **annotations,
        )
    return [f"default/g-{index}" for index in range(len(envs))]


def leader(ledger: Ledger) -> Reservation:
    (found,) = [r for r in ledger.snapshot().grants if r.gang_index == 0]
    return found


def admitted_nodes(k8s: KubernetesEmulatorServer, count: int) -> list[str]:
    """Return the nodes the gatekeeper pinned the group's pods to."""
    pods = [k8s.pod(f"g-{i}") for i in range(count)]
    return sorted(str(p["spec"]["nodeSelector"][HOSTNAME_LABEL]) for p in pods if p is not None)


def test_an_urgent_group_runs_on_on_demand_only(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    names = create_group(core, [None, None], **{PRIORITY_KEY: "100"})
    assert sorted(gatekeep(synced, core).admitted) == names
    assert dict(leader(synced).request.node_labels)[CAPACITY_TYPE_LABEL] == "on-demand"
    assert admitted_nodes(k8s, 2) == ["od-0", "od-1"]


def test_a_checkpointed_preemptible_training_group_prefers_cheap_spot(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__SPOT_PRICE_RATIO", "0.3")
    names = create_group(core, [CKPT, CKPT], **{REQUEST_ANNOTATION: TRAINING})
    assert sorted(gatekeep(synced, core).admitted) == names
    request = leader(synced).request
    assert dict(request.prefer_node_labels) == {CAPACITY_TYPE_LABEL: "spot"}
    assert CAPACITY_TYPE_LABEL not in dict(request.node_labels)  # a preference: on-demand when no spot fits
    assert admitted_nodes(k8s, 2) == ["spot-0", "spot-1"]


def test_a_group_with_a_pod_that_does_not_checkpoint_has_no_spot_preference(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__SPOT_PRICE_RATIO", "0.3")
    names = create_group(core, [CKPT, None], **{REQUEST_ANNOTATION: TRAINING})
    assert sorted(gatekeep(synced, core).admitted) == names
    request = leader(synced).request
    assert CAPACITY_TYPE_LABEL not in dict(request.prefer_node_labels)
    assert CAPACITY_TYPE_LABEL not in dict(request.node_labels)


def test_an_urgent_group_that_asks_for_spot_in_its_node_selector_gets_spot(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    names = create_group(core, [None, None], node_selector=SPOT, **{PRIORITY_KEY: "100"})
    assert sorted(gatekeep(synced, core).admitted) == names
    assert admitted_nodes(k8s, 2) == ["spot-0", "spot-1"]
