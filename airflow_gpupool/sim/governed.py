"""Queue mode with teams: quotas, fair order, headroom and preemption, as the ledger applies them.

The rules are those of :mod:`airflow_gpupool.governance` (the functions the ledger calls), on
the queue rule of :func:`airflow_gpupool.placement.queue.serve` and the placement policies; this
module only keeps time. Policies compared (:data:`POLICIES`):

- ``gpupool``: admission by quota with borrowing (:class:`QuotaState`), fair order
  (:class:`FairShare`), headroom for urgent work (:func:`fits_headroom`; lent to preemptible
  work when the teams file says ``headroom_lent``, closed to any other work, as the ledger's
  admission has it), and preemption of the victims that lose the least work
  (:func:`choose_victims`) with a checkpoint grace: a victim that can write a checkpoint on
  SIGTERM does so and ends, losing only the seconds spent writing it; one that cannot runs to
  the grace's deadline and loses what followed its last periodic checkpoint;
- ``kueue-like``: the same quotas and borrowing, priority then FIFO, no headroom, Kueue's victim
  order (borrowers, lowest priority, newest), victims stopped at once: they lose the work since
  their last periodic checkpoint, and there is no minimum runtime;
- ``no-preemption``: ``gpupool`` without preemption;
- ``airflow-pool``: an Airflow pool (whole-GPU slots, priority then FIFO, no quotas, no bound on
  overtakes, spreading placement).

Who may preempt whom is the rule of :func:`~airflow_gpupool.governance.preemption.may_preempt`
(Kueue's for a cohort: priority within a team; across teams only grants whose team borrows, or
that block the preemptor's node by class); a preemptor that would borrow is admitted by quota as
Kueue checks it, once its victims are gone.
A preempted try queues again at its own priority with the work left after its newest checkpoint
and does not preempt in turn. ``lost_gpu_s`` counts GPU-seconds of work thrown away (computed
since the checkpoint a retry resumes from); ``grace_gpu_s`` those a victim held while writing
its emergency checkpoint (no work lost, but no work done either).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, cast

from airflow_gpupool.governance.admission import QuotaState
from airflow_gpupool.governance.capacity import fits_headroom, is_urgent
from airflow_gpupool.governance.fairness import FairShare
from airflow_gpupool.placement.frag import DEFAULT_SHAPES
from airflow_gpupool.placement.policy import get_policy
from airflow_gpupool.placement.queue import QueueEntry, is_due, serve
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.sim.governance_policies import POLICIES, GovernancePolicy
from airflow_gpupool.sim.preemption import ARRIVE, FINISH, RELEASE, TeamsPreemption, TeamTry, last_checkpoint
from airflow_gpupool.sim.queue import NO_WATCH, QueueWatch, whole_slots
from airflow_gpupool.sim.replay import quick
from airflow_gpupool.sim.teams import Job, TeamsPlan

# The event kinds and last_checkpoint live with the preemption; callers import them from here.
__all__ = ["ARRIVE", "FINISH", "POLICIES", "RELEASE", "GovernancePolicy", "TeamsSim", "last_checkpoint"]


#: Waiting requests considered for preemption per pass, in serving order.
PREEMPTION_LOOKAHEAD = 8


class TeamsSim(TeamsPreemption):
    """Queue state plus teams: who holds what, tries, preemptions, the event heap."""

    def __init__(
        self, nodes: list[NodeState], plan: TeamsPlan, policy: GovernancePolicy, warm: float
    ) -> None:
        engine = get_policy(policy.placement, seed=0, typical_shapes=DEFAULT_SHAPES)
        super().__init__(nodes, quick(engine), DEFAULT_SHAPES, policy.max_overtakes)
        self.plan, self.policy, self.warm = plan, policy, warm
        self.capacity = ClusterSnapshot(tuple(nodes)).gpu_capacity_milli
        self.nominal = {t: plan.nominal_milli(t) for t in plan.teams}
        self.tries: dict[int, TeamTry] = {}
        self.held_by: dict[str, int] = defaultdict(int)
        self.area: dict[str, float] = defaultdict(float)
        self.borrowed_area: dict[str, float] = defaultdict(float)
        self.preemptions: dict[str, int] = defaultdict(int)
        self.lost: dict[str, float] = defaultdict(float)
        self.grace: dict[str, float] = defaultdict(float)
        self.waited: dict[str, list[tuple[float, bool]]] = defaultdict(list)
        self.idle_area = [0.0, 0.0]  # idle capacity-time of the window: [nothing waited, some try did]
        self.pending: dict[int, tuple[set[int], int]] = {}  # preemptor -> (victims left, node)
        self.events: list[tuple[float, int, int]] = []
        self.next_try = 0
        self.on_node: dict[int, set[int]] = defaultdict(set)
        self.slots_milli = 0  # what running tries hold, as their requests count it
        self._free, self._failed, self._draining = 0, set[tuple[Any, ...]](), set[str]()  # one pass's
        # Tries that found no room in the last pass: until a slice is given back, capacity,
        # quotas and headroom only tighten, so they are not placed again (the queue rule still
        # counts their overtakes).
        self.blocked: set[int] = set()
        self.watch: QueueWatch = NO_WATCH  # the forecast backtest, when one runs
        self.exits: list[float] = []  # how long each preempted try took to end once told, newest first

    # -- time and books ------------------------------------------------------------------------

    def advance(self, now: float, warm: float) -> None:
        if now > warm:
            dt = now - max(self.last, warm)
            for team, milli in self.held_by.items():
                self.area[team] += milli * dt
                self.borrowed_area[team] += max(0, milli - self.nominal.get(team, 0)) * dt
            self.idle_area[bool(self.waiting)] += (self.capacity - self.allocated) * dt
        super().advance(now, warm)

    def enqueue(self, job: Job, now: float, remaining: float, *, was_preempted: bool = False) -> None:
        k, self.next_try = self.next_try, self.next_try + 1
        self.tries[k] = TeamTry(job, remaining, now, was_preempted)
        request = whole_slots(job.request) if self.policy.whole_slots else job.request
        self.arrive(k, request, now, job.request.total_gpu_milli)
        r = job.request
        self.watch.label(
            k,
            f"{job.team}:{r.workload_class.value}:{r.total_gpu_milli}",
            job.team,
            r.workload_class.value,
        )

    def _start(self, k: int, request: Any, assignment: Assignment, now: float) -> None:
        t = self.tries[k]
        del self.waiting[str(k)]
        t.started_at, t.node = now, self.where[assignment.node]
        self.running[k] = (request, assignment, t.node)
        self.on_node[t.node].add(k)
        self.slots_milli += request.total_gpu_milli
        self.started_at[k] = now
        self.allocated += self.useful[k]
        self.held_by[t.job.team] += self.useful[k]
        if t.queued_at >= self.warm:
            self.waited[t.job.team].append((now - t.queued_at, self.urgent(t.job)))
        heapq.heappush(self.events, (now + t.remaining_s, FINISH, k))

    def end(self, k: int) -> None:
        """A try's slice is given back (it finished, or its preemption completed)."""
        self.held_by[self.tries[k].job.team] -= self.useful[k]
        self.on_node[self.running[k][2]].discard(k)
        self.slots_milli -= self.running[k][0].total_gpu_milli
        self.depart(k)
        self.freed = True

    def urgent(self, job: Job) -> bool:
        """Whether the job may use the headroom (urgent priority or inference)."""
        r = job.request
        return is_urgent(r.priority, r.workload_class.value, self.plan.urgent_priority)

    # -- the queue pass ------------------------------------------------------------------------

    def _used(self) -> dict[tuple[str, Any], int]:
        return {(team, self.plan.flavor): milli for team, milli in self.held_by.items()}

    def _admits(self, job: Job, free: int) -> bool:
        milli = job.request.total_gpu_milli
        quota = QuotaState(self.plan.quotas, self._used()) if self.policy.quotas else None
        if quota is not None and not quota.admit(job.team, [self.plan.flavor], milli).admitted:
            return False
        return not self.policy.headroom or self._fits_headroom(job, free)

    def _fits_headroom(self, job: Job, free: int) -> bool:
        """The ledger's headroom rule (:func:`fits_headroom`) for ``job`` with ``free`` milli-GPU free."""
        r = job.request
        return fits_headroom(
            self.capacity,
            free,
            r.total_gpu_milli,
            self.plan.headroom,
            urgent=self.urgent(job),
            lendable=self._lends(job),
        )

    def _on_loan(self, job: Job, free: int) -> bool:
        """Whether ``job``, taking its slice with ``free`` milli-GPU free, uses the lent headroom."""
        if not self.policy.headroom or self.urgent(job) or not self._lends(job):
            return False
        milli = job.request.total_gpu_milli
        return not fits_headroom(self.capacity, free, milli, self.plan.headroom, urgent=False)

    def _lends(self, job: Job) -> bool:
        return self.plan.headroom_lent and job.request.preemptible

    def ordered(self) -> list[QueueEntry]:
        """Return the waiting requests in serving order, renumbered so the queue rule keeps it.

        ``request_id`` stays the try's number; ``seq`` becomes the rank in the fair order.
        """
        entries = [e for e in self.waiting.values() if e.seq not in self.pending]
        if not self.policy.fair_order:
            return sorted(entries, key=lambda e: (-e.request.priority, e.seq))
        fair = FairShare(self.plan.quotas, dict(self.held_by), self.capacity)
        order = fair.order([_Queued(e, self.tries[e.seq]) for e in entries])
        return [replace(cast(_Queued, q).entry, seq=rank) for rank, q in enumerate(order)]

    def pass_(self, now: float) -> None:
        """Serve the queue, then let the first waiting requests preempt."""
        entries = self.ordered()
        self._free = self.capacity - self.allocated_milli()
        self._failed = set()
        # A node drained for a preemptor is its alone until its victims have ended.
        self._draining = {self.nodes[i].name for _, i in self.pending.values()}
        if self.freed:
            self.blocked, self.freed = set(), False
        outcome = serve(entries, self._try_place, self.max_overtakes, self._hold, now=now)
        for entry, assignment in outcome.granted:
            self._start(int(entry.request_id), entry.request, assignment, now)
        for rid, count in outcome.overtakes.items():
            self.waiting[rid] = replace(self.waiting[rid], overtakes=count)
        if self.policy.preemption is not None:
            left = [int(e.request_id) for e in entries if e.request_id in self.waiting and is_due(e, now)]
            for k in left[:PREEMPTION_LOOKAHEAD]:
                self._preempt_for(k, now)

    def _try_place(self, entry: QueueEntry, held: frozenset[str]) -> Assignment | None:
        """Place one waiting try within its quota and the headroom, as the queue rule asks."""
        k = int(entry.request_id)
        if k in self.blocked:
            return None
        r = entry.request
        key = (r.gpus, r.gpu_milli, r.workload_class)
        if not self._admits(self.tries[k].job, self._free) or key in self._failed:
            self.blocked.add(k)
            return None  # capacity only shrinks during a pass
        nodes = tuple(n for n in self.nodes if n.name not in held and n.name not in self._draining)
        if not nodes:
            return None
        verdict = self.place(ClusterSnapshot(nodes), r)
        if not isinstance(verdict, Assignment):
            self._failed.add(key)
            self.blocked.add(k)
            return None
        self._take(self.where[verdict.node], r, verdict)
        self.tries[k].on_loan = self._on_loan(self.tries[k].job, self._free)
        self._free -= r.total_gpu_milli
        return verdict

    def allocated_milli(self) -> int:
        """Milli-GPU held by running tries, as their requests count it."""
        return self.slots_milli

    def finish(self, k: int, now: float) -> bool:
        """A try's FINISH event: end it unless it was preempted since (then its RELEASE ends it)."""
        if k not in self.running or self.tries[k].releasing:
            return False
        self.end(k)
        self.watch.ended(k, self.tries[k].remaining_s)
        self._hand_over(k, now)
        return True


@dataclass(frozen=True)
class _Queued:
    """A waiting entry as :class:`FairShare` sees it."""

    entry: QueueEntry
    attempt: TeamTry

    @property
    def team(self) -> str:
        return self.attempt.job.team

    @property
    def priority(self) -> int:
        return self.entry.request.priority

    @property
    def created_at(self) -> float:
        return self.attempt.queued_at
