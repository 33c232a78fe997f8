"""Preemption: which grants a waiting request may take capacity from, and which lose the least work.

A grant may be a victim only if it is ``preemptible`` (never otherwise) and has run at least
``min_runtime_seconds`` (no thrashing); a request that was itself preempted does not preempt in
turn (no cascades). Which preemptor may take it is Kueue's rule for a cohort:

- a grant of the preemptor's own team: for higher-priority work only;
- a grant of another team whose team is within its nominal quota: never (priority does not
  cross teams; a team keeps what it is entitled to);
- a grant of another team that is *borrowing* (its team holds more than its nominal quota): for
  higher-priority work, or for a preemptor reclaiming its own team's nominal quota, at any
  priority. Given each team's borrowing (``borrowing_milli``), such victims are taken only
  while their team still borrows after the victims already chosen, as Kueue does, so a
  reclaim does not push the lender's borrower far below its own nominal quota.

One exception, for placement rather than quota: a grant that blocks the preemptor's node only
because their classes may not share a node (training beside inference,
:data:`~airflow_gpupool.placement.fit.EXCLUSIVE_CLASSES`; ``blocks_by_class``) is, even within its
team's nominal quota, a victim for a higher-priority preemptor reclaiming its own nominal quota.
Both teams are then within what they are entitled to, and the pool cannot place both: priority
breaks the tie, where otherwise urgent work would wait for a training run to end.

The headroom lent to preemptible work (:func:`~airflow_gpupool.governance.capacity.fits_headroom`
with ``lendable``) is a loan too: a grant admitted on it (``on_headroom_loan``) is, whatever its
team's quota, a victim for urgent work of higher priority, which the headroom is kept for.

Teams without a quota (nominal 0) always borrow, so priority alone decides for them: the
behaviour of a pool without quotas. Kueue's ``reclaimWithinCohort: Any`` and
``withinClusterQueue: LowerPriority`` are the settings this matches.

Victims are chosen to lose the least work: the GPU-seconds since each victim's newest valid
checkpoint (since its start when it has none), then the lowest priority, then the newest grant;
taken in that order until enough is freed. The ledger gives each victim a grace period to write
an emergency checkpoint before its slice passes on.

:attr:`VictimOrder.KUEUE` is the order Kueue uses instead (borrowing workloads first, then the
lowest priority, then the most recently admitted), blind to checkpoints: the simulator's
``kueue-like`` policy compares against it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

__all__ = ["Preemptor", "VictimCandidate", "VictimOrder", "choose_victims", "may_preempt", "lost_gpu_seconds"]


class VictimOrder(str, Enum):
    """How eligible victims are ranked."""

    LEAST_WORK_LOST = "least-work-lost"  # ours: GPU-seconds since the newest checkpoint first
    KUEUE = "kueue"  # borrowed first, then lowest priority, then newest


@dataclass(frozen=True)
class VictimCandidate:
    """A live grant that might be preempted.

    :param milli: the milli-GPU it holds (a MIG slice: its compute share)
    :param checkpoint_at: when its newest valid checkpoint was written; None: none yet
    :param borrowed: its team holds more than its nominal quota of this flavor
    :param team: its team (None: no team, which is one team of its own)
    :param blocks_by_class: it must leave the preemptor's node because their classes may not
        share a node, whatever the free capacity
    :param on_headroom_loan: it was admitted on the headroom lent to preemptible work
    """

    reservation_id: str
    priority: int
    preemptible: bool
    granted_at: float
    milli: int
    checkpoint_at: float | None = None
    borrowed: bool = False
    team: str | None = None
    blocks_by_class: bool = False
    on_headroom_loan: bool = False


@dataclass(frozen=True)
class Preemptor:
    """The waiting request.

    :param reclaims: its team is within its nominal quota (it may take back what others borrow)
    :param was_preempted: it is the retry of a preempted try (it does not preempt in turn)
    :param team: its team (None: no team)
    :param urgent: it may use the headroom (urgent priority or the inference class)
    """

    priority: int
    milli: int
    reclaims: bool = False
    was_preempted: bool = False
    team: str | None = None
    urgent: bool = False


def lost_gpu_seconds(victim: VictimCandidate, now: float) -> float:
    """Return the GPU-seconds of work a victim loses if stopped now (since its newest checkpoint)."""
    since = (
        max(victim.granted_at, victim.checkpoint_at)
        if victim.checkpoint_at is not None
        else victim.granted_at
    )
    return victim.milli / 1000 * max(0.0, now - since)


def choose_victims(
    preemptor: Preemptor,
    candidates: Sequence[VictimCandidate],
    *,
    free_milli: int,
    now: float,
    min_runtime_seconds: float,
    order: VictimOrder = VictimOrder.LEAST_WORK_LOST,
    borrowing_milli: Mapping[str | None, int] | None = None,
) -> tuple[VictimCandidate, ...] | None:
    """Return the victims that free enough for ``preemptor`` losing the least work, or None.

    :param candidates: the live grants where the preemptor would be placed
    :param free_milli: what is free there already
    :param now: the ledger's time
    :param min_runtime_seconds: a grant younger than this is never a victim
    :param order: how victims are ranked (ours by default)
    :param borrowing_milli: per team, the milli-GPU it holds beyond its nominal quota; when
        given, another team's grant is taken only while its team still borrows after the
        victims chosen before it (None: each candidate's ``borrowed`` alone decides)
    """
    if preemptor.was_preempted or free_milli >= preemptor.milli:
        return None if preemptor.was_preempted else ()
    eligible = [c for c in candidates if may_preempt(preemptor, c, now, min_runtime_seconds)]
    if order is VictimOrder.KUEUE:
        eligible.sort(key=lambda c: (not c.borrowed, c.priority, -c.granted_at))
    else:
        eligible.sort(key=lambda c: (lost_gpu_seconds(c, now), c.priority, -c.granted_at))
    chosen: list[VictimCandidate] = []
    freed = free_milli
    still_borrowing = dict(borrowing_milli) if borrowing_milli is not None else None
    for victim in eligible:
        if freed >= preemptor.milli:
            break
        quota_victim = victim.borrowed and not (victim.on_headroom_loan and preemptor.urgent)
        if still_borrowing is not None and victim.team != preemptor.team and quota_victim:
            if still_borrowing.get(victim.team, 0) <= 0:
                continue  # its team is back within its nominal quota: it keeps the rest
            still_borrowing[victim.team] = still_borrowing.get(victim.team, 0) - victim.milli
        chosen.append(victim)
        freed += victim.milli
    return tuple(chosen) if freed >= preemptor.milli else None


def may_preempt(preemptor: Preemptor, victim: VictimCandidate, now: float, min_runtime: float) -> bool:
    """Return whether ``victim`` may lose its slice to ``preemptor`` now (the rule in the module docstring)."""
    if preemptor.was_preempted:
        return False
    if not victim.preemptible or now - victim.granted_at < min_runtime:
        return False
    if victim.team == preemptor.team or (victim.on_headroom_loan and preemptor.urgent):
        return victim.priority < preemptor.priority
    if victim.borrowed:
        return victim.priority < preemptor.priority or preemptor.reclaims
    return victim.blocks_by_class and preemptor.reclaims and victim.priority < preemptor.priority
