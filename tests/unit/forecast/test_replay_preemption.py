"""The replay preempts as the ledger does: who may be a victim, when, and when its slice passes on."""

from __future__ import annotations

from airflow_gpupool.forecast.durations import RemainingTime
from airflow_gpupool.forecast.replay import Running, Waiting, forecast_starts
from airflow_gpupool.governance import Flavor, QuotaPlan, TeamQuota
from airflow_gpupool.governance.queue_pass import Governance
from airflow_gpupool.governance.victim_nodes import PreemptionRules
from airflow_gpupool.placement.accounting import allocate
from airflow_gpupool.placement.policy import get_policy
from airflow_gpupool.placement.snapshot import ClusterSnapshot, GpuState, NodeState
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.sim.replay import quick

NOW = 10_000.0
RULES = PreemptionRules(min_runtime_seconds=60, grace_seconds=120)
PLACE = quick(get_policy("bestfit"))


def fixed(seconds: float) -> RemainingTime:
    return RemainingTime("task", (seconds,) * 3, 3600.0)


def busy(requests: list[GpuRequest], gpus: int) -> tuple[list[NodeState], list[NodeState], list[Assignment]]:
    """One node of ``gpus`` GPUs with ``requests`` placed on it: (nodes now, nodes empty, assignments)."""
    empty = [
        NodeState("n1", 64000, 262144, tuple(GpuState(i, "A100", 81920, 1000, 81920) for i in range(gpus)))
    ]
    nodes, assignments = list(empty), []
    for request in requests:
        verdict = PLACE(ClusterSnapshot(tuple(nodes)), request)
        assert isinstance(verdict, Assignment)
        nodes = [allocate(nodes[0], request, verdict)]
        assignments.append(verdict)
    return nodes, empty, assignments


def start(victim: GpuRequest, preemptor: GpuRequest, **running: object) -> tuple[float, float]:
    """Return p10 and p90 of ``preemptor``'s start behind ``victim``, whose run ends 5,000 s from now."""
    nodes, empty, (assignment,) = busy([victim], gpus=1)
    grant = Running("v", victim, assignment, fixed(5_000), **{"granted_at": NOW - 600, **running})  # type: ignore[arg-type]
    (forecast,) = forecast_starts(
        NOW, nodes, empty, [grant], [Waiting("w", preemptor, fixed(60))], PLACE, 8, preemption=RULES
    )
    assert forecast.p10 is not None and forecast.p90 is not None
    return forecast.p10, forecast.p90


def test_a_higher_priority_request_starts_within_its_victims_grace() -> None:
    p10, p90 = start(GpuRequest(gpus=1, preemptible=True), GpuRequest(gpus=1, priority=10))
    assert NOW <= p10 <= p90 <= NOW + 120


def test_no_victim_no_preemption() -> None:
    later = (NOW + 5_000, NOW + 5_000)
    assert start(GpuRequest(gpus=1), GpuRequest(gpus=1, priority=10)) == later, "not preemptible"
    assert start(GpuRequest(gpus=1, preemptible=True), GpuRequest(gpus=1)) == later, "same priority"
    assert (
        start(GpuRequest(gpus=1, preemptible=True), GpuRequest(gpus=1, priority=10, preempts=False)) == later
    )
    victim = GpuRequest(gpus=1, preemptible=True)
    assert start(victim, GpuRequest(gpus=1, priority=10), granted_at=None) == later, "its age is not known"


def test_a_young_grant_is_taken_once_it_comes_of_age() -> None:
    p10, p90 = start(
        GpuRequest(gpus=1, preemptible=True), GpuRequest(gpus=1, priority=10), granted_at=NOW - 20
    )
    assert NOW + 40 <= p10 <= p90 <= NOW + 40 + 120


def test_a_victim_told_already_ends_by_its_deadline() -> None:
    victim = GpuRequest(gpus=1, preemptible=True)
    told = start(victim, GpuRequest(gpus=1, priority=10), ends_by=NOW + 30, preempted_for="w")
    assert told == (NOW + 30, NOW + 30)


def test_without_the_rules_nothing_is_preempted() -> None:
    nodes, empty, (assignment,) = busy([GpuRequest(gpus=1, preemptible=True)], gpus=1)
    grant = Running("v", GpuRequest(gpus=1, preemptible=True), assignment, fixed(5_000), granted_at=NOW - 600)
    (forecast,) = forecast_starts(
        NOW, nodes, empty, [grant], [Waiting("w", GpuRequest(gpus=1, priority=10), fixed(60))], PLACE, 8
    )
    assert (forecast.p10, forecast.p90) == (NOW + 5_000, NOW + 5_000)
    assert "preemption" not in forecast.reason


def test_under_quotas_a_team_reclaims_its_nominal_quota_from_a_borrower() -> None:
    """Same priority, other team: b borrows a's GPU; a's request takes it back (Kueue's reclaim)."""
    pool = Flavor("pool", "default")
    plan = QuotaPlan((TeamQuota("a", pool, 1000, cohort="lab"), TeamQuota("b", pool, 1000, cohort="lab")))
    b = GpuRequest(gpus=1, team="b", preemptible=True)
    nodes, empty, assignments = busy([b, b], gpus=2)
    running = [
        Running(f"b{i}", b, a, fixed(5_000), granted_at=NOW - 600 - i) for i, a in enumerate(assignments)
    ]
    governance = Governance.of_grants(plan, [(b, a) for a in assignments], {n.name: n for n in empty})
    waiting = [Waiting("a", GpuRequest(gpus=1, team="a"), fixed(60))]

    def forecast(rules: PreemptionRules | None) -> tuple[float | None, float | None]:
        (out,) = forecast_starts(
            NOW, nodes, empty, running, waiting, PLACE, 8, governance=governance, preemption=rules
        )
        return out.p10, out.p90

    p10, p90 = forecast(RULES)
    assert p10 is not None and p90 is not None
    assert NOW <= p10 <= p90 <= NOW + 120
    assert forecast(None) == (NOW + 5_000, NOW + 5_000)
