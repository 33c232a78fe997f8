"""The reconcile verdict: which grants the pods say to release, and why (pure, no cluster)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from airflow_gpupool.controller.gang_pods import live_member_pod
from airflow_gpupool.controller.reconcile import ReconcileResult, verdict
from airflow_gpupool.ledger import Grant, Reservation, ReservationState
from airflow_gpupool.resources import GpuRequest

GRANTED_AT = 1000.0


def granted() -> Reservation:
    grant = Grant("n1", "default", (0,), ("GPU-0",), "A100", 1000, 81920, None, None, GRANTED_AT, 2000.0)
    return Reservation("gp-1", "h", ReservationState.GRANTED, GpuRequest(gpus=1), 900.0, 9999.0, grant)


def pod(name: str, phase: str | None, created: str = "2026-01-01T00:00:00Z", **status: Any) -> dict[str, Any]:
    """A pod in ``phase``; ``status`` adds to its status (``containerStatuses``, ``reason``)."""
    if phase:
        status["phase"] = phase
    return {"metadata": {"name": name, "namespace": "ml", "creationTimestamp": created}, "status": status}


def ended(exit_code: int, reason: str) -> dict[str, Any]:
    """The status of a pod whose main container ended with ``exit_code`` and ``reason``."""
    terminated = {"exitCode": exit_code, "reason": reason}
    return {"containerStatuses": [{"name": "base", "state": {"terminated": terminated}}]}


@pytest.mark.parametrize(
    ("pods", "now", "expected"),
    [
        pytest.param([], GRANTED_AT + 10, None, id="no-pod-within-grace"),
        pytest.param([], GRANTED_AT + 300, "no pod for 300s", id="no-pod-after-grace"),
        pytest.param([pod("p", "Running")], GRANTED_AT + 1e6, None, id="running"),
        pytest.param([pod("p", None)], GRANTED_AT + 1e6, None, id="no-phase-is-pending"),
        pytest.param([pod("p", "Succeeded")], GRANTED_AT, "pod ml/p finished (Succeeded)", id="succeeded"),
        pytest.param(
            [pod("old", "Failed", "2026-01-01T00:00:00Z"), pod("new", "Failed", "2026-01-01T01:00:00Z")],
            GRANTED_AT,
            "pod ml/new finished (Failed: unknown (Failed))",
            id="names-the-newest",
        ),
        # A failed pod's release says its class, as the operator's ladder reads it: never a lost lease.
        pytest.param(
            [pod("p", "Failed", **ended(1, "Error"))],
            GRANTED_AT,
            "pod ml/p finished (Failed: application_error (Error, exit code 1))",
            id="crashed",
        ),
        pytest.param(
            [pod("p", "Failed", **ended(137, "OOMKilled"))],
            GRANTED_AT,
            "pod ml/p finished (Failed: out_of_memory (OOMKilled, exit code 137))",
            id="oom-killed",
        ),
        pytest.param(
            [pod("p", "Failed", reason="Evicted")],
            GRANTED_AT,
            "pod ml/p finished (Failed: evicted (Evicted))",
            id="evicted",
        ),
        pytest.param(
            [pod("p", "Succeeded", **ended(0, "Completed"))],
            GRANTED_AT,
            "pod ml/p finished (Succeeded)",
            id="succeeded-exit-0",
        ),
        pytest.param([pod("old", "Failed"), pod("retry", "Pending")], GRANTED_AT, None, id="retry-alive"),
    ],
)
def test_verdict(pods: list[dict[str, Any]], now: float, expected: str | None) -> None:
    assert verdict(granted(), pods, now, grace_seconds=300) == expected


@pytest.mark.parametrize(
    ("uid", "now", "expected"),
    [
        pytest.param("uid-1", GRANTED_AT + 10, "pod ml/p gone", id="bound-pod-gone"),
        pytest.param(None, GRANTED_AT + 10, None, id="named-pod-may-be-on-its-way"),
        pytest.param(None, GRANTED_AT + 300, "no pod for 300s", id="named-pod-never-came"),
    ],
)
def test_verdict_on_a_bound_grant_without_pods(uid: str | None, now: float, expected: str | None) -> None:
    reservation = granted()
    assert reservation.grant is not None
    bound = replace(
        reservation, grant=replace(reservation.grant, pod_namespace="ml", pod_name="p", pod_uid=uid)
    )
    assert verdict(bound, [], now, grace_seconds=300) == expected


def test_result_summary_and_dict() -> None:
    result = ReconcileResult(released=(("gp-1", "no pod for 300s"),), kept=("gp-2",), ignored=())
    assert result.summary() == "1 released, 1 kept, 0 ignored; orphans: 0 kept, 0 released, 0 pod(s) deleted"
    assert result.to_dict() == {
        "released": [{"id": "gp-1", "reason": "no pod for 300s"}],
        "kept": ["gp-2"],
        "ignored": [],
        "orphans": {"kept": [], "released": [], "deleted": []},
    }


def member(index: int, state: ReservationState = ReservationState.GRANTED) -> Reservation:
    rid = "gp-g" if index == 0 else f"gp-g.{index}"
    return replace(granted(), id=rid, state=state, gang_id="gp-g", gang_index=index)


@pytest.mark.parametrize(
    ("reservation", "pods", "kept_by"),
    [
        pytest.param(member(0), {"gp-g.1": [pod("w1", "Running")]}, "ml/w1", id="member-runs"),
        pytest.param(member(0), {"gp-g.1": [pod("w1", "Pending")]}, "ml/w1", id="member-pending"),
        pytest.param(member(0), {"gp-g.1": [pod("w1", "Succeeded")]}, None, id="members-finished"),
        pytest.param(member(0), {}, None, id="members-have-no-pod"),
        pytest.param(member(1), {"gp-g.2": [pod("w2", "Running")]}, None, id="not-the-leader"),
        pytest.param(granted(), {"gp-g.1": [pod("w1", "Running")]}, None, id="not-a-gang"),
    ],
)
def test_a_gang_leader_is_kept_while_another_members_pod_lives(
    reservation: Reservation, pods: dict[str, list[dict[str, Any]]], kept_by: str | None
) -> None:
    members = (member(0), member(1), member(2), member(3, ReservationState.RELEASED))
    assert live_member_pod(reservation, members, {**pods, "gp-g.3": [pod("w3", "Running")]}) == kept_by
