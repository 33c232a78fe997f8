"""A gated pod's PriorityClass as its ledger priority, against the emulator over HTTP, on SQLite and PostgreSQL.

Pods built as KubernetesPodOperator builds them, naming ``priorityClassName``, through the executor
hook; the emulator stores scheduling.k8s.io/v1 PriorityClasses and fills a new pod's
``spec.priority`` from its class, as the API server's admission does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_gpupool.controller.gatekeeper import (
    REASON_REFUSED,
    REASON_UNKNOWN_PRIORITY_CLASS,
    gated_reservation_id,
    gatekeep,
)
from airflow_gpupool.labels import CAPACITY_TYPE_LABEL, PRIORITY_KEY
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer, gpu_node
from tests.integration.gatekeeper_fixtures import create_hooked_pod, create_priority_class, messages, reasons

ZONE = {"topology.kubernetes.io/zone": "zone-a"}
GPU = {"nvidia.com/gpu": "1"}


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubernetesEmulatorServer]:
    nodes = [gpu_node(f"gpu-{i}", gpus=1, labels=ZONE) for i in range(2)]
    with KubernetesEmulatorServer(nodes=nodes, default_duration_seconds=0.2) as server:
        yield server


def priority_of(ledger: Ledger, pod: dict[str, Any]) -> int:
    return ledger.get(gated_reservation_id(pod["metadata"]["uid"])).request.priority


def test_a_pod_is_reserved_at_its_classes_value_and_served_before_lower_work(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    create_priority_class(core, "team-high", 500)
    synced.reserve(GpuRequest(gpus=1), "else", reservation_id="gp-else")  # one GPU left
    low = create_hooked_pod(core, "low", GPU, duration="30")  # older, priority 0
    high = create_hooked_pod(core, "high", GPU, duration="30", priority_class="team-high")
    assert high["spec"]["priority"] == 500  # filled in at creation, as the API server's admission does

    result = gatekeep(synced, core)

    assert (result.admitted, result.waiting) == (["default/high"], ["default/low"])
    reservation = synced.get(gated_reservation_id(high["metadata"]["uid"]))
    assert reservation.request.priority == 500
    assert dict(reservation.request.node_labels) == {CAPACITY_TYPE_LABEL: "on-demand"}  # urgent at 500
    assert priority_of(synced, low) == 0
    assert REASON_UNKNOWN_PRIORITY_CLASS not in reasons(k8s, "high")


def test_a_class_the_pod_was_created_before_is_read_from_the_cluster(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    pod = create_hooked_pod(core, "early", GPU, priority_class="made-later")
    assert "priority" not in pod["spec"]  # no class to fill it from yet
    create_priority_class(core, "made-later", -20)

    assert gatekeep(synced, core).admitted == ["default/early"]
    assert priority_of(synced, pod) == -20
    assert REASON_UNKNOWN_PRIORITY_CLASS not in reasons(k8s, "early")


def test_a_gpupool_priority_the_pod_sets_wins_over_its_class(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    create_priority_class(core, "team-high", 500)
    pod = create_hooked_pod(core, "own", GPU, priority_class="team-high", **{PRIORITY_KEY: "3"})
    assert gatekeep(synced, core).admitted == ["default/own"]
    assert priority_of(synced, pod) == 3


def test_an_unknown_class_is_said_in_an_event_and_the_pod_gets_the_default_priority(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    pod = create_hooked_pod(core, "stray", GPU, priority_class="no-such-class")
    create_hooked_pod(core, "plain", GPU)

    result = gatekeep(synced, core)  # the pass goes on: both admitted

    assert sorted(result.admitted) == ["default/plain", "default/stray"]
    assert priority_of(synced, pod) == 0
    (message,) = messages(k8s, "stray", REASON_UNKNOWN_PRIORITY_CLASS)
    assert "'no-such-class' does not exist" in message and "priority 0" in message
    assert REASON_UNKNOWN_PRIORITY_CLASS not in reasons(k8s, "plain")


def group_member(core: Any, name: str, priority_class: str) -> dict[str, Any]:
    group = {"gpupool.io/gang": "g", "gpupool.io/gang-size": "2"}
    return create_hooked_pod(core, name, GPU, duration="30", priority_class=priority_class, **group)


def test_a_pod_group_is_reserved_at_its_classes_value(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    create_priority_class(core, "team-high", 500)
    group_member(core, "g-0", "team-high")
    group_member(core, "g-1", "team-high")

    assert sorted(gatekeep(synced, core).admitted) == ["default/g-0", "default/g-1"]
    (leader,) = [r for r in synced.snapshot().grants if r.gang_index == 0]
    assert leader.request.priority == 500


def test_pods_of_a_group_that_name_different_classes_are_refused(
    synced: Ledger, k8s: KubernetesEmulatorServer, core: Any
) -> None:
    create_priority_class(core, "team-high", 500)
    create_priority_class(core, "team-low", 5)
    group_member(core, "g-0", "team-high")
    group_member(core, "g-1", "team-low")

    assert sorted(name for name, _ in gatekeep(synced, core).deleted) == ["default/g-0", "default/g-1"]
    (message,) = messages(k8s, "g-0", REASON_REFUSED)
    assert "gpupool.io/priority-class" in message
