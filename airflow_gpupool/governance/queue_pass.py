"""The quota rules of one pass over the queue: admission per flavor, headroom, fair order.

:class:`Governance` holds the stored quotas and what every team holds; the ledger builds one per
pass from its live grants (:func:`airflow_gpupool.ledger.teams.admission.read_governance`), the
forecast's replay one per replay from the grants it reads (:meth:`Governance.of_grants`), so
both serve the queue by the same rules. What the rules are: the ledger's
:mod:`~airflow_gpupool.ledger.teams.admission`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from airflow_gpupool import settings
from airflow_gpupool.governance.admission import QuotaState
from airflow_gpupool.governance.capacity import fits_headroom, is_urgent
from airflow_gpupool.governance.fairness import FairShare
from airflow_gpupool.governance.quotas import Flavor, QuotaPlan, gpu_milli_of_mig
from airflow_gpupool.placement.gang import GangAssignment
from airflow_gpupool.placement.queue import QueueEntry
from airflow_gpupool.placement.snapshot import NodeState
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest

__all__ = ["Governance", "node_flavors"]

_MILLI_PER_GPU = 1000


@dataclass(frozen=True)
class _Queued:
    """A queue entry as :class:`FairShare` sees it."""

    entry: QueueEntry

    @property
    def team(self) -> str:
        return self.entry.request.team

    @property
    def priority(self) -> int:
        return self.entry.request.priority

    @property
    def created_at(self) -> float:
        return float(self.entry.seq)


class Governance:
    """The quotas and what every team holds, for one pass over the queue.

    :param plan: the stored quotas
    :param used: milli-GPU held per (team, flavor); grants of the pass are added to it
    :param held: milli-GPU held per team, all flavors together
    :param nodes: the transaction's nodes
    :param pool_held: milli-GPU held per node pool (None: counted by :meth:`record`)
    """

    def __init__(
        self,
        plan: QuotaPlan,
        used: dict[tuple[str, Flavor], int],
        held: dict[str, int],
        nodes: Mapping[str, NodeState],
        pool_held: dict[str, int] | None = None,
    ) -> None:
        self.plan = plan
        self.used = used
        self.held = held
        self.nodes = nodes
        self.teams = frozenset(q.team for q in plan.quotas)
        headroom = plan.headroom
        #: Work at or above this priority (or inference) is urgent: it may use the headroom.
        self.urgent_priority = (
            headroom.urgent_priority if headroom.urgent_priority is not None else settings.urgent_priority()
        )
        #: The milli-GPU of each node pool, and what its live grants hold (with the pass's grants).
        self.pool_capacity: dict[str, int] = defaultdict(int)
        self.pool_held: dict[str, int] = defaultdict(int) if pool_held is None else pool_held
        for node in nodes.values():
            self.pool_capacity[node.node_pool] += len(node.gpus) * _MILLI_PER_GPU

    @classmethod
    def of_grants(
        cls,
        plan: QuotaPlan,
        grants: Iterable[tuple[GpuRequest, Assignment]],
        nodes: Mapping[str, NodeState],
    ) -> Governance:
        """Count what ``grants`` hold (a grant on a node not in ``nodes`` counts nothing)."""
        governance = cls(plan, defaultdict(int), defaultdict(int), nodes)
        for request, assignment in grants:
            node = nodes.get(assignment.node)
            if node is not None:
                governance.record(request, assignment, node)
        return governance

    # -- admission -----------------------------------------------------------------------------

    def refused(self, request: GpuRequest, nodes: Iterable[NodeState]) -> frozenset[str]:
        """Return the nodes whose flavors refuse ``request`` for its team, or whose pool keeps its headroom from it (a gang: its minimum's total)."""
        if request.team not in self.teams and not self.plan.headroom.active:
            return frozenset()
        verdicts: dict[tuple[str, frozenset[str]], bool] = {}
        out = []
        for node in nodes:
            key = (node.node_pool, node.models)
            if key not in verdicts:
                verdicts[key] = self.admits(request, node)
            if not verdicts[key]:
                out.append(node.name)
        return frozenset(out)

    def admits_milli(self, team: str, node: NodeState, milli: int) -> bool:
        """Whether ``team``'s quota admits ``milli`` more on ``node``'s flavors (a run's peak)."""
        return QuotaState(self.plan, self.used).admit(team, node_flavors(node), milli).admitted

    def refused_everywhere(self, request: GpuRequest) -> bool:
        """Whether the quota refuses ``request`` on every node (it then waits outside the pass)."""
        return bool(self.nodes) and len(self.refused(request, self.nodes.values())) == len(self.nodes)

    def admits_gang(self, request: GpuRequest, verdict: GangAssignment) -> bool:
        """Whether a placed gang fits its team's quota, each flavor counting the members on it."""
        member = request.member
        per_flavor: dict[Flavor, int] = defaultdict(int)
        per_pool: dict[str, int] = defaultdict(int)
        for assignment in verdict.members:
            node = self.nodes[assignment.node]
            milli = _assignment_milli(member, assignment, node)
            per_pool[node.node_pool] += milli
            for flavor in _flavors(node, assignment):
                per_flavor[flavor] += milli
        # A gang is never preempted, so the headroom is never lent to it.
        if not all(
            self._fits_headroom(request, pool, milli, lendable=False) for pool, milli in per_pool.items()
        ):
            return False
        if request.team not in self.teams:
            return True
        state = QuotaState(self.plan, self.used)
        return all(state.admit(request.team, [f], milli).admitted for f, milli in per_flavor.items())

    def record(self, request: GpuRequest, assignment: Assignment, node: NodeState) -> None:
        """Count a grant (one member of a gang) in its team's usage."""
        milli = _assignment_milli(request, assignment, node)
        if not milli:
            return
        self.pool_held[node.node_pool] += milli
        self.held[request.team] += milli
        for flavor in _flavors(node, assignment):
            self.used[(request.team, flavor)] += milli

    def refusal(self, request: GpuRequest) -> str | None:
        """Say why the quota refuses ``request`` everywhere (``team X is at its quota on pool:a100 ...``); None if it does not."""
        if not self.refused_everywhere(request):
            return None
        state = QuotaState(self.plan, self.used)
        notes = [self._keeps_headroom(pool) for pool in self._headroom_refusing(request)]
        for flavor in sorted({f for n in self.nodes.values() for f in node_flavors(n)}):
            milli = max((self._milli(request, n) for n in self.nodes.values()), default=0)
            if flavor in self.plan.flavors and not state.admit(request.team, [flavor], milli).admitted:
                notes.append(self._at_quota(state, request.team, flavor))
        return "; ".join(dict.fromkeys(notes)) or f"team {request.team}'s quota admits it on no node"

    # -- preemption ----------------------------------------------------------------------------

    def borrowing(self, team: str, node: NodeState) -> bool:
        """Whether ``team`` holds more than its nominal quota of a flavor of ``node`` (no quota: always)."""
        nominal = self._nominal(team)
        flavors = [f for f in node_flavors(node) if (team, f) in nominal]
        if not flavors:
            return True
        return any(self.used.get((team, f), 0) > nominal[(team, f)] for f in flavors)

    def within_nominal(self, request: GpuRequest, node: NodeState) -> bool:
        """Whether ``request`` on ``node`` keeps its team within its nominal quota (it reclaims).

        Such a request may preempt other teams' borrowed grants; it never uses the headroom for it.
        """
        milli = self._milli(request, node)
        return self._within_nominal_milli(request.team, dict.fromkeys(node_flavors(node), milli))

    def _within_nominal_milli(self, team: str, milli_by_flavor: Mapping[Flavor, int]) -> bool:
        """Whether ``team`` taking ``milli_by_flavor`` more stays within its nominal quota in each (and has one)."""
        nominal = self._nominal(team)
        counted = [f for f in milli_by_flavor if (team, f) in nominal]
        return bool(counted) and all(
            self.used.get((team, f), 0) + milli_by_flavor[f] <= nominal[(team, f)] for f in counted
        )

    def admits(self, request: GpuRequest, node: NodeState) -> bool:
        """Whether the quota admits ``request`` on ``node`` now, and its pool's headroom leaves room for it."""
        if not self._fits_headroom(request, node.node_pool, self._milli(request, node)):
            return False
        return request.team not in self.teams or self._admits_on(request, node)

    # -- headroom ------------------------------------------------------------------------------

    def urgent(self, request: GpuRequest) -> bool:
        """Whether ``request`` may use the headroom (urgent priority or the inference class)."""
        return is_urgent(request.priority, request.workload_class.value, self.urgent_priority)

    def on_loan(self, request: GpuRequest, assignment: Assignment, node: NodeState) -> bool:
        """Whether granting ``assignment`` (not yet recorded) takes headroom lent to preemptible work."""
        if not self.plan.headroom.active or self.urgent(request):
            return False
        milli = _assignment_milli(request, assignment, node)
        return bool(milli) and not self._fits_headroom(request, node.node_pool, milli, lendable=False)

    def _lends_to(self, request: GpuRequest) -> bool:
        return self.plan.headroom.lend_to_preemptible and request.preemptible and request.gang is None

    def _fits_headroom(
        self, request: GpuRequest, pool: str, milli: int, *, lendable: bool | None = None
    ) -> bool:
        headroom = self.plan.headroom
        lent = self._lends_to(request) if lendable is None else lendable
        if not headroom.active or not milli or lent or self.urgent(request):
            return True  # whether the pool has room for it is placement's question, not the headroom's
        capacity = self.pool_capacity.get(pool, 0)
        free = capacity - self.pool_held.get(pool, 0)
        return fits_headroom(capacity, free, milli, headroom.share(pool), urgent=False)

    def _headroom_refusing(self, request: GpuRequest) -> list[str]:
        pools = {n.node_pool: n for n in self.nodes.values()}
        return [
            p
            for p, n in sorted(pools.items())
            if not self._fits_headroom(request, p, self._milli(request, n))
        ]

    def _keeps_headroom(self, pool: str) -> str:
        share, capacity = self.plan.headroom.share(pool), self.pool_capacity.get(pool, 0)
        return (
            f"pool {pool} keeps {share:.0%} of its GPUs for urgent work (priority >= {self.urgent_priority} "
            f"or inference): {self.pool_held.get(pool, 0) / 1000:g} of {capacity / 1000:g} GPUs held"
        )

    def without(self, freed: Iterable[tuple[GpuRequest, Assignment]]) -> Governance:
        """Return this usage once the grants ``freed`` are gone (preemption victims)."""
        used, held = defaultdict(int, self.used), defaultdict(int, self.held)
        pool_held = defaultdict(int, self.pool_held)
        for request, assignment in freed:
            node = self.nodes.get(assignment.node)
            if node is None:
                continue
            milli = _assignment_milli(request, assignment, node)
            held[request.team] -= milli
            pool_held[node.node_pool] -= milli
            for flavor in _flavors(node, assignment):
                used[(request.team, flavor)] -= milli
        return Governance(self.plan, used, held, self.nodes, pool_held)

    def _nominal(self, team: str) -> dict[tuple[str, Flavor], int]:
        return {(q.team, q.flavor): q.nominal_milli for q in self.plan.quotas if q.team == team}

    # -- fair order ----------------------------------------------------------------------------

    def order(self, entries: list[QueueEntry]) -> list[QueueEntry]:
        """Return the entries in fair order, ``seq`` renumbered so the queue rule keeps that order."""
        capacity = sum(len(n.gpus) * _MILLI_PER_GPU for n in self.nodes.values())
        fair = FairShare(self.plan, dict(self.held), capacity)
        ranked = fair.order([_Queued(e) for e in entries])
        return [replace(q.entry, seq=rank) for rank, q in enumerate(ranked)]  # type: ignore[attr-defined]

    # -- helpers -------------------------------------------------------------------------------

    def _admits_on(self, request: GpuRequest, node: NodeState) -> bool:
        milli = self._milli(request, node)
        if not milli:
            return True
        state = QuotaState(self.plan, self.used)
        return state.admit(request.team, node_flavors(node), milli).admitted

    @staticmethod
    def _milli(request: GpuRequest, node: NodeState) -> int:
        """The most ``request`` may count on ``node`` (a gang: its minimum's total)."""
        member = request.member if request.gang is not None else request
        count = request.gang.min_members if request.gang is not None else 1
        if member.mig_profile is not None:
            each = max((gpu_milli_of_mig(member.mig_profile, m) for m in node.models), default=0)
        else:
            each = member.gpu_milli or member.gpus * _MILLI_PER_GPU
        return each * count

    def _at_quota(self, state: QuotaState, team: str, flavor: Flavor) -> str:
        quota = next((q for q in self.plan.quotas if q.team == team and q.flavor == flavor), None)
        nominal = quota.nominal_milli if quota is not None else 0
        used = self.used.get((team, flavor), 0)
        cohort = quota.cohort if quota is not None else None
        if cohort is None:
            lends = "it is in no cohort to borrow from"
        elif (
            quota is not None
            and quota.borrowing_limit_milli is not None
            and (used - nominal >= quota.borrowing_limit_milli)
        ):
            lends = f"it borrows its limit of {quota.borrowing_limit_milli / 1000:g} GPUs"
        else:
            # What the cohort lends covers what the team already borrows first.
            more = state.lendable_milli(cohort, flavor, besides=team) - max(0, used - nominal)
            lends = (
                f"its cohort {cohort} lends nothing now"
                if more <= 0
                else f"its cohort {cohort} lends only {more / 1000:g} more GPUs now"
            )
        return f"team {team} is at its quota on {flavor} ({used / 1000:g}/{nominal / 1000:g} GPUs), {lends}"


def node_flavors(node: NodeState) -> list[Flavor]:
    return [Flavor("pool", node.node_pool), *(Flavor("model", m) for m in sorted(node.models))]


def _model_of(node: NodeState, assignment: Assignment) -> str | None:
    if not assignment.gpu_indices:
        return None
    index = assignment.gpu_indices[0]
    return next((g.model for g in node.gpus if g.index == index), None)


def _flavors(node: NodeState, assignment: Assignment) -> list[Flavor]:
    model = _model_of(node, assignment)
    return [Flavor("pool", node.node_pool), *([Flavor("model", model)] if model else [])]


def _assignment_milli(request: GpuRequest, assignment: Assignment, node: NodeState) -> int:
    """The milli-GPU a grant counts (a MIG slice: its compute share), as :func:`grant_milli` does."""
    if assignment.mig_slice is not None and request.mig_profile is not None:
        return gpu_milli_of_mig(request.mig_profile, _model_of(node, assignment))
    return len(assignment.gpu_indices) * assignment.milli_per_gpu
