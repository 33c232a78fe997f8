"""Preemption in the governed simulator: victims chosen as the ledger chooses them, stopped with a grace.

:class:`TeamsPreemption` is the half of :class:`~airflow_gpupool.sim.governed.TeamsSim` that
preempts (who yields to a waiting try, on which node, what each victim loses); the books and the
queue pass it reads are TeamsSim's, named below so the two halves stay typed apart.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from airflow_gpupool.governance.admission import QuotaState
from airflow_gpupool.governance.preemption import (
    Preemptor,
    VictimCandidate,
    VictimOrder,
    choose_victims,
    lost_gpu_seconds,
)
from airflow_gpupool.placement.accounting import deallocate
from airflow_gpupool.placement.fit import EXCLUSIVE_CLASSES, choices
from airflow_gpupool.placement.snapshot import ClusterSnapshot
from airflow_gpupool.placement.verdict import Assignment, NoFitReason
from airflow_gpupool.sim.governance_policies import GovernancePolicy
from airflow_gpupool.sim.queue import QueueSim
from airflow_gpupool.sim.teams import Job, TeamsPlan

__all__ = ["ARRIVE", "FINISH", "RELEASE", "TeamTry", "TeamsPreemption", "last_checkpoint"]

FINISH, RELEASE, ARRIVE = 0, 1, 2  # event kinds, in the order they are handled at one instant


@dataclass
class TeamTry:
    """One try of a job: queued, running, or being preempted."""

    job: Job
    remaining_s: float
    queued_at: float
    was_preempted: bool = False
    started_at: float | None = None
    node: int = -1
    releasing: bool = False
    deadline: float | None = None  # being preempted: its slice passes on by then
    on_loan: bool = False  # admitted on the headroom lent to preemptible work


class TeamsPreemption(QueueSim):
    """Preempt for waiting tries: pick the node and victims that lose least, stop them, hand the node over."""

    # TeamsSim's books and queue, which a preemption reads and changes.
    plan: TeamsPlan
    policy: GovernancePolicy
    warm: float
    capacity: int
    nominal: dict[str, int]
    tries: dict[int, TeamTry]
    held_by: dict[str, int]
    preemptions: dict[str, int]
    lost: dict[str, float]
    grace: dict[str, float]
    pending: dict[int, tuple[set[int], int]]  # preemptor -> (victims left, node)
    events: list[tuple[float, int, int]]
    on_node: dict[int, set[int]]
    exits: list[float]
    urgent: Callable[[Job], bool]
    allocated_milli: Callable[[], int]
    enqueue: Callable[..., None]
    end: Callable[[int], None]
    _start: Callable[[int, Any, Assignment, float], None]
    _fits_headroom: Callable[[Job, int], bool]
    _on_loan: Callable[[Job, int], bool]

    def _within_nominal(self, job: Job) -> bool:
        """Whether ``job`` taking its slice keeps its team within its nominal quota (it reclaims)."""
        return self.held_by[job.team] + job.request.total_gpu_milli <= self.nominal.get(job.team, 0)

    def saves_on_sigterm(self, job: Job) -> bool:
        """Whether the job writes a checkpoint on SIGTERM within the grace (it opts in)."""
        seconds = job.emergency_checkpoint_s
        return seconds is not None and seconds <= self.plan.grace_s

    def _candidate(self, k: int, now: float) -> VictimCandidate:
        t = self.tries[k]
        r = t.job.request
        started = t.started_at if t.started_at is not None else now
        checkpoint = last_checkpoint(started, now, t.job.checkpoint_interval_s)
        if self.policy.grace and self.saves_on_sigterm(t.job):
            checkpoint = now  # it will write one in its grace: stopping it loses (almost) nothing
        team = t.job.team
        borrowed = self.held_by[team] > self.nominal.get(team, 0)
        return VictimCandidate(
            str(k),
            r.priority,
            r.preemptible,
            started,
            self.useful[k],
            checkpoint,
            borrowed,
            team,
            on_headroom_loan=t.on_loan,
        )

    def _borrowing(self, gone: tuple[int, ...] = ()) -> dict[str | None, int]:
        """Return per team the milli-GPU held beyond its nominal quota, once ``gone`` have ended."""
        held = dict(self.held_by)
        for k in gone:
            held[self.tries[k].job.team] -= self.useful[k]
        return {team: milli - self.nominal.get(team, 0) for team, milli in held.items()}

    def _preempt_for(self, k: int, now: float) -> None:
        t = self.tries[k]
        r = t.job.request
        milli = r.total_gpu_milli
        if t.was_preempted or k in self.pending:
            return
        if not self._quota_admits(t.job, others_at_nominal=True):
            return  # not even if every other team gave back what it borrows
        reclaims = self._within_nominal(t.job)
        if not reclaims and not any(
            self.tries[v].job.request.preemptible and self.tries[v].job.request.priority < r.priority
            for v in self.running
        ):
            return  # nobody it may preempt (a shortcut: choose_victims would say the same)
        preemptor = Preemptor(r.priority, milli, reclaims, team=t.job.team, urgent=self.urgent(t.job))
        best = self._cheapest_node(preemptor, t.job, now)
        if best is None:
            return
        _, i, victims = best
        free = self.capacity - self.allocated_milli() + sum(self.useful[v] for v in victims)
        if self.policy.headroom and not self._fits_headroom(t.job, free):
            return
        t.on_loan = self._on_loan(t.job, free)
        self.pending[k] = (set(victims), i)
        for v in victims:
            self._stop(v, now)

    def _cheapest_node(
        self, preemptor: Preemptor, job: Job, now: float
    ) -> tuple[float, int, tuple[int, ...]] | None:
        """Return (cost, node, victims) of the node where preempting for ``job`` loses least, or None."""
        r = job.request
        best: tuple[float, int, tuple[int, ...]] | None = None
        for i in range(len(self.nodes)):
            if isinstance(choices(self.empty[i], r), NoFitReason):
                continue
            found = self._victims_on(i, preemptor, r, now)
            if found is None or not self._quota_admits(job, gone=found[1]):
                continue  # none there, or they do not free the cohort quota it would borrow
            if best is None or found[0] < best[0]:
                best = (found[0], i, found[1])
        return best

    def _quota_admits(self, job: Job, gone: tuple[int, ...] = (), *, others_at_nominal: bool = False) -> bool:
        """Whether ``job``'s quota admits it once ``gone`` have ended (Kueue checks a preemptor so).

        :param others_at_nominal: count every other team at most at its nominal quota (an upper
            bound on what preempting borrowers can give back)
        """
        if not self.policy.quotas:
            return True
        held = {team: milli for team, milli in self.held_by.items()}
        for v in gone:
            held[self.tries[v].job.team] -= self.useful[v]
        if others_at_nominal:
            held = {t: m if t == job.team else min(m, self.nominal.get(t, 0)) for t, m in held.items()}
        used = {(team, self.plan.flavor): milli for team, milli in held.items()}
        verdict = QuotaState(self.plan.quotas, used).admit(
            job.team, [self.plan.flavor], job.request.total_gpu_milli
        )
        return verdict.admitted

    def _victims_on(
        self, i: int, preemptor: Preemptor, request: Any, now: float
    ) -> tuple[float, tuple[int, ...]] | None:
        """Return (cost, victims) that make room for ``request`` on node ``i``, or None.

        A request of an exclusive class must take every grant of the conflicting class there.
        """
        on_node = sorted(self.on_node[i])
        if any(self.tries[k].releasing for k in on_node):
            return None  # a preemption is already draining this node
        order = self.policy.preemption or VictimOrder.LEAST_WORK_LOST
        min_runtime = self.plan.min_runtime_s if self.policy.min_runtime else 0.0
        candidates = {k: self._candidate(k, now) for k in on_node}
        conflicting = EXCLUSIVE_CLASSES.get(request.workload_class.value)
        forced = [k for k in on_node if self.tries[k].job.request.workload_class.value == conflicting]
        for k in forced:
            candidates[k] = replace(candidates[k], blocks_by_class=True)
        if forced:
            taken = choose_victims(
                replace(preemptor, milli=sum(self.useful[k] for k in forced)),
                [candidates[k] for k in forced],
                free_milli=0,
                now=now,
                min_runtime_seconds=min_runtime,
                order=order,
                borrowing_milli=self._borrowing(),
            )
            if taken is None or len(taken) != len(forced):
                return None  # one of them may not be preempted: the node cannot take the request
        chosen = choose_victims(
            preemptor,
            [candidates[k] for k in on_node if k not in forced],
            free_milli=self.nodes[i].gpu_free_milli + sum(self.useful[k] for k in forced),
            now=now,
            min_runtime_seconds=min_runtime,
            order=order,
            borrowing_milli=self._borrowing(tuple(forced)),
        )
        if chosen is None:
            return None
        victims = tuple(forced) + tuple(int(v.reservation_id) for v in chosen)
        if not victims or not self._fits_without(i, victims, request):
            return None
        if order is VictimOrder.KUEUE:
            return float(len(victims)), victims  # Kueue does not see checkpoints
        return sum(lost_gpu_seconds(candidates[v], now) for v in victims), victims

    def _fits_without(self, i: int, victims: tuple[int, ...], request: Any) -> bool:
        """Whether ``request`` fits on node ``i`` once ``victims`` are gone (whole GPUs, classes)."""
        node = self.nodes[i]
        gone = set(victims)
        left = {
            self.tries[k].job.request.workload_class.value
            for k, (_, _, n) in self.running.items()
            if n == i and k not in gone
        }
        for v in victims:
            r, assignment, _ = self.running[v]
            node = deallocate(node, r, assignment, frozenset(left & set(EXCLUSIVE_CLASSES)))
        return not isinstance(choices(node, request), NoFitReason)

    def _stop(self, v: int, now: float) -> None:
        """Preempt try ``v``: SIGTERM with a grace (gpupool), or stopped at once (kueue-like).

        A step that writes a checkpoint on SIGTERM ends once written (within the grace) and loses
        no work; one that does not handle SIGTERM ends at once, as a container does, and loses
        the work since its last periodic checkpoint, as every victim of ``kueue-like`` does.
        """
        t = self.tries[v]
        job = t.job
        milli = self.useful[v] / 1000
        started = t.started_at if t.started_at is not None else now
        t.releasing, t.deadline = True, now + self.plan.grace_s
        if now >= self.warm:
            self.preemptions[job.team] += 1
        if self.policy.grace and self.saves_on_sigterm(job):
            writing = float(job.emergency_checkpoint_s or 0.0)
            release, saved = now + writing, now - started
            if now >= self.warm:
                self.grace[job.team] += milli * writing
        else:
            release = now
            saved = (last_checkpoint(started, now, job.checkpoint_interval_s) or started) - started
            if now >= self.warm:
                self.lost[job.team] += milli * (now - started - saved)
        t.remaining_s -= saved
        if release > now:
            heapq.heappush(self.events, (release, RELEASE, v))
        else:
            self.release(v, now)

    def release(self, v: int, now: float) -> None:
        """A preempted try's pod has ended: its slice passes on, its retry queues again."""
        t = self.tries[v]
        if t.deadline is not None:  # how long it took to end once told, as the ledger reads it
            self.exits.insert(0, now - (t.deadline - self.plan.grace_s))
        self.end(v)
        self.enqueue(t.job, now, t.remaining_s, was_preempted=True)
        self._hand_over(v, now)

    def _hand_over(self, v: int, now: float) -> None:
        """Give the preemptor waiting on ``v`` its node once every one of its victims has ended."""
        for k, (left, i) in list(self.pending.items()):
            left.discard(v)
            if left:
                continue
            del self.pending[k]
            request = self.waiting[str(k)].request
            verdict = self.place(ClusterSnapshot((self.nodes[i],)), request)
            if isinstance(verdict, Assignment):
                self._take(i, request, verdict)
                self._start(k, request, verdict, now)


def last_checkpoint(started: float, now: float, interval: float | None) -> float | None:
    """Return when the newest periodic checkpoint of a try started at ``started`` was written."""
    if interval is None or now - started < interval:
        return None
    return started + math.floor((now - started) / interval) * interval
