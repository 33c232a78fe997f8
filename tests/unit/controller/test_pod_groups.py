"""Pod groups (pure): grouping, agreement, the gang's id and which gated pod takes which member."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from airflow_gpupool.controller.pod_groups import (
    PodGroup,
    assign_members,
    collect_groups,
    group_leader_id,
    group_request,
)
from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.ledger import Grant, Reservation, ReservationState
from airflow_gpupool.resources import GpuRequest

REQUEST = '{"gpus":1}'


def pod(
    name: str,
    *,
    gang: str = "g",
    size: str = "3",
    gated: bool = True,
    phase: str = "Pending",
    created: str = "2026-01-01T00:00:00Z",
    **annotations: str,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "annotations": {
                "gpupool.io/gang": gang,
                "gpupool.io/gang-size": size,
                "gpupool.io/request": REQUEST,
                **annotations,
            },
        },
        "spec": {"schedulingGates": [{"name": "gpupool.io/reservation"}] if gated else []},
        "status": {"phase": phase},
    }


def member(index: int, bound_to: str | None = None) -> Reservation:
    grant = Grant(f"n{index}", "default", (0,), ("GPU-0",), "A100", 1000, 81920, None, None, 1.0, 2.0)
    if bound_to is not None:
        grant = replace(grant, pod_namespace="ml", pod_name=bound_to, pod_uid=f"uid-{bound_to}")
    rid = "gp-g" if index == 0 else f"gp-g.{index}"
    return Reservation(
        rid,
        "h",
        ReservationState.GRANTED,
        GpuRequest(gpus=1),
        0.0,
        9.0,
        grant,
        gang_id="gp-g",
        gang_index=index,
    )


def group(*pods: dict[str, Any]) -> PodGroup:
    (found,) = collect_groups(pods).values()
    return found


def test_pods_are_grouped_by_namespace_and_name_and_gang_jobs_pods_left_out() -> None:
    other_ns = pod("x")
    other_ns["metadata"]["namespace"] = "other"
    job_pod = pod("j", **{"gpupool.io/gang-reservation": "gp-leader"})
    groups = collect_groups([pod("a"), pod("b"), pod("c", gang="h"), other_ns, job_pod])
    assert {k: [p["metadata"]["name"] for p in g.pods] for k, g in groups.items()} == {
        ("ml", "g"): ["a", "b"],
        ("ml", "h"): ["c"],
        ("other", "g"): ["x"],
    }


@pytest.mark.parametrize(
    ("pods", "named"),
    [
        pytest.param([pod("a"), pod("b", size="4")], "gpupool.io/gang-size", id="size"),
        pytest.param([pod("a"), pod("b", **{"gpupool.io/gang-min": "2"})], "gpupool.io/gang-min", id="min"),
        pytest.param(
            [pod("a"), pod("b", **{"gpupool.io/request": '{"gpus":2}'})], "gpupool.io/request", id="request"
        ),
        pytest.param([pod("a", size="1"), pod("b", size="1")], "the 2 pods of gang g", id="too many"),
    ],
)
def test_pods_that_disagree_or_outnumber_the_size_are_named(pods: list[dict[str, Any]], named: str) -> None:
    with pytest.raises(InvalidRequestError, match=named):
        group(*pods).agreed()


def test_finished_pods_neither_count_nor_disagree() -> None:
    gang, text = group(pod("a"), pod("old", size="9", phase="Succeeded")).agreed()
    assert (gang.size, gang.min_members, text) == (3, 3, REQUEST)
    request = group_request(text, gang, ("topology.kubernetes.io/zone",))
    assert request.gang is not None and request.gang.topology_keys == ("topology.kubernetes.io/zone",)


def test_the_gangs_id_is_its_admitted_pods_else_derived_from_the_oldest_pod() -> None:
    young, old = pod("b", created="2026-01-02T00:00:00Z"), pod("z", created="2026-01-01T00:00:00Z")
    derived = group_leader_id(group(young, old), {})
    assert derived == group_leader_id(group(old), {}) != group_leader_id(group(young), {})
    assert derived.startswith("gp-") and len(derived) <= 60
    admitted = pod("a", gated=False)
    admitted["metadata"]["labels"] = {"gpupool.io/reservation-id": "gp-g.1"}
    assert group_leader_id(group(young, admitted), {"gp-g.1": member(1)}) == "gp-g"


def test_members_go_to_gated_pods_in_completion_index_order() -> None:
    pods = [
        pod(n, **{"batch.kubernetes.io/job-completion-index": i})
        for n, i in (("a", "2"), ("b", "0"), ("c", "1"))
    ]
    chosen = assign_members(group(*pods), [member(2), member(0), member(1)], 3)
    assert [(p["metadata"]["name"], m.gang_index) for p, m in chosen] == [("b", 0), ("c", 1), ("a", 2)]


def test_never_fewer_than_the_minimum_ungated() -> None:
    assert assign_members(group(pod("a"), pod("b"), pod("c")), [member(0), member(1)], 3) == []
    assert len(assign_members(group(pod("a"), pod("b"), pod("c")), [member(0), member(1), member(2)], 3)) == 3


def test_an_elastic_groups_running_pods_keep_their_members_and_count_for_the_minimum() -> None:
    running = [pod("a", gated=False, phase="Running"), pod("b", gated=False, phase="Running")]
    grown = [member(0, "a"), member(1, "b"), member(2)]
    chosen = assign_members(group(*running, pod("c"), pod("d")), grown, 2)
    assert [(p["metadata"]["name"], m.gang_index) for p, m in chosen] == [("c", 2)]


def test_a_gated_pod_already_bound_keeps_its_member() -> None:
    # A pass bound both, then died before its patches: the next one admits them on the same members.
    chosen = assign_members(group(pod("a"), pod("b")), [member(0, "b"), member(1, "a")], 2)
    assert sorted((p["metadata"]["name"], m.gang_index) for p, m in chosen) == [("a", 1), ("b", 0)]
