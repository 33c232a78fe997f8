"""Where a waiting request preempts: the node whose victims lose the least work, and which victims.

The ledger's queue service (:mod:`airflow_gpupool.ledger.teams.preempting`) and the forecast's
replay (:mod:`airflow_gpupool.forecast.replay`) both choose victims here, so a forecast preempts
as the ledger would. Which grant may be a victim of which request, and in what order victims are
taken, is :mod:`~airflow_gpupool.governance.preemption`'s rule; here each node is tried: its
eligible grants are freed one by one, in that order, on a copy of the node until the request fits
there (placement, binding and quota as a grant would be checked). The node whose victims lose the
least work (GPU-seconds since their newest checkpoint) wins, ties to fewer victims, then the name.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow_gpupool.governance.preemption import Preemptor, VictimCandidate, lost_gpu_seconds, may_preempt
from airflow_gpupool.placement.accounting import deallocate
from airflow_gpupool.placement.fit import EXCLUSIVE_CLASSES
from airflow_gpupool.placement.pools import UNCONSTRAINED, PoolBindings
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.verdict import NoFit
from airflow_gpupool.resources import GpuRequest, WorkloadClass

if TYPE_CHECKING:
    from airflow_gpupool.governance.queue_pass import Governance
    from airflow_gpupool.placement.queue import QueueEntry
    from airflow_gpupool.placement.verdict import Assignment

__all__ = [
    "PREEMPTORS_PER_PASS",
    "LiveGrant",
    "PreemptionRules",
    "best_victims",
    "held_milli",
    "offer_victims",
]

# Waiting requests offered victims per pass: the queue's head, where preemption matters.
PREEMPTORS_PER_PASS = 4


@dataclass(frozen=True)
class PreemptionRules:
    """The ledger's preemption settings.

    :param min_runtime_seconds: a grant younger than this is never a victim
    :param grace_seconds: a victim's grace when its request names none
    :param bindings: the binding of each node pool (a preemptor goes only where it can be expressed)
    """

    min_runtime_seconds: float
    grace_seconds: float
    bindings: PoolBindings = UNCONSTRAINED

    def grace_of(self, request: GpuRequest) -> float:
        """Return how long a victim of ``request``'s shape has to checkpoint and end."""
        return request.preemption_grace_seconds or self.grace_seconds


@dataclass(frozen=True)
class LiveGrant:
    """A live preemptible grant, as a node's victims are chosen among them."""

    reservation_id: str
    node: str
    request: GpuRequest
    assignment: Assignment
    candidate: VictimCandidate
    #: what the ledger keeps beside it (its row), untouched here
    source: Any = None


def held_milli(request: GpuRequest, assignment: Assignment) -> int:
    """Return the milli-GPU a grant holds (a MIG slice: its request's compute share)."""
    if assignment.mig_slice is not None:
        return request.total_gpu_milli
    return len(assignment.gpu_indices) * assignment.milli_per_gpu


def offer_victims(
    preemptors: Sequence[QueueEntry],
    grants: Sequence[LiveGrant],
    nodes: Mapping[str, NodeState],
    pending: Container[str],
    *,
    now: float,
    rules: PreemptionRules,
    place: Callable[[ClusterSnapshot, GpuRequest], Any],
    classes_on: Callable[[str], dict[str, WorkloadClass]],
    quota: Governance | None,
) -> list[tuple[QueueEntry, tuple[LiveGrant, ...]]]:
    """Offer ``grants`` as victims to the first :data:`PREEMPTORS_PER_PASS` of ``preemptors``, in queue order.

    Return each preemptor that found victims, with them; a grant is offered to one preemptor only.

    :param preemptors: the waiting requests that may preempt (not granted by the pass, not gangs)
    :param pending: the requests whose victims were told already (they do not preempt again)
    """
    lowest = min((g.request.priority for g in grants), default=None)
    offers: list[tuple[QueueEntry, tuple[LiveGrant, ...]]] = []
    offered = 0
    left = list(grants)
    for entry in preemptors:
        if offered >= PREEMPTORS_PER_PASS or not left:
            break
        if entry.request_id in pending:
            continue
        if lowest is not None and entry.request.priority <= lowest and quota is None:
            break  # in queue order: no later request outranks any victim either
        offered += 1
        chosen = best_victims(
            entry.request, left, nodes, now=now, rules=rules, place=place, classes_on=classes_on, quota=quota
        )
        if chosen is None:
            continue
        offers.append((entry, chosen))
        taken = {v.reservation_id for v in chosen}
        left = [v for v in left if v.reservation_id not in taken]
    return offers


