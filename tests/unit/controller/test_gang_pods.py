"""Which gated pods of a gang Job may be pinned now (pure): a replacement waits until its member's old pod ended."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from airflow_gpupool.controller.gang_pods import pods_to_pin, replacements_by_member
from airflow_gpupool.exceptions import GpuPoolError
from airflow_gpupool.ledger import Gang, Grant, Reservation, ReservationState
from airflow_gpupool.resources import GangSpec, GpuRequest

INDEX = "batch.kubernetes.io/job-completion-index"
LOG = logging.getLogger(__name__)


def member(index: int) -> Reservation:
    grant = Grant("gpu-a", "a100", (index,), (f"GPU-{index}",), "A100", 1000, 81920, None, None, 0.0, 60.0)
    rid = "gp-1" if index == 0 else f"gp-1.{index}"
    request = GpuRequest(gpus=1, gang=GangSpec(members=2, min_members=2))
    return Reservation(
        rid, "me", ReservationState.GRANTED, request, 0.0, 60.0, grant=grant, gang_id="gp-1", gang_index=index
    )


MEMBERS = {0: member(0), 1: member(1)}
GANG = Gang("gp-1", GangSpec(members=2, min_members=2), (MEMBERS[0], MEMBERS[1]))


def pod(name: str, index: int, *, gated: bool, phase: str = "Pending") -> dict[str, Any]:
    gates = [{"name": "gpupool.io/reservation"}] if gated else []
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "annotations": {INDEX: str(index)}},
        "spec": {"schedulingGates": gates},
        "status": {"phase": phase},
    }


def chosen(pods: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(p["metadata"]["name"], m.id) for p, m in pods_to_pin(pods, GANG, MEMBERS, LOG)]


def test_each_first_pod_takes_its_member() -> None:
    assert chosen([pod("a-0", 0, gated=True), pod("a-1", 1, gated=True)]) == [
        ("a-0", "gp-1"),
        ("a-1", "gp-1.1"),
    ]


@pytest.mark.parametrize("phase", ["Pending", "Running"])
def test_a_replacement_waits_while_its_members_old_pod_may_run(phase: str) -> None:
    pods = [pod("old-1", 1, gated=False, phase=phase), pod("new-1", 1, gated=True)]
    assert chosen(pods) == []


@pytest.mark.parametrize("old", [[pod("old-1", 1, gated=False, phase="Failed")], []])
def test_a_replacement_takes_the_member_once_the_old_pod_ended_or_is_gone(old: list[dict[str, Any]]) -> None:
    assert chosen([*old, pod("new-1", 1, gated=True)]) == [("new-1", "gp-1.1")]


def test_two_gated_pods_of_one_index_never_share_the_member() -> None:
    assert chosen([pod("x-1", 1, gated=True), pod("y-1", 1, gated=True)]) == [("x-1", "gp-1.1")]


def test_a_pod_outside_the_gang_is_an_error() -> None:
    with pytest.raises(GpuPoolError, match="completion index 2"):
        chosen([pod("a-2", 2, gated=True)])


def test_reconcile_counts_a_gated_replacement_as_its_members_pod() -> None:
    def labelled(p: dict[str, Any], **labels: str) -> dict[str, Any]:
        p["metadata"]["labels"] = labels
        return p

    waiting = labelled(pod("new-1", 1, gated=True), **{"gpupool.io/gang-reservation": "gp-1"})
    leader = labelled(pod("new-0", 0, gated=True), **{"gpupool.io/gang-reservation": "gp-1"})
    pinned = labelled(
        pod("old-2", 2, gated=False),
        **{"gpupool.io/gang-reservation": "gp-1", "gpupool.io/reservation-id": "gp-1.2"},
    )
    found = replacements_by_member([waiting, leader, pinned, pod("plain", 1, gated=True)])
    assert {k: [p["metadata"]["name"] for p in v] for k, v in found.items()} == {
        "gp-1.1": ["new-1"],
        "gp-1": ["new-0"],
    }