def best_victims(
    request: GpuRequest,
    grants: Sequence[LiveGrant],
    nodes: Mapping[str, NodeState],
    *,
    now: float,
    rules: PreemptionRules,
    place: Callable[[ClusterSnapshot, GpuRequest], Any],
    classes_on: Callable[[str], dict[str, WorkloadClass]],
    quota: Governance | None,
) -> tuple[LiveGrant, ...] | None:
    """Return the victims on the node where freeing them places ``request`` losing the least work, or None.

    :param grants: the live preemptible grants not already told to end
    :param nodes: the nodes as they are, by name
    :param place: the placement policy's ``place``
    :param classes_on: a node's live grants' workload classes, by reservation id (all of them,
        victims or not: which exclusive classes stay on the node once the victims leave)
    :param quota: the quotas and what each team holds (None: no quotas, priority alone decides)
    """
    by_node: dict[str, list[LiveGrant]] = {}
    for grant in grants:
        by_node.setdefault(grant.node, []).append(grant)
    best: tuple[tuple[float, int, str], tuple[LiveGrant, ...]] | None = None
    for name, here in sorted(by_node.items()):
        node = nodes[name]
        if not node.schedulable or not rules.bindings.allows(node.node_pool, request):
            continue
        chosen = _victims_on(request, node, here, now, rules, place, classes_on(name), quota)
        if chosen is None:
            continue
        lost = sum(lost_gpu_seconds(v.candidate, now) for v in chosen)
        key = (lost, len(chosen), name)
        if best is None or key < best[0]:
            best = (key, chosen)
    return best[1] if best is not None else None


def _victims_on(
    request: GpuRequest,
    node: NodeState,
    here: Sequence[LiveGrant],
    now: float,
    rules: PreemptionRules,
    place: Callable[[ClusterSnapshot, GpuRequest], Any],
    staying: dict[str, WorkloadClass],
    quota: Governance | None,
) -> tuple[LiveGrant, ...] | None:
    """Free the eligible grants of ``node`` one by one, least work lost first, until ``request`` fits."""
    preemptor = Preemptor(
        priority=request.priority,
        milli=request.total_gpu_milli,
        reclaims=quota is not None and quota.within_nominal(request, node),
        team=request.team,
        urgent=quota is not None and quota.urgent(request),
    )
    conflicting = EXCLUSIVE_CLASSES.get(request.workload_class.value)
    eligible = [
        v
        for v in here
        if may_preempt(preemptor, _with_class_block(v, conflicting), now, rules.min_runtime_seconds)
    ]
    if not eligible:
        return None
    eligible.sort(
        key=lambda v: (lost_gpu_seconds(v.candidate, now), v.candidate.priority, -v.candidate.granted_at)
    )
    staying = dict(staying)
    freed = node
    chosen: list[LiveGrant] = []
    for victim in eligible:
        if quota is not None and chosen and _only_as_borrower(preemptor, victim):
            # Taken back only while its team still borrows after the victims chosen before it.
            if not quota.without(_freeing(chosen)).borrowing(victim.request.team, node):
                continue
        chosen.append(victim)
        staying.pop(victim.reservation_id, None)
        freed = deallocate(freed, victim.request, victim.assignment, _exclusive(staying.values()))
        verdict = place(ClusterSnapshot((freed,)), request)
        if isinstance(verdict, NoFit):
            continue
        if quota is not None and not quota.without(_freeing(chosen)).admits(request, node):
            continue
        return tuple(chosen)
    return None


def _only_as_borrower(preemptor: Preemptor, victim: LiveGrant) -> bool:
    """Whether ``victim`` is eligible only because its team borrows (another team, not outranked, not on a headroom loan)."""
    on_loan = victim.candidate.on_headroom_loan and preemptor.urgent
    return (
        victim.request.team != preemptor.team
        and victim.request.priority >= preemptor.priority
        and not on_loan
    )


def _freeing(chosen: Sequence[LiveGrant]) -> list[tuple[GpuRequest, Assignment]]:
    return [(v.request, v.assignment) for v in chosen]


def _with_class_block(victim: LiveGrant, conflicting: str | None) -> VictimCandidate:
    """The candidate, marked when its class may not share a node with the preemptor's."""
    if conflicting is None or victim.request.workload_class.value != conflicting:
        return victim.candidate
    return replace(victim.candidate, blocks_by_class=True)


def _exclusive(staying: Iterable[WorkloadClass]) -> frozenset[str]:
    """The exclusive workload classes the grants staying on a node keep there."""
    return frozenset(c.value for c in staying if c.value in EXCLUSIVE_CLASSES)
